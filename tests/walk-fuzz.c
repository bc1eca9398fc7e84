/* nbdkit-reshape-filter: invariants of the range walker (walk.c).
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Built two ways from this one file:
 *   - as a libFuzzer target (clang -fsanitize=fuzzer), when available;
 *   - with -DWALK_RANDOM_MAIN, a plain program that feeds it random
 *     inputs from a seed, so make check always checks the invariants.
 *
 * For any geometry and request, the pieces must: follow each other
 * with no gap or overlap, cover exactly the request, be no longer than
 * max, start aligned and end aligned (or at the end of the export) when
 * whole, lie inside their minimum block when partial, and never reach
 * past the end of the export.  Whole pieces never cross a multiple of
 * the step.
 */

#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "walk.h"

#define CHECK(c) do { if (!(c)) fail (#c, &geo, offset, count, step, &p); } \
  while (0)

static void
fail (const char *what, const struct geometry *geo, uint64_t offset,
      uint64_t count, uint32_t step, const struct piece *p)
{
  fprintf (stderr, "walk invariant broken: %s\n"
           "  min %u size %u max %u exportsize %llu; request %llu+%llu "
           "step %u; piece %llu+%u partial %d block %llu+%u\n",
           what, geo->min, geo->size, geo->max,
           (unsigned long long) geo->exportsize,
           (unsigned long long) offset, (unsigned long long) count, step,
           (unsigned long long) p->offset, p->count, p->partial,
           (unsigned long long) p->blk_offset, p->blk_count);
  abort ();
}

static uint64_t
take (const uint8_t **data, size_t *size, unsigned bytes)
{
  uint64_t v = 0;

  while (bytes-- && *size) {
    v = (v << 8) | **data;
    (*data)++;
    (*size)--;
  }
  return v;
}

static void
check (const struct geometry geo, uint64_t offset, uint64_t count,
       uint32_t step)
{
  struct walk w;
  struct piece p = { 0 };
  uint64_t pos = offset, start, end;
  const uint32_t cap = geo.max - geo.max % geo.min;
  /* Cut at multiples of step below the cap; at or above it, at
   * multiples of the largest power of 2 within the cap.
   */
  uint32_t cut = cap;

  while (cut & (cut - 1))
    cut &= cut - 1;
  if (step < cap)
    cut = step - step % geo.min;

  walk_init (&w, &geo, offset, count, step, geo.max);
  while (walk_next (&w, &p)) {
    CHECK (p.offset == pos);
    CHECK (p.count > 0 && p.count <= geo.max);
    CHECK (p.offset + p.count <= offset + count);
    CHECK (p.blk_offset + p.blk_count <= geo.exportsize);
    if (p.partial) {
      CHECK (p.blk_offset % geo.min == 0);
      CHECK (p.blk_count <= geo.min);
      CHECK (p.blk_offset <= p.offset);
      CHECK (p.offset + p.count <= p.blk_offset + p.blk_count);
      CHECK (p.offset != p.blk_offset || p.count != p.blk_count);
    }
    else {
      CHECK (p.offset % geo.min == 0);
      CHECK ((p.offset + p.count) % geo.min == 0 ||
             p.offset + p.count == geo.exportsize);
      CHECK (p.blk_offset == p.offset && p.blk_count == p.count);
      CHECK (p.offset / cut == (p.offset + p.count - 1) / cut);
    }
    pos += p.count;
  }
  CHECK (pos == offset + count);

  walk_round_out (&geo, offset, count, &start, &end);
  CHECK (start <= offset && start % geo.min == 0);
  CHECK (end >= offset + count && end <= geo.exportsize);
  CHECK (end % geo.min == 0 || end == geo.exportsize);
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  struct geometry geo;
  uint64_t offset, count;
  uint32_t step;

  if (size < 20)
    return 0;
  geo.min = 1u << (take (&data, &size, 1) % 17);              /* 1..64K */
  geo.max = geo.min * (1 + take (&data, &size, 3) % 4096);
  geo.size = geo.min * (1 + take (&data, &size, 2) % 1024);
  if (geo.size > geo.max)
    geo.size = geo.max;
  geo.exportsize = 1 + take (&data, &size, 5);
  offset = take (&data, &size, 5) % geo.exportsize;
  count = take (&data, &size, 4) % (geo.exportsize - offset + 1);
  /* Bounded pieces per request keep a run short; cap and end-of-export
   * cases are still reached with small max.
   */
  if (count > (uint64_t) geo.max * 64)
    count = (uint64_t) geo.max * 64;
  step = take (&data, &size, 1) % 2 ? geo.size : UINT32_MAX;
  if (count == 0)
    return 0;
  check (geo, offset, count, step);
  return 0;
}

#ifdef WALK_RANDOM_MAIN
int
main (int argc, char *argv[])
{
  unsigned long seed = argc > 1 ? strtoul (argv[1], NULL, 0) : 1;
  long n = argc > 2 ? strtol (argv[2], NULL, 0) : 1000000;
  uint8_t buf[32];

  printf ("walk-check: seed %lu, %ld random requests\n", seed, n);
  srandom (seed);
  for (long i = 0; i < n; i++) {
    for (size_t j = 0; j < sizeof buf; j++)
      buf[j] = random ();
    /* Small exports and requests often, where the edge cases are. */
    if (i % 2)
      buf[4] = buf[5] = buf[6] = buf[7] = buf[8] = 0;
    LLVMFuzzerTestOneInput (buf, sizeof buf);
  }
  printf ("walk-check: all invariants held\n");
  return 0;
}
#endif
