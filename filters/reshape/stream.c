/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * A connection's stream of reads.  Each connection watches whether its
 * reads follow each other (within REORDER reads of where the last one
 * ended: a pipelining client's replies come out of order), and how:
 *
 *   - Grains.  A small read in the stream that misses the cache is
 *     served from the aligned grain that holds it: auto's, where the
 *     plugin's cost is flat up to a grain larger than a read (a
 *     cluster decoded whole) and grains pay (auto.c); a fixed
 *     reshape-size; or, for a client that waits for each read (its
 *     reads each come alone, ALONE_RUN in a row) over a plugin whose
 *     direct reads all took PLUGIN_SLOW_NS or more, the size told.
 *     (Memory, or files in the page cache, which the kernel reads
 *     ahead already, answer faster: no grains for them.)
 *
 *   - Runs.  The stream's first miss fetches a run of grains as long
 *     as a run may be (reshape-readahead); one that goes on from its
 *     last run (or a little past its end) fetches the next, twice as
 *     many grains as the last, up to that cap.  A read served from the
 *     cache half way through the last run has the next fetched before
 *     the stream reaches it, never more than one run past the read,
 *     where the client keeps reads in flight (a stream that ever had
 *     reads in flight together is a pipelining client's for good:
 *     once the cache serves it, its reads come one at a time).  A read
 *     elsewhere ends the stream, so random reads are never amplified.
 *
 *   - Fills.  A fill is begun in the cache before it reads, so that
 *     the reads it holds wait for it rather than read again; it reads
 *     into a pool buffer in one split read (cut where the learnt model
 *     says, in pieces that run at once), serves the read that made it,
 *     and leaves the buffer to the cache.  A fill that cannot be made,
 *     is not kept, or fails costs the client's read nothing: it goes
 *     to the plugin alone (bytes it did not ask for may be what
 *     failed).
 *
 * A read the cache holds is served from it, whoever filled it; one a
 * fill in progress holds waits for it.  Anything else, and reads that
 * are not part of a stream (also one that repeats the last read), go
 * to the plugin as they are, timed (a waiting client's grains need
 * the plugin's latency).  Whether a connection has a stream at all
 * (reshape-readahead, write-back without multi-conn) is reshape.c's
 * decision.
 */

#include <config.h>

#include <string.h>

#include <nbdkit-filter.h>

#include "cache.h"
#include "common.h"
#include "params.h"
#include "pool.h"
#include "split.h"
#include "stats.h"
#include "stream.h"
#include "tunables.h"
#include "auto.h"

void
stream_init (struct stream *s)
{
  pthread_mutex_init (&s->lock, NULL);
  s->last = s->next = UINT64_MAX;
  s->in_flight = 0;
  s->alone_run = 0;
  s->streak = 0;
  s->pipelined = false;
  s->latency = UINT64_MAX;
  s->run_lo = s->run_hi = 0;
}

void
stream_destroy (struct stream *s)
{
  pthread_mutex_destroy (&s->lock);
}

/* A client's read: [offset, offset+count) into buf (NULL: nobody
 * waits, the fill is a fetch ahead).
 */
struct read_req {
  void *buf;
  uint32_t count;
  uint64_t offset;
  struct cache_ask *ask;    /* registered in the cache while it waits */
  uint64_t span;            /* bytes after it its client is about to
                               ask for: its stream's other reads in
                               flight, times its size */
};

/* What the stream makes of a read (stream_begin). */
struct seen {
  bool in_stream;           /* near where the stream was */
  bool streaming;           /* ... and STREAK reads before it were */
  bool pipelined;           /* its client keeps reads in flight */
  unsigned in_flight;       /* the stream's reads in flight, with it */
  bool slow;                /* a waiting client's, going on where the
                               stream ended, over a slow plugin */
};

/* What a fill is for. */
enum fill_kind {
  FILL_NONE,
  FILL_RUN,                 /* a run of grains, the stream's last */
  FILL_GRAIN,               /* a read's grain alone */
};

/* What became of a fill. */
enum fill_result {
  FILL_KEPT,                /* in the cache */
  FILL_LOST,                /* not kept, or not made (no memory, staged
                               writes there, over budget) */
  FILL_FAILED,              /* the plugin failed it */
};

/* The largest fill: reshape-readahead, within what the pool can lend
 * one request, in whole minimum blocks (a fill ending inside a block
 * would need a bounce buffer).
 */
static uint32_t
fill_cap (const struct geometry *geo)
{
  return ROUND_DOWN (MIN (reshape_cfg.readahead,
                          pool_largest (POOL_REQUEST)), geo->min);
}

/* --- The stream's state, under its lock. --- */

/* Does rq lie within the stream's last read?  Then it reads the same
 * place again, which is no stream (a client polling one place), even
 * though it is near where the stream was.  Lock held.
 */
static bool
repeats_last (const struct stream *s, const struct read_req *rq)
{
  return rq->offset >= s->last && rq->offset + rq->count <= s->next;
}

/* Is the read a waiting client's that continues the stream where it
 * ended, over a plugin whose direct reads in this stream all took
 * PLUGIN_SLOW_NS or more?  Lock held.
 */
static bool
slow_waiter (struct stream *s, bool near, bool continues, bool waits)
{
  /* A read elsewhere starts a new stream, timed anew. */
  if (!near)
    s->latency = UINT64_MAX;
  return near && continues && waits && s->latency != UINT64_MAX &&
    s->latency >= PLUGIN_SLOW_NS;
}

/* Record rq as in flight in the stream, and what it is to it;
 * stream_end must follow.
 */
static void
stream_begin (struct stream *s, const struct read_req *rq, struct seen *v)
{
  const uint64_t reach = (uint64_t) REORDER * rq->count;
  bool continues, waits;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&s->lock);

  v->in_stream = s->next != UINT64_MAX && !repeats_last (s, rq) &&
    rq->offset + reach >= s->next && rq->offset <= s->next + reach;
  if (!v->in_stream) {                  /* the stream broke off */
    s->pipelined = false;
    s->run_lo = s->run_hi = 0;
    s->streak = 0;
  }
  else if (s->streak < STREAK)
    s->streak++;
  v->streaming = s->streak >= STREAK;
  /* A pipelining client's queue runs empty now and then (between its
   * work chunks): only a run of reads that each came alone counts.
   */
  v->in_flight = __atomic_add_fetch (&s->in_flight, 1, __ATOMIC_RELAXED);
  if (v->in_flight > 1)
    s->alone_run = 0, s->pipelined = true;
  else if (s->alone_run < ALONE_RUN)
    s->alone_run++;
  continues = rq->offset == s->next;
  waits = s->alone_run >= ALONE_RUN && !s->pipelined;
  v->pipelined = s->pipelined;
  s->last = rq->offset;
  s->next = rq->offset + rq->count;
  v->slow = slow_waiter (s, v->in_stream, continues, waits);
}

static void
stream_end (struct stream *s)
{
  __atomic_sub_fetch (&s->in_flight, 1, __ATOMIC_RELAXED);
}

/* A direct read of the stream took ns (0: it failed).  The fastest
 * decides: one read delayed by the scheduler does not start a run.
 */
static void
stream_timed (struct stream *s, uint64_t ns)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&s->lock);

  if (ns && ns < s->latency)
    s->latency = ns;
}

/* What became of a fill of [lo, hi) that the stream planned. */
static void
stream_filled (struct stream *s, enum fill_kind kind, uint64_t lo,
               uint64_t hi, enum fill_result result)
{
  if (result == FILL_KEPT)              /* the plan holds: no lock */
    return;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&s->lock);
  if (result == FILL_FAILED) {
    /* The next run starts afresh, a waiting client's once its reads
     * are timed again: else every read after would try the same
     * failing fill first.
     */
    s->run_lo = s->run_hi = 0;
    s->latency = UINT64_MAX;
  }
  else if (kind == FILL_RUN && s->run_lo == lo && s->run_hi == hi)
    /* The cache did not keep the run: the next is half as long, not
     * twice, so that a cache too small for the runs is not sent ever
     * larger ones to throw away.
     */
    s->run_lo = hi - (hi - lo) / 4;
}

/* --- Fills. --- */

/* The read as it is, to the stages below (nobody's: nothing to do).
 * It no longer asks the cache: a fill begun from now on is charged for
 * its bytes.
 */
static int
pass_down (struct cache *cache, const struct io *io,
           const struct read_req *rq, int *err)
{
  if (rq->buf == NULL)
    return 0;
  if (rq->ask)
    cache_ask_end (cache, rq->ask);
  return io->pread_below (io, rq->buf, rq->count, rq->offset, err);
}

/* A buffer for the fill, if it may be made: staged writes in its
 * range go first, and where some stay staged (held by a request, or
 * refused by the plugin) the fill would keep what the plugin has
 * instead of them.  (This never waits for a staged page: a read
 * waiting for the fill may hold one.)  NULL: not made.
 */
static char *
fill_buffer (const struct io *io, const struct cache_fill *f)
{
  if (!io->flush_staged (io, f->lo, f->hi))
    return NULL;
  return pool_get (POOL_REQUEST, f->hi - f->lo);
}

/* Read [f->lo, f->hi), a fill begun in the cache, into it, then serve
 * rq from it, or alone if the fill is lost or fails.
 */
static int
fill_read (struct cache *cache, const struct io *io, struct cache_fill *f,
           const struct read_req *rq, enum fill_result *result, int *err)
{
  const uint32_t len = f->hi - f->lo;
  char *data = fill_buffer (io, f);
  int r;

  if (data == NULL) {
    cache_fill_end (cache, f, NULL, 0, false);
    stats_add (C_RA_LOST, 1);
    *result = FILL_LOST;
    return pass_down (cache, io, rq, err);
  }
  r = split_pread_as (io, data, len, f->lo, true, err);
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
    r = pass_down (cache, io, rq, err);
  return r;
}

/* A fill for rq, planned and begun (begin below): its kind, the range
 * planned, the fill.
 */
struct plan {
  enum fill_kind kind;
  uint32_t size;            /* the grain */
  uint64_t lo, hi;
  struct cache_fill f;
};

static int begin (struct stream *s, struct cache *cache,
                  const struct io *io, const struct read_req *rq,
                  struct plan *p);

/* Serve rq by the fill p plans, or, if a fill in progress holds rq,
 * from that one once it ends (a few times at most, if writes keep
 * making what is filled stale); else rq goes down as it is.  The
 * stream hears what became of the fill.
 */
static int
fill_serve (struct stream *s, struct cache *cache, const struct io *io,
            struct plan *p, const struct read_req *rq, int *err)
{
  enum fill_result result = FILL_LOST;
  unsigned tries;
  int r;

  for (tries = 0; tries < FILL_TRIES; tries++) {
    switch (begin (s, cache, io, rq, p)) {
    case 1:
      stats_add (C_RA_MISSES, 1);
      r = fill_read (cache, io, &p->f, rq, &result, err);
      stream_filled (s, p->kind, p->lo, p->hi, result);
      return r;
    case 0:
      if (cache_lookup (cache, rq->offset, rq->count, rq->buf, rq->ask,
                        true)) {
        stats_add (C_RA_HITS, 1);
        return 0;
      }
      continue;
    }
    break;
  }
  return pass_down (cache, io, rq, err);
}

/* --- Grains. --- */

/* The grain a read v in the stream that missed the cache is served
 * from: auto's (auto_stream_grain), or else, for a fixed
 * reshape-size or a waiting client over a slow plugin, the size, if
 * it is larger than the read, whole minimum blocks that the pool can
 * lend and the plugin take in one call; else 0: the read goes as it
 * is.
 */
static uint32_t
stream_grain (const struct io *io, const struct seen *v, uint32_t count)
{
  const struct geometry *geo = io->geo;
  const uint64_t cap = MIN (MIN (pool_largest (POOL_REQUEST),
                                 geo->max), geo->exportsize);
  uint32_t grain = 0;

  if (io->autoexp && v->streaming)
    grain = auto_stream_grain (io->autoexp, count, cap);
  if (grain == 0 && (io->autoexp ? v->slow : v->streaming || v->slow) &&
      geo->size > count && geo->size <= cap)
    grain = geo->size;
  return grain;
}

/* The longest run: the largest fill, but at least a grain. */
static uint64_t
run_cap (const struct io *io, uint32_t grain)
{
  return MAX (ROUND_DOWN (fill_cap (io->geo), grain), grain);
}

/* The stream's next run after its last, recorded as its last: twice
 * as many grains as the last, up to run_cap, reaching at least need,
 * ending no further than one run_cap past the read at offset, clipped
 * at the end of the export.  False if there is nothing to fetch.
 * Lock held.
 */
static bool
next_run (struct stream *s, const struct io *io, uint32_t grain,
          uint64_t need, uint64_t offset)
{
  const uint64_t last = s->run_hi - s->run_lo;
  const uint64_t lo = s->run_hi;
  const uint64_t cap = run_cap (io, grain);
  const uint64_t reach = ROUND_DOWN (offset, grain) + cap;
  /* Whole grains: a run ending inside a grain would split it between
   * two fetches, each paying for all of it.
   */
  uint64_t len = MIN (MAX (ROUND_DOWN (2 * last, grain), grain), cap);

  if (lo + len > reach)
    len = reach > lo ? ROUND_DOWN (reach - lo, grain) : 0;
  if (need > lo)
    len = MAX (len, need - lo);
  if (len == 0 || lo >= io->geo->exportsize)
    return false;
  s->run_lo = lo;
  s->run_hi = MIN (lo + len, io->geo->exportsize);
  return true;
}

/* What a read that missed fetches in grains of p->size: the stream's
 * next run, a new run (as long as a run may be), or its grain alone
 * (a read racing the run that holds it, or whose grain the run did not
 * keep); FILL_NONE: it goes as it is (across two grains).  Lock held.
 */
static void
run_plan (struct stream *s, const struct io *io, const struct read_req *rq,
          struct plan *p)
{
  const uint32_t grain = p->size;
  const uint64_t size = io->geo->exportsize;

  p->lo = ROUND_DOWN (rq->offset, grain);
  p->hi = MIN (p->lo + grain, size);
  p->kind = FILL_NONE;
  if (rq->offset + rq->count > p->lo + grain)
    return;
  p->kind = FILL_GRAIN;
  if (p->lo < s->run_hi)
    return;
  if (s->run_hi > s->run_lo && p->hi - s->run_hi <= run_cap (io, grain)) {
    if (!next_run (s, io, grain, p->hi, rq->offset)) {
      p->kind = FILL_NONE;
      return;
    }
  }
  else {
    s->run_lo = p->lo;
    s->run_hi = MIN (p->lo + run_cap (io, grain), size);
  }
  p->kind = FILL_RUN;
  p->lo = s->run_lo;
  p->hi = s->run_hi;
}

/* Plan p's fill for rq and begin it in the cache: 1 begun, or as
 * cache_fill_begin says.  A run is planned and begun under the
 * stream's lock, so that the stream's reads never see a run recorded
 * that the cache does not know.
 */
static int
begin (struct stream *s, struct cache *cache, const struct io *io,
       const struct read_req *rq, struct plan *p)
{
  int r;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&s->lock);

  run_plan (s, io, rq, p);
  if (p->kind == FILL_NONE)
    return CACHE_NOTHING;
  r = cache_fill_begin (cache, &p->f, p->lo, p->hi, io->geo->min,
                        rq->offset, rq->offset + rq->count, rq->span,
                        rq->ask);
  if (p->kind != FILL_RUN)
    return r;
  if (r == 1) {                 /* the run is what the cache lacked */
    s->run_lo = p->lo = p->f.lo;
    s->run_hi = p->hi = p->f.hi;
  }
  else
    s->run_lo = s->run_hi = 0;          /* the next starts afresh */
  return r;
}

/* rq was served from the cache half way or more through the stream's
 * last run, in a stream that keeps reads in flight (or over a plugin
 * that serializes requests): the next run is due, begun in f (true).
 * Reads fetched in grains only: the grain larger than the read, and
 * one the pool can lend.
 */
static bool
ahead_begin (struct stream *s, struct cache *cache, const struct io *io,
             const struct read_req *rq, struct cache_fill *f)
{
  const uint32_t grain = io->autoexp ? auto_published_grain (io->autoexp)
                                     : io->geo->size;

  if (grain <= rq->count || grain > pool_largest (POOL_REQUEST))
    return false;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&s->lock);
  if (s->run_hi <= s->run_lo || s->run_hi >= io->geo->exportsize ||
      rq->offset < s->run_lo || rq->offset >= s->run_hi ||
      rq->offset + rq->count <= s->run_lo + (s->run_hi - s->run_lo) / 2 ||
      !next_run (s, io, grain, 0, rq->offset))
    return false;
  if (cache_fill_begin (cache, f, s->run_lo, s->run_hi, io->geo->min,
                        s->run_lo, s->run_lo, 0, NULL) != 1) {
    s->run_lo = s->run_hi = 0;
    return false;
  }
  s->run_lo = f->lo;            /* the run is what the cache lacked */
  s->run_hi = f->hi;
  return true;
}

/* --- Serving a read. --- */

/* A read that misses the cache, in the stream or not: in grains, or
 * as it is, timed (a waiting client's grains need the plugin's
 * latency).
 */
static int
read_missed (struct stream *s, struct cache *cache, const struct io *io,
             const struct seen *v, const struct read_req *rq, int *err)
{
  struct plan p = { .kind = FILL_RUN };
  uint64_t start, took = 0;
  int r;

  if ((p.size = stream_grain (io, v, rq->count)) > 0)
    return fill_serve (s, cache, io, &p, rq, err);
  start = now_ns ();
  r = pass_down (cache, io, rq, err);
  if (r == 0)
    took = now_ns () - start;
  stream_timed (s, took);
  return r;
}

int
stream_pread (struct stream *s, struct cache *cache, const struct io *io,
              void *buf, uint32_t count, uint64_t offset,
              struct stream_ahead *ahead, int *err)
{
  struct cache_ask ask = { .linked = false };
  struct read_req rq = { .buf = buf, .count = count,
                         .offset = offset, .ask = &ask };
  struct seen v;
  int r;

  ahead->due = false;
  /* Requests of the optimal size or larger are already what the plugin
   * wants: no copy through the cache for them (reshape-size=SIZE; auto
   * learns what that size is from them too).
   */
  if (count >= io->geo->size && io->autoexp == NULL)
    return STREAM_PASS;
  stream_begin (s, &rq, &v);
  rq.span = (uint64_t) (v.in_flight - 1) * count;
  /* A read in the stream waits for a fill in progress that holds it. */
  if (cache_lookup (cache, offset, count, buf, &ask, v.in_stream)) {
    stats_add (C_RA_HITS, 1);
    r = 0;
    /* A plugin that serializes requests shows the filter one read at
     * a time: its streams never look pipelined, yet their client may
     * keep several reads in flight (qemu-img reading a qcow2 over
     * curl on nbdkit 1.32), which a run fetched ahead keeps served.
     */
    ahead->due = v.in_stream && !v.slow &&
      (v.pipelined ||
       !(reshape_cfg.parallel_ok || reshape_debug_ablate & ABLATE_AHEAD)) &&
      ahead_begin (s, cache, io, &rq, &ahead->f);
  }
  else
    r = read_missed (s, cache, io, &v, &rq, err);
  cache_ask_end (cache, &ask);
  stream_end (s);
  return r;
}

void
stream_fetch_ahead (struct stream *s, struct cache *cache, const struct io *io,
                    struct stream_ahead *ahead)
{
  const struct read_req nobody = { .buf = NULL };
  enum fill_result result;
  int ignored;                          /* no client's error */
  const uint64_t lo = ahead->f.lo, hi = ahead->f.hi;

  if (!ahead->due)
    return;
  stats_add (C_RA_AHEAD, 1);
  stats_add (C_RA_MISSES, 1);
  fill_read (cache, io, &ahead->f, &nobody, &result, &ignored);
  stream_filled (s, FILL_RUN, lo, hi, result);
}

void
stream_prefetch (struct cache *cache, const struct io *io, uint32_t count,
                 uint64_t offset)
{
  const struct geometry *geo = io->geo;
  const uint64_t chunk = fill_cap (geo);
  const uint64_t end = MIN (ROUND_UP (offset + count, geo->min),
                            geo->exportsize);
  const struct read_req nobody = { .buf = NULL };
  enum fill_result result = FILL_KEPT;
  uint64_t lo = ROUND_DOWN (offset, geo->min);
  int ignored;                          /* advice: no client's error */
  struct cache_fill f;

  if (chunk < geo->min)
    return;
  /* What the cache holds or fills already is skipped; the first chunk
   * that cannot be read in (over budget, lost, failed) ends it.
   */
  for (; lo < end && result == FILL_KEPT; lo = MIN (lo + chunk, end)) {
    switch (cache_fill_begin (cache, &f, lo, MIN (lo + chunk, end), geo->min,
                              lo, lo, 0, NULL)) {
    case 1:
      stats_add (C_RA_CACHED, f.hi - f.lo);
      fill_read (cache, io, &f, &nobody, &result, &ignored);
      break;
    case CACHE_REFUSED:
      return;
    }
  }
}
