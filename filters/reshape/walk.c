/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Split, read-modify-write and every later feature take their pieces
 * from here: the rules (alignment, cut points, cap, end of export) are
 * in one place.
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
  /* Cuts fall on block boundaries, or a cut would make partial blocks
   * of an aligned request.  A step of the cap or more cuts at the
   * largest power of 2 within it: multiples of a cap such as 4G-1 (a
   * plugin without a maximum) are no boundary of anything.
   */
  w->step = step < w->cap ? step - step % w->align : pow2_floor (w->cap);
  w->exportsize = geo->exportsize;
  assert (w->step > 0 && w->step % w->align == 0);
}

/* How far an aligned piece starting at w->pos may reach.  A range
 * ending mid-block stops at the block's start, but at the end of the
 * export, where the short last block counts as whole and always goes
 * alone (a plugin refusing it fails only the requests touching it).
 */
static uint64_t
aligned_end (const struct walk *w)
{
  const uint64_t last = w->exportsize - w->exportsize % w->align;
  uint64_t end = w->end;

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
  const uint64_t bstart = w->pos - w->pos % w->align;
  const uint64_t bend = MIN (bstart + w->align, w->exportsize);

  if (w->pos >= w->end)
    return false;
  p->offset = w->pos;
  p->partial = w->pos != bstart || w->end < bend;
  if (p->partial) {
    p->count = MIN (w->end, bend) - w->pos;
    p->blk_offset = bstart;
    p->blk_count = bend - bstart;
  }
  else {
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
  const uint64_t end = offset + count;

  return geo->min == 1 || (offset % geo->min == 0 &&
                           (end % geo->min == 0 || end == geo->exportsize));
}

void
walk_round_out (const struct geometry *geo, uint64_t offset, uint32_t count,
                uint64_t *start, uint64_t *end)
{
  *start = ROUND_DOWN (offset, geo->min);
  *end = MIN (ROUND_UP (offset + count, geo->min), geo->exportsize);
}
