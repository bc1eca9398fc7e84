/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * The bottom of the filter: client-sized operations become plugin
 * requests, cut at the geometry's size, capped at its maximum, partial
 * blocks done by read-modify-write under block-range locks.  Every
 * request the plugin gets comes through here, so that the statistics
 * count it.
 */

#ifndef NBDKIT_RESHAPE_SPLIT_H
#define NBDKIT_RESHAPE_SPLIT_H

#include <stdbool.h>
#include <stdint.h>
#include <pthread.h>

#include <nbdkit-filter.h>

#include "auto.h"
#include "walk.h"

/* A connection's mean time per piece of its last split read [0] and
 * write, zero or trim [1] (0: none yet), atomic.
 */
struct split_conn {
  uint64_t piece_ns[2];
};

/* A request's context on its way to the plugin (reshape.c builds it). */
struct io {
  nbdkit_next *next;
  const struct geometry *geo;   /* the connection's, settled at prepare */
  struct split_conn *split;
  struct auto_export *autoexp;  /* reshape-size=auto: the export's */
  /* Write back what is staged over [lo, hi), so that a read-ahead
   * fill there reads what clients wrote: false if some of it stays
   * staged (the fill must not be kept).
   */
  bool (*flush_staged) (const struct io *io, uint64_t lo, uint64_t hi);
  void *conn;                   /* reshape.c's, for flush_staged */
};

/* Each returns 0, or -1 with *err set.  own: a read the filter makes
 * itself (a run of grains), cut where the learnt model says.
 */
extern int split_pread (const struct io *io, void *buf, uint32_t count,
                        uint64_t offset, int *err);
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
extern int split_flush (nbdkit_next *next, uint32_t flags, int *err);

/* Block-range locks: a holder of [lo, hi) exclusive excludes every
 * other holder there, shared ones only exclusive holders.  Granted in
 * arrival order: fair, and no deadlock, since each waits only for
 * older ones.  One table for the process (names do not tell which
 * exports share storage).  Exposed for tests/unit-rangelock.c.
 */
struct split_lock {
  uint64_t lo, hi;
  bool exclusive;
  struct split_lock *prev, *next;
};
/* True if it had to wait. */
extern bool split_lock_blocks (struct split_lock *l, uint64_t lo,
                               uint64_t hi, bool exclusive);
extern void split_unlock_blocks (struct split_lock *l);

#endif /* NBDKIT_RESHAPE_SPLIT_H */
