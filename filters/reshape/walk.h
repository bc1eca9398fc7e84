/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * The one way a range becomes plugin requests: aligned pieces cut at
 * multiples of a step, no longer than a cap, and partial pieces in
 * one minimum block.  No nbdkit dependency: tests and the fuzzer call
 * it directly.
 */

#ifndef NBDKIT_RESHAPE_WALK_H
#define NBDKIT_RESHAPE_WALK_H

#include <stdbool.h>
#include <stdint.h>

/* What one connection's plugin wants, settled when it connects. */
struct geometry {
  uint32_t min;           /* alignment the plugin needs, power of 2 */
  uint32_t size;          /* request size, a multiple of min */
  uint32_t max;           /* cap on reads and writes, and ... */
  uint32_t maxlen;        /* ... on the others; multiples of min */
  uint64_t exportsize;    /* a multiple of min */
};

/* One plugin request, serving [offset, offset+count) of the client's.
 * A partial piece covers part of the block [blk_offset,
 * blk_offset+blk_count), read (and written) whole; the export's last
 * block is short when its size is not a multiple of min.
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
  uint32_t align, step, cap;
  uint64_t exportsize;
};

/* Walk [offset, offset+count), within the export, cutting at
 * multiples of step, no piece longer than cap (both rounded down to
 * multiples of min).
 */
extern void walk_init (struct walk *w, const struct geometry *geo,
                       uint64_t offset, uint64_t count, uint32_t step,
                       uint32_t cap);
/* The next piece, or false when the range is done. */
extern bool walk_next (struct walk *w, struct piece *p);
/* Does [offset, offset+count) need no partial piece? */
extern bool walk_is_aligned (const struct geometry *geo,
                             uint64_t offset, uint32_t count);
/* [offset, offset+count) widened to whole blocks, clipped at the end
 * of the export (for hints, where touching more is harmless).
 */
extern void walk_round_out (const struct geometry *geo,
                            uint64_t offset, uint32_t count,
                            uint64_t *start, uint64_t *end);

#endif /* NBDKIT_RESHAPE_WALK_H */
