/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * struct io: a client request's context on its way to the plugin, the
 * one every stage and split.c take.  reshape.c builds one per request.
 */

#ifndef NBDKIT_RESHAPE_IO_H
#define NBDKIT_RESHAPE_IO_H

#include <stdbool.h>
#include <stdint.h>

#include <nbdkit-filter.h>

#include "walk.h"

struct split_conn;
struct auto_export;

struct io {
  nbdkit_next *next;
  const struct geometry *geo;   /* the connection's, settled at prepare */
  struct split_conn *split;     /* the connection's piece timings */
  struct auto_export *autoexp;     /* reshape-size=auto: the export's */
  /* A stage (write-back, a stream) hands a client request on to the
   * stages below it through these, without knowing which they are:
   * the order of the stages is written in reshape.c alone.  0, or -1
   * with *err set.
   */
  int (*pread_below) (const struct io *io, void *buf, uint32_t count,
                      uint64_t offset, int *err);
  int (*pwrite_below) (const struct io *io, const void *buf,
                       uint32_t count, uint64_t offset, uint32_t flags,
                       int *err);
  /* Write back what is staged over [lo, hi), so that a fill of the
   * read cache there reads what clients wrote: false if some of it
   * stays staged (the fill must not be kept).
   */
  bool (*flush_staged) (const struct io *io, uint64_t lo, uint64_t hi);
  void *conn;                   /* reshape.c's, for these three */
};

#endif /* NBDKIT_RESHAPE_IO_H */
