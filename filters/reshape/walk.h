/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Range walking: how one client request becomes plugin requests.
 * Plain functions with no nbdkit dependency, so that tests and fuzzers
 * can call them directly.
 */

#ifndef NBDKIT_RESHAPE_WALK_H
#define NBDKIT_RESHAPE_WALK_H

#include <stdbool.h>
#include <stdint.h>

/* What one connection's plugin wants, settled when it connects. */
struct geometry {
  uint32_t min;           /* alignment the plugin needs, power of 2 */
  uint32_t size;          /* optimal request size, multiple of min */
  uint32_t max;           /* cap on plugin reads and writes, and ... */
  uint32_t maxlen;        /* ... on zero, trim, cache, extents; both
                             multiples of min */
  uint64_t exportsize;    /* the export size, a multiple of min */
};

/* One plugin request.  [offset, offset+count) is the part of the client
 * request it serves.  An aligned piece is sent as it is.  A partial
 * piece covers only part of the minimum block [blk_offset,
 * blk_offset+blk_count), which must be read (and for writes, written)
 * whole.  The block is clipped at the end of the export, so the final
 * block of an export whose size is not a multiple of min is shorter.
 */
struct piece {
  uint64_t offset;
  uint32_t count;
  bool partial;
  uint64_t blk_offset;
  uint32_t blk_count;
};

struct walk {
  uint64_t pos, end;      /* what is left of the range */
  uint32_t align;         /* geometry min */
  uint32_t step;          /* cut at multiples of step */
  uint32_t cap;           /* no piece longer than cap */
  uint64_t exportsize;
};

/* Start walking [offset, offset+count), cutting at multiples of step,
 * no piece longer than cap (step and cap multiples of geo->min, or
 * rounded down to them).  The range must lie within the export.
 */
extern void walk_init (struct walk *w, const struct geometry *geo,
                       uint64_t offset, uint64_t count, uint32_t step,
                       uint32_t cap);

/* The next piece, or false when the range is done. */
extern bool walk_next (struct walk *w, struct piece *p);

/* Does [offset, offset+count) need any partial piece? */
extern bool walk_is_aligned (const struct geometry *geo,
                             uint64_t offset, uint32_t count);

/* [offset, offset+count) widened to whole minimum blocks, clipped at
 * the end of the export.  For hints (cache, extents) where touching
 * more than asked is harmless.
 */
extern void walk_round_out (const struct geometry *geo,
                            uint64_t offset, uint32_t count,
                            uint64_t *start, uint64_t *end);

#endif /* NBDKIT_RESHAPE_WALK_H */
