/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * The one way a range is walked.  Split, read-modify-write and every
 * later feature take their pieces from here, so the rules (alignment,
 * cut points, cap, end of export) are in one place.
 */

#include <config.h>

#include <assert.h>

#include "common.h"
#include "walk.h"

void
walk_init (struct walk *w, const struct geometry *geo,
           uint64_t offset, uint64_t count, uint32_t step, uint32_t cap)
{
  assert (geo->min > 0 && cap >= geo->min);
  assert (offset + count <= geo->exportsize);
  w->pos = offset;
  w->end = offset + count;
  w->align = geo->min;
  w->cap = cap - cap % geo->min;
  /* Cut points must be block boundaries, or a cut would make a
   * partial block out of an aligned request.  A step of cap or more
   * cuts at multiples of the largest power of 2 within the cap:
   * multiples of a cap such as 4G-1 (a plugin without a maximum) are
   * no boundary of anything.  (min is a power of 2, so both are
   * multiples of it.)
   */
  w->step = step < w->cap ? step - step % w->align : pow2_floor (w->cap);
  w->exportsize = geo->exportsize;
  assert (w->step > 0 && w->step % w->align == 0);
}

/* The end of the minimum block holding pos, clipped at end of export. */
static uint64_t
block_end (const struct walk *w, uint64_t block_start)
{
  return MIN (block_start + w->align, w->exportsize);
}

/* How far an aligned piece starting at w->pos may reach. */
static uint64_t
aligned_end (const struct walk *w)
{
  uint64_t end = w->end;

  /* start of the final block, short when the export size is not a
   * multiple of the alignment
   */
  uint64_t last = w->exportsize - w->exportsize % w->align;

  /* A range ending mid-block stops at the block start, except at the
   * end of the export where the short final block counts as whole.
   * That short block always goes alone, so a plugin refusing it fails
   * only the requests that touch it.
   */
  if (end != w->exportsize)
    end -= end % w->align;
  else if (w->pos < last)
    end = last;
  end = MIN (end, (w->pos / w->step + 1) * w->step);
  return MIN (end, w->pos + w->cap);
}

bool
walk_next (struct walk *w, struct piece *p)
{
  uint64_t bstart, bend;

  if (w->pos >= w->end)
    return false;

  bstart = w->pos - w->pos % w->align;
  bend = block_end (w, bstart);
  p->offset = w->pos;
  if (w->pos != bstart || w->end < bend) {
    p->partial = true;
    p->count = MIN (w->end, bend) - w->pos;
    p->blk_offset = bstart;
    p->blk_count = bend - bstart;
  }
  else {
    p->partial = false;
    p->count = aligned_end (w) - w->pos;
    p->blk_offset = p->offset;
    p->blk_count = p->count;
  }
  assert (p->count > 0);
  w->pos += p->count;
  return true;
}

bool
walk_is_aligned (const struct geometry *geo, uint64_t offset, uint32_t count)
{
  uint64_t end = offset + count;

  if (geo->min == 1)
    return true;
  if (offset % geo->min)
    return false;
  return end % geo->min == 0 || end == geo->exportsize;
}

void
walk_round_out (const struct geometry *geo, uint64_t offset, uint32_t count,
                uint64_t *start, uint64_t *end)
{
  uint64_t e = offset + count;

  *start = offset - offset % geo->min;
  if (e % geo->min)
    e += geo->min - e % geo->min;
  *end = MIN (e, geo->exportsize);
}
