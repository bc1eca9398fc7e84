/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Adaptive readahead.  Each connection watches whether its small reads
 * (below reshape-size) follow each other.  Once they do, a miss reads a
 * window ahead into the export's cache (cache.c); the window starts at
 * reshape-size and doubles while the stream stays sequential, up to
 * reshape-readahead, and collapses at the first read elsewhere.  Random
 * small reads are never amplified: only a read that continues the
 * previous one can start a fill.  The fill itself is one plugin read
 * cut into reshape-size pieces, which run in parallel (split.c).
 *
 * Readahead trades plugin calls for copies through the cache, which
 * pays only where a call costs time:
 * - for a client that waits for each read before it sends the next.
 *   One that keeps several reads in flight hides the latency itself
 *   (and may skip holes it learnt of from extents, which a window
 *   would read), so its reads go straight through;
 * - for a plugin with latency.  The reads that start a stream go
 *   straight to the plugin and are timed; a plugin that answered any
 *   of them faster than PLUGIN_SLOW_NS (memory, or files in the page
 *   cache, which the kernel reads ahead already) gets no window.
 *
 * Whether readahead runs at all (reshape-readahead, write-back without
 * multi-conn) is reshape.c's decision.
 */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <nbdkit-filter.h>

#include "cache.h"
#include "common.h"
#include "params.h"
#include "pool.h"
#include "readahead.h"
#include "split.h"
#include "stage.h"
#include "stats.h"
#include "tune.h"

void
readahead_init (struct readahead *ra)
{
  pthread_mutex_init (&ra->lock, NULL);
  ra->next = UINT64_MAX;
  ra->window = 0;
  ra->reading = 0;
  ra->alone = 0;
  ra->latency = UINT64_MAX;
}

void
readahead_destroy (struct readahead *ra)
{
  pthread_mutex_destroy (&ra->lock);
}

/* Largest window worth filling: reshape-readahead, within what the
 * pool can lend one request, in whole minimum blocks (a window end
 * inside a block would need a bounce buffer for nothing).
 */
static uint32_t
window_cap (const struct geometry *geo)
{
  uint64_t cap = min_u64 (reshape_cfg.readahead,
                          pool_largest (POOL_REQUEST));

  return round_down (cap, geo->min);
}

/* A stream earns a window after this many reads in a row that each
 * came alone (a pipelining client's queue runs empty now and then).
 */
#define ALONE_RUN 4

/* How far out of order a pipelining client's sequential reads arrive,
 * in reads: nbdcopy keeps 64 in flight.
 */
#define REORDER 64

/* Record this read as in flight; returns the window to fill, 0 for
 * none, and whether the read is near where the connection read last
 * (in a stream, however many reads it keeps in flight).  read_done
 * must follow.
 */
static uint32_t
next_window (struct readahead *ra, const struct geometry *geo,
             uint64_t offset, uint32_t count, bool *near)
{
  const uint32_t cap = window_cap (geo);
  const uint64_t reach = (uint64_t) REORDER * count;
  uint32_t w = 0;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&ra->lock);

  *near = ra->next != UINT64_MAX &&
    offset + reach >= ra->next && offset <= ra->next + reach;

  /* A pipelining client's queue runs empty now and then (between its
   * work chunks): only a run of reads that each came alone counts.
   */
  if (++ra->reading > 1)
    ra->alone = 0;
  else if (ra->alone < ALONE_RUN)
    ra->alone++;
  if (offset != ra->next)
    ra->latency = UINT64_MAX;           /* a new stream: time it anew */
  else if (ra->alone >= ALONE_RUN && ra->latency != UINT64_MAX &&
           ra->latency >= PLUGIN_SLOW_NS) {
    w = ra->window ? ra->window * 2 : geo->size;
    if (w > cap)
      w = cap;
  }
  ra->window = w;
  ra->next = offset + count;
  if (w < geo->size)
    return 0;
  stats_max (C_RA_WINDOW, w);
  return w;
}

/* The read is back.  A read sent straight through (took_ns > 0) tells
 * whether the plugin has latency worth hiding; the fastest of the
 * stream decides, so that one read delayed by the scheduler does not
 * start a window.
 */
static void
read_done (struct readahead *ra, uint64_t took_ns)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&ra->lock);

  ra->reading--;
  if (took_ns && took_ns < ra->latency)
    ra->latency = took_ns;
}

/* Read [lo, hi) into the cache, then serve the client. */
static int
fill (struct cache *cache, const struct io *io, const struct down *down,
      uint64_t lo, uint64_t hi, void *buf, uint32_t count, uint64_t offset,
      int *err)
{
  const uint32_t len = hi - lo;
  struct cache_fill f;
  char *data;
  int r;

  /* Staged writes in the window go first.  Where some stay staged
   * (held by a request, or refused by the plugin), the window would
   * keep what the plugin has instead of them: read directly.
   */
  if (!down->window_ok (down->opaque, lo, hi))
    return down->pread (down->opaque, buf, count, offset, err);
  data = pool_get (POOL_REQUEST, len);
  if (data == NULL)                  /* no memory to spare: read directly */
    return down->pread (down->opaque, buf, count, offset, err);
  cache_fill_begin (cache, &f, lo, hi);
  r = split_pread_as (io, data, len, lo, true, err);
  if (r == 0) {
    memcpy (buf, data + (offset - lo), count);
    stats_add (C_RA_FILLED, len);
  }
  if (!cache_fill_end (cache, &f, data, len, r == 0))
    pool_put (POOL_REQUEST, data, len);
  return r;
}

/* The window [offset, offset+window) from the grain holding offset
 * (reshape-size=auto: a grain costs what any part of it costs) or else
 * the block, rounded out to whole blocks (no bounce buffer) and
 * clipped at the end of the export.
 */
static void
window_range (const struct io *io, uint32_t window, uint32_t count,
              uint64_t offset, uint64_t *lo, uint64_t *hi)
{
  const struct geometry *geo = io->geo;
  struct tune_sizes s = { 0 };

  if (io->tune)
    tune_sizes (io->tune, &s);
  *lo = round_down (offset, max_u64 (geo->min, s.grain));
  *hi = max_u64 (*lo + window, round_up (offset + count, geo->min));
  *hi = min_u64 (*hi, geo->exportsize);
}

/* reshape-size=auto found the plugin's cost flat up to a grain larger
 * than this read (a cluster decoded whole, a latency that dwarfs the
 * transfer): in a stream, fetch the aligned grain that holds the read,
 * once, for the neighbours that come with it.  Random reads go
 * directly (a grain each would cost them nothing but bandwidth, and
 * bring nothing).  False if the read is not for a grain.
 */
static bool
grain_range (const struct io *io, uint32_t count, uint64_t offset,
             uint64_t *lo, uint64_t *hi)
{
  struct tune_sizes s = { 0 };

  if (io->tune)
    tune_sizes (io->tune, &s);
  if (s.grain <= count || s.grain > pool_largest (POOL_REQUEST))
    return false;
  *lo = round_down (offset, s.grain);
  *hi = min_u64 (*lo + s.grain, io->geo->exportsize);
  return offset + count <= *hi;
}

int
readahead_pread (struct readahead *ra, struct cache *cache,
                 const struct io *io, const struct down *down,
                 void *buf, uint32_t count, uint64_t offset, int *err)
{
  uint32_t window;
  uint64_t took = 0;                    /* a direct read's time */
  uint64_t lo, hi;
  bool near;
  int r;

  /* Requests of the optimal size or larger are already what the plugin
   * wants: no copy through the cache for them.
   */
  if (count >= io->geo->size)
    return down->pread (down->opaque, buf, count, offset, err);
  window = next_window (ra, io->geo, offset, count, &near);
  if (cache_read (cache, offset, count, buf)) {
    stats_add (C_RA_HITS, 1);
    r = 0;
  }
  else if (window) {
    stats_add (C_RA_MISSES, 1);
    window_range (io, window, count, offset, &lo, &hi);
    r = fill (cache, io, down, lo, hi, buf, count, offset, err);
  }
  else if (near && grain_range (io, count, offset, &lo, &hi)) {
    /* A neighbour may be fetching it already. */
    if (cache_wait_fill (cache, offset, offset + count) &&
        cache_read (cache, offset, count, buf)) {
      stats_add (C_RA_HITS, 1);
      r = 0;
    }
    else {
      stats_add (C_RA_GRAINS, 1);
      r = fill (cache, io, down, lo, hi, buf, count, offset, err);
    }
  }
  else {
    const uint64_t start = now_ns ();

    r = down->pread (down->opaque, buf, count, offset, err);
    if (r == 0)
      took = now_ns () - start;
  }
  read_done (ra, took);
  return r;
}
