/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Grains (reshape-size=auto).  Where the plugin's cost is flat up to a
 * grain larger than a read (a cluster decoded whole) and grains pay
 * (tune.c), a small read in a stream that keeps several in flight
 * fetches the aligned grain that holds it, once, for the neighbours in
 * flight with it; a stream that goes on from its last fetch (or a
 * little past its end: replies come out of order) fetches the next run
 * of twice as many grains, up to the window cap, cut into pieces that
 * run at once (split.c, by the learnt model), and a read served from
 * the cache half way through the last run has the next fetched before
 * the stream reaches it, never more than one run past the read.
 * Random reads go as they are.
 *
 * While the export is being learnt, the stream's misses are the
 * learning's instead: each either goes as it is, or fetches one aligned
 * block alone (one plugin call), timed if it is a sample.
 */

#include <config.h>

#include <nbdkit-filter.h>

#include "cache.h"
#include "common.h"
#include "fill.h"
#include "grain.h"
#include "pool.h"
#include "stats.h"
#include "tune.h"
#include "tunables.h"


void
grains_init (struct grains *g)
{
  pthread_mutex_init (&g->lock, NULL);
  g->lo = g->hi = 0;
}

void
grains_destroy (struct grains *g)
{
  pthread_mutex_destroy (&g->lock);
}

void
grains_reset (struct grains *g)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&g->lock);

  g->lo = g->hi = 0;
}

void
grains_plan (const struct io *io, uint32_t count, unsigned in_flight,
             struct tune_fetch *tf)
{
  const struct geometry *geo = io->geo;
  const uint64_t cap = min_u64 (min_u64 (pool_largest (POOL_REQUEST),
                                         geo->max), geo->exportsize);

  *tf = (struct tune_fetch) { .size = 0 };
  if (io->tune == NULL)
    return;
  tune_stream_fetch (io->tune, count, in_flight, cap, tf);
  if (tf->size && (tf->size % geo->min || tf->size > cap)) {
    tune_sample_done (io->tune, tf, 0);
    tf->rung = 0;
    tf->size = 0;
  }
}

/* The longest run: the largest window, but at least a grain. */
static uint64_t
run_cap (const struct io *io, uint32_t grain)
{
  return max_u64 (round_down (fill_cap (io->geo), grain), grain);
}

/* A fill of the stream's last run that the cache did not keep: the
 * next run is half as long instead of twice, so that a cache too small
 * for the runs is not sent ever larger ones to throw away.
 */
static void
run_lost (struct grains *g, const struct cache_fill *f)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&g->lock);

  if (g->lo == f->lo && g->hi == f->hi)
    g->lo = f->hi - (f->hi - f->lo) / 4;
}

/* Read fill f for rq, and what the stream makes of the outcome. */
static int
run_read (struct grains *g, struct cache *cache, const struct io *io,
          const struct down *down, struct cache_fill *f,
          const struct read_req *rq, int *err)
{
  enum fill_result result;
  int r;

  stats_add (C_RA_GRAINS, 1);
  r = fill_read (cache, io, down, f, rq, NULL, &result, err);
  if (result == FILL_LOST)
    run_lost (g, f);
  else if (result == FILL_FAILED)
    grains_reset (g);
  return r;
}

/* The stream's next run after its last, up to need at least: twice as
 * many grains as the last, up to run_cap, ending no further than one
 * run_cap past rq, clipped at the end of the export; recorded as the
 * stream's last run and begun in the cache (f) for rq (count 0: a
 * fetch ahead, nobody asked), so that the stream's reads that find it
 * claimed wait for it.  False if there is nothing to fetch, or the
 * budget refuses it (the runs then start again).  Lock held.
 */
static bool
claim_after (struct grains *g, struct cache *cache, const struct io *io,
             uint32_t grain, uint64_t need, const struct read_req *rq,
             struct cache_fill *f)
{
  const uint64_t last = g->hi - g->lo;
  const uint64_t lo = g->hi;
  const uint64_t cap = run_cap (io, grain);
  const uint64_t reach = round_down (rq->offset, grain) + cap;
  /* Whole grains: a run ending inside a grain would split it between
   * two fetches, each paying for all of it.
   */
  uint64_t len = min_u64 (max_u64 (round_down (2 * last, grain), grain),
                          cap);

  if (lo + len > reach)
    len = reach > lo ? round_down (reach - lo, grain) : 0;
  if (need > lo)
    len = max_u64 (len, need - lo);
  if (len == 0 || lo >= io->geo->exportsize)
    return false;
  g->lo = lo;
  g->hi = min_u64 (lo + len, io->geo->exportsize);
  if (!cache_fill_begin (cache, f, g->lo, g->hi, rq->offset,
                         rq->offset + rq->count)) {
    g->lo = g->hi = 0;
    return false;
  }
  return true;
}

/* What a read does about grains. */
enum grain_plan {
  GRAIN_NONE,               /* goes as it is */
  GRAIN_RUN,                /* f is begun: the stream's next run */
  GRAIN_ALONE,              /* its own grain, [f->lo, f->hi), not begun */
};

static enum grain_plan
grain_plan (struct grains *g, struct cache *cache, const struct io *io,
            uint32_t grain, const struct read_req *rq, struct cache_fill *f)
{
  const uint64_t lo = round_down (rq->offset, grain);
  const uint64_t hi = min_u64 (lo + grain, io->geo->exportsize);
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&g->lock);

  if (rq->offset + rq->count > lo + grain)      /* across two grains */
    return GRAIN_NONE;
  if (lo >= g->hi && g->hi > g->lo && hi - g->hi <= run_cap (io, grain))
    return claim_after (g, cache, io, grain, hi, rq, f) ?
      GRAIN_RUN : GRAIN_NONE;
  if (lo >= g->hi) {                    /* a new run starts here */
    if (!cache_fill_begin (cache, f, lo, hi, rq->offset,
                           rq->offset + rq->count))
      return GRAIN_NONE;
    g->lo = lo;
    g->hi = hi;
    return GRAIN_RUN;
  }
  /* Within or behind the stream's runs: a read racing the run that
   * holds it, or one whose grain the run did not keep (a write made
   * it stale, the cache gave it up): its grain alone.
   */
  f->lo = lo;
  f->hi = hi;
  return GRAIN_ALONE;
}

/* Fetch the block [f->lo, f->hi) for rq within it, unless a fill in
 * progress holds rq (then that is waited for; a few times at most, if
 * writes keep making what is fetched stale); alone if the budget
 * refuses it.  *took (if not NULL): the plugin read's time, 0 if none
 * was made by this read.
 */
static int
block_read (struct grains *g, struct cache *cache, const struct io *io,
            const struct down *down, struct cache_fill *f,
            const struct read_req *rq, uint64_t *took, int *err)
{
  enum fill_result result;
  unsigned tries;

  if (took)
    *took = 0;
  for (tries = 0; tries < FILL_TRIES; tries++) {
    switch (cache_fill_begin_unless (cache, f, f->lo, f->hi, rq->offset,
                                     rq->offset + rq->count)) {
    case 1: {
      int r;
      stats_add (C_RA_GRAINS, 1);
      r = fill_read (cache, io, down, f, rq, took, &result, err);
      if (result == FILL_FAILED)
        grains_reset (g);
      return r;
    }
    case 0:
      if (fill_wait (cache, true, rq))
        return 0;
      break;
    default:
      return fill_direct (down, rq, err);
    }
  }
  return fill_direct (down, rq, err);
}

/* The aligned block of tf->size bytes holding rq, fetched alone (the
 * learning's: one plugin call), timed if it is a sample.
 */
static int
block_alone (struct grains *g, struct cache *cache, const struct io *io,
             const struct down *down, const struct tune_fetch *tf,
             const struct read_req *rq, int *err)
{
  struct cache_fill f;
  uint64_t took = 0;
  int r;

  f.lo = round_down (rq->offset, tf->size);
  f.hi = min_u64 (f.lo + tf->size, io->geo->exportsize);
  if (rq->offset + rq->count > f.hi)
    r = fill_direct (down, rq, err);
  else
    r = block_read (g, cache, io, down, &f, rq, tf->rung ? &took : NULL,
                    err);
  if (tf->rung)
    tune_sample_done (io->tune, tf, took);
  return r;
}

int
grains_read (struct grains *g, struct cache *cache, const struct io *io,
             const struct down *down, const struct tune_fetch *tf,
             const struct read_req *rq, int *err)
{
  struct cache_fill f;

  if (tf->alone)
    return block_alone (g, cache, io, down, tf, rq, err);
  switch (grain_plan (g, cache, io, tf->size, rq, &f)) {
  case GRAIN_RUN:
    return run_read (g, cache, io, down, &f, rq, err);
  case GRAIN_ALONE:
    return block_read (g, cache, io, down, &f, rq, NULL, err);
  case GRAIN_NONE:
    break;
  }
  return fill_direct (down, rq, err);
}

/* The learnt grain, if reads of count bytes are fetched in grains and
 * the pool can lend one; else 0.
 */
static uint32_t
learnt_grain (const struct io *io, uint32_t count)
{
  struct tune_sizes s = { 0 };

  if (io->tune)
    tune_get_sizes (io->tune, &s);
  if (s.grain <= count || s.grain > pool_largest (POOL_REQUEST))
    return 0;
  return s.grain;
}

bool
grains_ahead_due (struct grains *g, struct cache *cache, const struct io *io,
                  const struct read_req *rq, struct cache_fill *f)
{
  const uint32_t grain = learnt_grain (io, rq->count);
  const struct read_req ahead = { .buf = NULL, .offset = rq->offset };
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&g->lock);

  if (grain == 0 || g->hi <= g->lo || g->hi >= io->geo->exportsize)
    return false;
  if (rq->offset < g->lo || rq->offset >= g->hi ||
      rq->offset + rq->count <= g->lo + (g->hi - g->lo) / 2)
    return false;
  return claim_after (g, cache, io, grain, 0, &ahead, f);
}

void
grains_fetch_ahead (struct grains *g, struct cache *cache,
                    const struct io *io, const struct down *down,
                    struct cache_fill *f)
{
  const struct read_req nobody = { .buf = NULL };
  int ignored;                          /* no client's error */

  stats_add (C_RA_AHEAD, 1);
  run_read (g, cache, io, down, f, &nobody, &ignored);
}
