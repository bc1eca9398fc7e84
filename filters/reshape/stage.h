/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * How a stage (write-back, readahead) passes a client request on to
 * the stage below it without knowing which that is: reshape.c builds
 * one of these per request, so that the order of the stages is
 * written down in one place.
 */

#ifndef NBDKIT_RESHAPE_STAGE_H
#define NBDKIT_RESHAPE_STAGE_H

#include <stdbool.h>
#include <stdint.h>

struct down {
  /* The next stage's read and write: 0, or -1 with *err set. */
  int (*pread) (void *opaque, void *buf, uint32_t count, uint64_t offset,
                int *err);
  int (*pwrite) (void *opaque, const void *buf, uint32_t count,
                 uint64_t offset, uint32_t flags, int *err);
  /* May a readahead window over [lo, hi) keep what the plugin has
   * there?  (Not while staged writes there are not in the plugin.)
   */
  bool (*window_ok) (void *opaque, uint64_t lo, uint64_t hi);
  void *opaque;
};

#endif /* NBDKIT_RESHAPE_STAGE_H */
