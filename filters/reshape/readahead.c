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
 *   would read), so its reads get no window (grains, below, may serve
 *   them);
 * - for a plugin with latency.  The reads that start a stream go
 *   straight to the plugin and are timed; a plugin that answered any
 *   of them faster than PLUGIN_SLOW_NS (memory, or files in the page
 *   cache, which the kernel reads ahead already) gets no window.
 *
 * reshape-size=auto adds grains, for pipelining clients too: where the
 * plugin's cost is flat up to a grain larger than a read (tune.c), a
 * small read in a stream that no window serves fetches the aligned
 * grain that holds it; a stream that goes on fetches twice as many
 * grains each time, up to reshape-readahead (or one grain, if that is
 * larger), and one that keeps several reads in flight has its next
 * grains fetched before it reaches them, never more than one such run
 * past the read that fetches it.  A fetch is claimed and begun in the
 * cache at once, so that the stream's other reads wait for it rather
 * than fetch again; a read the stream's fetches did not keep fetches
 * its own grain.  A fetch that fails costs the client's read nothing:
 * it is read alone.  While the export is being learnt, the stream's
 * misses are its samples instead (tune_stream_fetch): each either goes
 * to the plugin as it is, or fetches one aligned block of the size
 * being tried.
 *
 * Every fill is charged to the export's budget for the bytes its
 * client did not ask for (cache.c); a fill over budget is not made,
 * and the read goes to the plugin as it is.
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
  ra->ahead_lo = ra->ahead_hi = 0;
  ra->deep = false;
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
  if (!*near) {                         /* the stream broke off */
    ra->ahead_lo = ra->ahead_hi = 0;
    ra->deep = false;
  }

  /* A pipelining client's queue runs empty now and then (between its
   * work chunks): only a run of reads that each came alone counts.
   */
  if (++ra->reading > 1)
    ra->alone = 0, ra->deep = true;
  else if (ra->alone < ALONE_RUN)
    ra->alone++;
  /* A stream that ever had reads in flight together is a pipelining
   * one for good: once the cache serves it (grains, the learning's
   * blocks), its reads come and go one at a time and would look
   * alone.
   */
  if (offset != ra->next)
    ra->latency = UINT64_MAX;           /* a new stream: time it anew */
  else if (count < geo->size &&
           ra->alone >= ALONE_RUN && ra->latency != UINT64_MAX &&
           ra->latency >= PLUGIN_SLOW_NS && !ra->deep) {
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

/* A fill of the stream failed: its window and its run of grains start
 * again from the smallest, else every read after would try the same
 * failing fill first.
 */
static void
stream_failed (struct readahead *ra)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&ra->lock);

  ra->window = 0;
  ra->latency = UINT64_MAX;
  ra->ahead_lo = ra->ahead_hi = 0;
}

/* A fill the cache did not keep (no room for it, or a write made it
 * stale before it was in), or not even made (no memory to lend, staged
 * writes in its range): if it was the stream's last run of grains,
 * the next is half as long instead of twice, so that a cache too
 * small for the runs is not sent ever larger ones to throw away.
 */
static void
run_lost (struct readahead *ra, const struct cache_fill *f)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&ra->lock);

  stats_add (C_RA_LOST, 1);
  if (ra->ahead_lo == f->lo && ra->ahead_hi == f->hi)
    ra->ahead_lo = f->hi - (f->hi - f->lo) / 4;
}

/* The client's read, straight through (none: a fetch ahead). */
static int
direct (const struct down *down, void *buf, uint32_t count,
        uint64_t offset, int *err)
{
  return buf ? down->pread (down->opaque, buf, count, offset, err) : 0;
}

/* Read [f->lo, f->hi), a fill begun in the cache, into it, then serve
 * the client's read (buf; NULL: nobody waits for it, it is fetched
 * ahead).  *took (if not NULL): the time of the plugin read of the
 * fill, 0 if it was not made or failed.
 */
static int
fill_begun (struct readahead *ra, struct cache *cache, const struct io *io,
            const struct down *down, struct cache_fill *f,
            void *buf, uint32_t count, uint64_t offset, uint64_t *took,
            int *err)
{
  const uint32_t len = f->hi - f->lo;
  char *data = NULL;
  uint64_t start;
  int r;

  if (took)
    *took = 0;

  /* Staged writes in the window go first.  Where some stay staged
   * (held by a request, or refused by the plugin), the window would
   * keep what the plugin has instead of them: read directly, as when
   * there is no memory to spare.  Reads waiting for the fill then read
   * for themselves.  (This never waits for a staged block: a read
   * waiting for the fill may hold one.)
   */
  if (!down->window_ok (down->opaque, f->lo, f->hi) ||
      (data = pool_get (POOL_REQUEST, len)) == NULL) {
    cache_fill_end (cache, f, NULL, 0, false);
    run_lost (ra, f);
    return direct (down, buf, count, offset, err);
  }
  /* A sample times the plugin, not the first touch of fresh memory
   * (a new pool buffer faults its pages in as the plugin writes them).
   */
  if (took)
    memset (data, 0, len);
  start = now_ns ();
  r = split_pread_as (io, data, len, f->lo, true, err);
  if (r == 0 && took)
    *took = now_ns () - start;
  if (r == 0) {
    if (buf)
      memcpy (buf, data + (offset - f->lo), count);
    stats_add (C_RA_FILLED, len);
  }
  if (!cache_fill_end (cache, f, data, len, r == 0)) {
    pool_put (POOL_REQUEST, data, len);
    if (r == 0)
      run_lost (ra, f);
  }
  /* Bytes the client did not ask for may be what failed (a bad region
   * megabytes ahead): its own read says whether it fails.
   */
  if (r == -1) {
    stream_failed (ra);
    r = direct (down, buf, count, offset, err);
  }
  return r;
}

static int
fill (struct readahead *ra, struct cache *cache, const struct io *io,
      const struct down *down, uint64_t lo, uint64_t hi,
      void *buf, uint32_t count, uint64_t offset, int *err)
{
  struct cache_fill f;

  if (!cache_fill_begin (cache, &f, lo, hi, offset + count))
    return direct (down, buf, count, offset, err);
  return fill_begun (ra, cache, io, down, &f, buf, count, offset, NULL,
                     err);
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

/* The grain of reshape-size=auto, if small reads of count bytes are
 * worth fetching as grains (the cost is flat up to a grain larger than
 * they are, and the pool can lend one); else 0.
 */
static uint32_t
stream_grain (const struct io *io, uint32_t count)
{
  struct tune_sizes s = { 0 };

  if (io->tune)
    tune_sizes (io->tune, &s);
  if (s.grain <= count || s.grain > pool_largest (POOL_REQUEST))
    return 0;
  return s.grain;
}

/* The largest fetch for a stream: the largest window, but at least a
 * grain.
 */
static uint64_t
run_cap (const struct io *io, uint32_t grain)
{
  return max_u64 (round_down (window_cap (io->geo), grain), grain);
}

/* The stream's next fetch after its last, up to need at least: twice
 * as many grains as the last, up to run_cap, but ending no further
 * than one run_cap past the read at offset (one window per stream),
 * clipped at the end of the export; recorded as the stream's last
 * fetch and begun in the cache (f) for the read [offset, offset+count)
 * (count 0: a fetch ahead, nobody asked), so that the stream's reads
 * that find it claimed find it there to wait for.  False if there is
 * nothing to fetch, or the budget refuses it (the stream's runs then
 * start again).  Lock held.
 */
static bool
claim_after (struct readahead *ra, struct cache *cache,
             const struct io *io, uint32_t grain, uint64_t need,
             uint64_t offset, uint32_t count, struct cache_fill *f)
{
  const uint64_t last = ra->ahead_hi - ra->ahead_lo;
  const uint64_t lo = ra->ahead_hi;
  const uint64_t cap = run_cap (io, grain);
  const uint64_t reach = round_down (offset, grain) + cap;
  /* Whole grains (run_lost halves a run of any length): a run ending
   * inside a grain would split it between two fetches, each paying
   * for all of it.
   */
  uint64_t len = min_u64 (max_u64 (round_down (2 * last, grain), grain),
                          cap);

  if (lo + len > reach)
    len = reach > lo ? round_down (reach - lo, grain) : 0;
  if (need > lo)
    len = max_u64 (len, need - lo);
  if (len == 0 || lo >= io->geo->exportsize)
    return false;
  ra->ahead_lo = lo;
  ra->ahead_hi = min_u64 (lo + len, io->geo->exportsize);
  if (!cache_fill_begin (cache, f, ra->ahead_lo, ra->ahead_hi,
                         offset + count)) {
    ra->ahead_lo = ra->ahead_hi = 0;
    return false;
  }
  return true;
}

/* What a small read in a stream that missed the cache does about
 * grains (reshape-size=auto found the plugin's cost flat up to a grain
 * larger than the read: a cluster decoded whole, a latency that dwarfs
 * the transfer).  It fetches the aligned grain that holds it, once,
 * for the neighbours that come with it; where the stream goes on from
 * its last fetch (or a little past its end: a client's reads in flight
 * arrive out of order), the next run of twice as many grains as then
 * (cut into pieces that run at once: split.c), so that a stream that
 * keeps reading fetches far enough ahead to overlap the plugin's
 * latency.  Random reads go directly (a grain each would cost them
 * nothing but bandwidth, and bring nothing).
 */
enum grain_plan {
  GRAIN_NONE,               /* not for grains: read directly */
  GRAIN_RUN,                /* f is begun, the stream's next run */
  GRAIN_ALONE,              /* its grain, [f->lo, f->hi), not begun */
};

static enum grain_plan
grain_plan (struct readahead *ra, struct cache *cache, const struct io *io,
            uint32_t grain, uint32_t count, uint64_t offset,
            struct cache_fill *f)
{
  const uint64_t lo = round_down (offset, grain);
  const uint64_t hi = min_u64 (lo + grain, io->geo->exportsize);
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&ra->lock);

  if (offset + count > lo + grain)      /* across two grains */
    return GRAIN_NONE;
  if (lo >= ra->ahead_hi && ra->ahead_hi > ra->ahead_lo &&
      hi - ra->ahead_hi <= run_cap (io, grain))
    return claim_after (ra, cache, io, grain, hi, offset, count, f) ?
      GRAIN_RUN : GRAIN_NONE;
  if (lo >= ra->ahead_hi) {             /* a new run starts here */
    if (!cache_fill_begin (cache, f, lo, hi, offset + count))
      return GRAIN_NONE;
    ra->ahead_lo = lo;
    ra->ahead_hi = hi;
    return GRAIN_RUN;
  }
  /* Within or behind the stream's runs: a read racing the run that
   * holds it, or one whose grain the run did not keep (a write made
   * it stale, the cache gave it up): its grain alone, if no fill in
   * progress holds it.
   */
  f->lo = lo;
  f->hi = hi;
  return GRAIN_ALONE;
}

/* A read served from the cache half way or more through the stream's
 * last fetch, in a stream that keeps several reads in flight (nbdcopy
 * keeps 64; no window serves it; reads served from the cache come and
 * go one at a time, so any two in flight together count): the next
 * grains are due now, before the stream reaches them (begun in f).
 * This read waits for them once it has let go of its write-back claim
 * (readahead_fetch_ahead; the filter has no thread of its own to read
 * with); the others in flight go on.  A client that waits for
 * each read has windows instead (one waiting here would wait for the
 * plugin on a read the cache holds).
 */
static bool
ahead_due (struct readahead *ra, struct cache *cache, const struct io *io,
           uint32_t count, uint64_t offset, struct cache_fill *f)
{
  const uint32_t grain = stream_grain (io, count);
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&ra->lock);

  if (grain == 0 || ra->window || !ra->deep ||
      ra->ahead_hi <= ra->ahead_lo || ra->ahead_hi >= io->geo->exportsize)
    return false;
  if (offset < ra->ahead_lo || offset >= ra->ahead_hi ||
      offset + count <= ra->ahead_lo + (ra->ahead_hi - ra->ahead_lo) / 2)
    return false;
  return claim_after (ra, cache, io, grain, 0, offset, 0, f);
}

/* A fill in progress that holds the read (the stream's own, or another
 * connection's to the export) serves it from the cache once done.
 * The cache is read again only where one was waited for, or was seen
 * to hold it (held): it missed a moment ago.
 */
static bool
read_after_fill (struct cache *cache, bool held,
                 void *buf, uint32_t count, uint64_t offset)
{
  if (!cache_wait_fill (cache, offset, offset + count) && !held)
    return false;
  if (!cache_read (cache, offset, count, buf))
    return false;
  stats_add (C_RA_HITS, 1);
  return true;
}

/* Fetch the block [f->lo, f->hi) for a read within it, unless a fill
 * in progress holds the read (then that is waited for; a few times at
 * most, if writes keep making what they fetch stale); read alone if
 * the budget refuses it.
 */
static int
block_read (struct readahead *ra, struct cache *cache, const struct io *io,
            const struct down *down, struct cache_fill *f,
            void *buf, uint32_t count, uint64_t offset, int *err)
{
  unsigned tries;

  for (tries = 0; tries < 3; tries++) {
    switch (cache_fill_begin_unless (cache, f, f->lo, f->hi,
                                     offset, offset + count)) {
    case 1:
      stats_add (C_RA_GRAINS, 1);
      return fill_begun (ra, cache, io, down, f, buf, count, offset, NULL,
                         err);
    case 0:
      if (read_after_fill (cache, true, buf, count, offset))
        return 0;
      break;
    default:
      return down->pread (down->opaque, buf, count, offset, err);
    }
  }
  return down->pread (down->opaque, buf, count, offset, err);
}

/* A small read in a stream, by grains (grain_plan). */
static int
grain_read (struct readahead *ra, struct cache *cache, const struct io *io,
            const struct down *down, uint32_t grain,
            void *buf, uint32_t count, uint64_t offset, int *err)
{
  struct cache_fill f;

  if (read_after_fill (cache, false, buf, count, offset))
    return 0;
  switch (grain_plan (ra, cache, io, grain, count, offset, &f)) {
  case GRAIN_NONE:
    break;
  case GRAIN_RUN:
    stats_add (C_RA_GRAINS, 1);
    return fill_begun (ra, cache, io, down, &f, buf, count, offset, NULL,
                     err);
  case GRAIN_ALONE:
    /* A fill begun since is waited for; a few times at most, if
     * writes keep making what they fetch stale.
     */
    return block_read (ra, cache, io, down, &f, buf, count, offset, err);
  }
  return down->pread (down->opaque, buf, count, offset, err);
}

/* How a read of count bytes in a stream is served when it misses the
 * cache (tune_stream_fetch), if the block it is to be fetched in is
 * whole blocks that the pool can lend and the plugin take in one call;
 * else f->size is 0: read it as it is.
 */
static void
stream_fetch (const struct io *io, uint32_t count, struct tune_fetch *f)
{
  const struct geometry *geo = io->geo;
  const uint64_t cap = min_u64 (min_u64 (pool_largest (POOL_REQUEST),
                                         geo->max), geo->exportsize);

  *f = (struct tune_fetch) { .size = 0 };
  if (io->tune == NULL)
    return;
  tune_stream_fetch (io->tune, count, cap, f);
  if (f->size && (f->size % geo->min || f->size > cap)) {
    tune_sample_done (io->tune, f, 0);
    f->rung = 0;
    f->size = 0;
  }
}

/* The aligned block of f->size bytes holding the read, fetched alone
 * (one plugin call: the learning's), if it holds all of the read and
 * no fill in progress does; timed if it is a sample.
 */
static int
block_alone (struct readahead *ra, struct cache *cache, const struct io *io,
             const struct down *down, const struct tune_fetch *tf,
             void *buf, uint32_t count, uint64_t offset, int *err)
{
  struct cache_fill f;
  uint64_t took = 0;
  int r;

  f.lo = round_down (offset, tf->size);
  f.hi = min_u64 (f.lo + tf->size, io->geo->exportsize);
  if (offset + count <= f.hi &&
      cache_fill_begin_unless (cache, &f, f.lo, f.hi,
                               offset, offset + count) == 1) {
    stats_add (C_RA_GRAINS, 1);
    r = fill_begun (ra, cache, io, down, &f, buf, count, offset,
                    tf->rung ? &took : NULL, err);
  }
  else if (read_after_fill (cache, false, buf, count, offset))
    r = 0;
  else
    r = down->pread (down->opaque, buf, count, offset, err);
  if (tf->rung)
    tune_sample_done (io->tune, tf, took);
  return r;
}

int
readahead_pread (struct readahead *ra, struct cache *cache,
                 const struct io *io, const struct down *down,
                 void *buf, uint32_t count, uint64_t offset,
                 struct ra_ahead *ahead, int *err)
{
  uint32_t window;
  uint64_t took = 0;                    /* a direct read's time */
  uint64_t lo, hi;
  struct tune_fetch tf = { .size = 0 };
  bool near;
  int r;

  ahead->due = false;
  /* Requests of the optimal size or larger are already what the plugin
   * wants: no copy through the cache for them (reshape-size=SIZE; auto
   * learns what that size is from them too).
   */
  if (count >= io->geo->size && io->tune == NULL)
    return down->pread (down->opaque, buf, count, offset, err);
  window = next_window (ra, io->geo, offset, count, &near);
  if (cache_read (cache, offset, count, buf)) {
    stats_add (C_RA_HITS, 1);
    r = 0;
    ahead->due = near && ahead_due (ra, cache, io, count, offset, &ahead->f);
  }
  else if (window) {
    stats_add (C_RA_MISSES, 1);
    window_range (io, window, count, offset, &lo, &hi);
    r = fill (ra, cache, io, down, lo, hi, buf, count, offset, err);
  }
  else if (near && read_after_fill (cache, false, buf, count, offset))
    r = 0;                              /* a fill in progress held it */
  else if (near && (stream_fetch (io, count, &tf), tf.size))
    r = tf.alone ?
      block_alone (ra, cache, io, down, &tf, buf, count, offset, err) :
      grain_read (ra, cache, io, down, tf.size, buf, count, offset, err);
  else {
    const uint64_t start = now_ns ();

    r = down->pread (down->opaque, buf, count, offset, err);
    if (r == 0)
      took = now_ns () - start;
    if (tf.rung)                        /* the base of a learning pair */
      tune_sample_done (io->tune, &tf, took);
  }
  read_done (ra, took);
  return r;
}

void
readahead_fetch_ahead (struct readahead *ra, struct cache *cache,
                       const struct io *io, const struct down *down,
                       struct ra_ahead *ahead)
{
  int ignored;                          /* no client's error */

  if (!ahead->due)
    return;
  stats_add (C_RA_GRAINS, 1);
  stats_add (C_RA_AHEAD, 1);
  fill_begun (ra, cache, io, down, &ahead->f, NULL, 0, 0, NULL, &ignored);
}

int
readahead_cache (struct readahead *ra, struct cache *cache,
                 const struct io *io, const struct down *down,
                 uint32_t count, uint64_t offset)
{
  const struct geometry *geo = io->geo;
  const uint64_t chunk = max_u64 (window_cap (geo), geo->min);
  const uint64_t end = min_u64 (round_up (offset + count, geo->min),
                                geo->exportsize);
  uint64_t lo = round_down (offset, geo->min);
  int ignored;                          /* advice: no client's error */
  struct cache_fill f;

  for (; lo < end; lo = f.hi) {
    if (!cache_fill_begin (cache, &f, lo, min_u64 (lo + chunk, end), lo))
      break;
    stats_add (C_RA_CACHED, f.hi - f.lo);
    fill_begun (ra, cache, io, down, &f, NULL, 0, 0, NULL, &ignored);
  }
  return 0;
}
