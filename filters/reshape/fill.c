/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Filling the read cache from the plugin.  A fill is begun in the
 * cache (cache.c) before it reads, so that the reads it holds wait for
 * it rather than read again; it reads into a pool buffer in one split
 * read (cut where the learnt model says), serves the client's read
 * that made it, and leaves the buffer to the cache.  A fill that
 * cannot be made, or is not kept, or fails, costs the client's read
 * nothing: it goes to the plugin alone.  What a stream does about it
 * (a window starts again, a run of grains shrinks) is the caller's.
 */

#include <config.h>

#include <string.h>

#include <nbdkit-filter.h>

#include "cache.h"
#include "common.h"
#include "fill.h"
#include "params.h"
#include "pool.h"
#include "split.h"
#include "stage.h"
#include "stats.h"

uint32_t
fill_cap (const struct geometry *geo)
{
  uint64_t cap = min_u64 (reshape_cfg.readahead,
                          pool_largest (POOL_REQUEST));

  /* A fill ending inside a block would need a bounce buffer. */
  return round_down (cap, geo->min);
}

int
fill_direct (const struct down *down, const struct read_req *rq, int *err)
{
  if (rq->buf == NULL)
    return 0;
  return down->pread (down->opaque, rq->buf, rq->count, rq->offset, err);
}

/* A buffer for the fill, if it may be made: staged writes in its
 * range go first, and where some stay staged (held by a request, or
 * refused by the plugin) the fill would keep what the plugin has
 * instead of them.  (This never waits for a staged block: a read
 * waiting for the fill may hold one.)  NULL: not made.
 */
static char *
fill_buffer (const struct down *down, const struct cache_fill *f)
{
  if (!down->window_ok (down->opaque, f->lo, f->hi))
    return NULL;
  return pool_get (POOL_REQUEST, f->hi - f->lo);
}

int
fill_read (struct cache *cache, const struct io *io, const struct down *down,
           struct cache_fill *f, const struct read_req *rq, uint64_t *took,
           enum fill_result *result, int *err)
{
  const uint32_t len = f->hi - f->lo;
  char *data = fill_buffer (down, f);
  uint64_t start;
  int r;

  if (took)
    *took = 0;
  if (data == NULL) {
    cache_fill_end (cache, f, NULL, 0, false);
    stats_add (C_RA_LOST, 1);
    *result = FILL_LOST;
    return fill_direct (down, rq, err);
  }
  /* A timed fill times the plugin, not the first touch of fresh
   * memory (a new pool buffer faults its pages in as it is written).
   */
  if (took)
    memset (data, 0, len);
  start = now_ns ();
  r = split_pread_as (io, data, len, f->lo, true, err);
  if (r == 0 && took)
    *took = now_ns () - start;
  if (r == 0) {
    if (rq->buf)
      memcpy (rq->buf, data + (rq->offset - f->lo), rq->count);
    stats_add (C_RA_FILLED, len);
  }
  *result = r == 0 ? FILL_KEPT : FILL_FAILED;
  if (!cache_fill_end (cache, f, data, len, r == 0)) {
    pool_put (POOL_REQUEST, data, len);
    if (r == 0) {
      stats_add (C_RA_LOST, 1);
      *result = FILL_LOST;
    }
  }
  if (r == -1)
    r = fill_direct (down, rq, err);
  return r;
}

int
fill_range (struct cache *cache, const struct io *io, const struct down *down,
            uint64_t lo, uint64_t hi, const struct read_req *rq,
            enum fill_result *result, int *err)
{
  struct cache_fill f;

  if (!cache_fill_begin (cache, &f, lo, hi, rq->offset,
                         rq->offset + rq->count)) {
    *result = FILL_LOST;
    return fill_direct (down, rq, err);
  }
  return fill_read (cache, io, down, &f, rq, NULL, result, err);
}

bool
fill_wait (struct cache *cache, bool held, const struct read_req *rq)
{
  const uint64_t end = rq->offset + rq->count;

  if (!cache_wait_fill (cache, rq->offset, end) && !held)
    return false;
  if (!cache_read (cache, rq->offset, rq->count, rq->buf))
    return false;
  stats_add (C_RA_HITS, 1);
  return true;
}

void
fill_cache_request (struct cache *cache, const struct io *io,
                    const struct down *down, uint64_t chunk,
                    uint32_t count, uint64_t offset)
{
  const struct geometry *geo = io->geo;
  const uint64_t end = min_u64 (round_up (offset + count, geo->min),
                                geo->exportsize);
  const struct read_req nobody = { .buf = NULL };
  enum fill_result result;
  uint64_t lo = round_down (offset, geo->min);
  int ignored;                          /* advice: no client's error */
  struct cache_fill f;

  if (chunk < geo->min)
    return;
  /* Chunks the cache holds already are skipped; the first that cannot
   * be read in (over budget, lost, failed) ends it.
   */
  for (; lo < end; lo = min_u64 (lo + chunk, end)) {
    const uint64_t hi = min_u64 (lo + chunk, end);
    if (cache_holds (cache, lo, hi))
      continue;
    if (!cache_fill_begin (cache, &f, lo, hi, lo, lo))
      break;
    stats_add (C_RA_CACHED, f.hi - f.lo);
    fill_read (cache, io, down, &f, &nobody, NULL, &result, &ignored);
    if (result != FILL_KEPT)
      break;
  }
}
