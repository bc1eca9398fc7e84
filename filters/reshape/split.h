/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * The bottom of the filter: client-sized operations become plugin
 * requests, cut at the geometry's size, capped at its maximum, partial
 * minimum blocks done by read-modify-write under block-range locks.
 * Every request the plugin gets comes through here (flush too, so
 * that the statistics count it).
 */

#ifndef NBDKIT_RESHAPE_SPLIT_H
#define NBDKIT_RESHAPE_SPLIT_H

#include <stdbool.h>
#include <stdint.h>

#include <nbdkit-filter.h>

#include "io.h"
#include "auto.h"
#include "walk.h"

/* Split's state for one connection: the mean time per piece of its
 * last split read [0] and write, zero or trim [1], 0 = none yet.
 */
struct split_conn {
  uint64_t piece_ns[2];
};

/* Each returns 0, or -1 with *err set. */
extern int split_pread (const struct io *io, void *buf, uint32_t count,
                        uint64_t offset, int *err);
/* own: a read the filter makes itself (a readahead run, a grain):
 * with reshape-size=auto cut where the learnt model says, no
 * exploring.
 */
extern int split_pread_as (const struct io *io, void *buf, uint32_t count,
                           uint64_t offset, bool own, int *err);
extern int split_pwrite (const struct io *io, const void *buf,
                         uint32_t count, uint64_t offset, uint32_t flags,
                         int *err);
extern int split_zero (const struct io *io, uint32_t count, uint64_t offset,
                       uint32_t flags, int *err);
extern int split_trim (const struct io *io, uint32_t count, uint64_t offset,
                       uint32_t flags, int *err);
extern int split_cache (const struct io *io, uint32_t count, uint64_t offset,
                        uint32_t flags, int *err);
extern int split_extents (const struct io *io, uint32_t count,
                          uint64_t offset, uint32_t flags,
                          struct nbdkit_extents *extents, int *err);
/* The plugin's flush, counted like every other call. */
extern int split_flush (nbdkit_next *next, uint32_t flags, int *err);

#endif /* NBDKIT_RESHAPE_SPLIT_H */
