/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * A connection's reads make a stream while each starts within REORDER
 * reads of where the last one ended.  A small read in the stream that
 * misses the cache is served from the aligned grain that holds it, in
 * runs of grains, and a read served half way through the last run has
 * the next fetched ahead.  The cache is one list of ranges, most
 * recently used first: data kept, and fills in progress, each keyed by
 * its cache (an export's or a connection's).  Bytes fills read that no
 * client asked for stay within a budget.  docs/design.md, Read-ahead,
 * has the reasons.
 *
 * One lock guards the list, the budget and every stream: a read takes
 * it once to note its stream, look itself up and plan a fill.  It is
 * never held across plugin I/O; auto's and the pool's locks are taken
 * under it, never the other way round.
 */

#include <config.h>

#include <stdlib.h>
#include <string.h>
#include <pthread.h>

#include <nbdkit-filter.h>

#include "auto.h"
#include "common.h"
#include "params.h"
#include "pool.h"
#include "readahead.h"
#include "split.h"
#include "stats.h"
#include "tunables.h"

/* Fills failed in a row past which the back-off grows no more. */
#define FAILED_MAX 8

/* Data kept (buf), or a fill in progress (buf NULL). */
struct readahead_range {
  uint64_t lo, hi;
  struct readahead_cache *cache;
  char *buf;
  bool stale;               /* filling: a write overlapped it */
  uint64_t ask_lo, ask_hi;  /* filling: the read that made it */
  uint64_t unread;          /* bytes no client read yet */
  uint64_t charged;         /* of those, charged to the budget */
  uint32_t chunk;           /* bytes per bit of read[] */
  uint64_t read[CACHE_CHUNKS / 64];
  struct readahead_range *next;
};

static struct {
  pthread_mutex_t lock;
  pthread_cond_t filled;            /* a fill ended */
  struct readahead_range *list;     /* most recently used first */
  unsigned ranges;                  /* in the list (atomic) */
  uint64_t pending, wasted;         /* the budget */
} ra = {
  .lock = PTHREAD_MUTEX_INITIALIZER, .filled = PTHREAD_COND_INITIALIZER,
};

/* What became of a fill: read and kept, read, not made (no memory,
 * staged writes there), failed.
 */
enum fill_result { FILL_KEPT, FILL_LOST, FILL_UNMADE, FILL_FAILED };

/* What fill_begin did: begun, nothing to fill beyond the read, refused
 * (by the budget or the back-off).
 */
enum { BEGUN, NOTHING, REFUSED };

/* --- The budget and the list, lock held. --- */

static bool
budget_charge (uint64_t n)
{
  const uint64_t allowed = stats_client_read () / BUDGET_SHARE + BUDGET_BASE;

  if (n && ra.pending + ra.wasted + n > allowed) {
    stats_add (C_RA_REFUSED, 1);
    return false;
  }
  ra.pending += n;
  return true;
}

/* n bytes read from the plugin that no client will read. */
static void
budget_waste (uint64_t n, uint64_t charged)
{
  ra.wasted += n;
  ra.pending -= charged;
  stats_add (C_RA_UNREAD, n);
}

static void
range_link (struct readahead_range *r)
{
  r->next = ra.list;
  ra.list = r;
  __atomic_add_fetch (&ra.ranges, 1, __ATOMIC_SEQ_CST);
}

static struct readahead_range *
range_unlink (struct readahead_range **pp)
{
  struct readahead_range *r = *pp;

  *pp = r->next;
  __atomic_sub_fetch (&ra.ranges, 1, __ATOMIC_SEQ_CST);
  return r;
}

/* What no client read of it was read for nothing. */
static void
range_drop (struct readahead_range **pp)
{
  struct readahead_range *r = range_unlink (pp);

  if (r->unread)
    budget_waste (r->unread, r->charged);
  pool_put (POOL_CACHE, r->buf, r->hi - r->lo);
  free (r);
}

static bool
drop_oldest (uint64_t *freed)
{
  struct readahead_range **pp, **oldest = NULL;

  for (pp = &ra.list; *pp; pp = &(*pp)->next)
    if ((*pp)->buf)
      oldest = pp;
  if (oldest == NULL)
    return false;
  *freed += (*oldest)->hi - (*oldest)->lo;
  range_drop (oldest);
  return true;
}

/* Drop c's data overlapping [lo, hi); c NULL: a write there, which
 * every cache's data and fills (made stale) forget.
 */
static void
range_forget (const struct readahead_cache *c, uint64_t lo, uint64_t hi)
{
  struct readahead_range **pp = &ra.list;

  while (*pp) {
    struct readahead_range *r = *pp;
    if ((c && r->cache != c) || r->hi <= lo || hi <= r->lo || !r->buf) {
      r->stale |= c == NULL && r->hi > lo && hi > r->lo;
      pp = &r->next;
    }
    else
      range_drop (pp);
  }
}

/* c's data holding pos, moved to the front. */
static struct readahead_range *
range_find (const struct readahead_cache *c, uint64_t pos)
{
  struct readahead_range **pp, *r;

  for (pp = &ra.list; (r = *pp) != NULL; pp = &r->next)
    if (r->cache == c && r->buf && r->lo <= pos && pos < r->hi) {
      *pp = r->next;
      r->next = ra.list;
      ra.list = r;
      return r;
    }
  return NULL;
}

/* Mark [lo, hi) of r read: the bytes of the chunks read for the
 * first time.
 */
static uint64_t
range_mark (struct readahead_range *r, uint64_t lo, uint64_t hi)
{
  uint64_t n = 0, i;

  lo = MAX (lo, r->lo);
  hi = MIN (hi, r->hi);
  for (i = (lo - r->lo) / r->chunk; lo < hi && i <= (hi - 1 - r->lo) / r->chunk;
       i++) {
    const uint64_t bit = UINT64_C (1) << (i % 64);
    if (r->read[i / 64] & bit)
      continue;
    r->read[i / 64] |= bit;
    n += MIN (r->chunk, r->hi - r->lo - i * r->chunk);
  }
  return n;
}

/* A client read [lo, hi) of r.  The bytes its fill's read asked for
 * (not charged) are taken first: the charge is held until the unasked
 * bytes are what is read.
 */
static void
range_read (struct readahead_range *r, uint64_t lo, uint64_t hi)
{
  const uint64_t n = MIN (range_mark (r, lo, hi), r->unread);
  const uint64_t asked = r->unread - r->charged;
  const uint64_t refund = n > asked ? n - asked : 0;

  r->unread -= n;
  r->charged -= refund;
  ra.pending -= refund;
}

/* Copy [offset, offset+count) into dst if c holds it whole. */
static bool
range_copy (const struct readahead_cache *c, char *dst, uint32_t count,
            uint64_t offset)
{
  struct readahead_range *r;
  uint64_t pos, n;

  for (pos = offset; pos < offset + count; pos = r->hi)
    if ((r = range_find (c, pos)) == NULL)
      return false;
  for (pos = offset; pos < offset + count; pos += n) {
    r = range_find (c, pos);
    n = MIN (r->hi, offset + count) - pos;
    range_read (r, pos, pos + n);
    memcpy (dst + (pos - offset), r->buf + (pos - r->lo), n);
  }
  return true;
}

static bool
fill_covers (const struct readahead_cache *c, uint64_t lo, uint64_t hi)
{
  const struct readahead_range *r;

  for (r = ra.list; r; r = r->next)
    if (r->cache == c && r->buf == NULL && r->lo <= lo && hi <= r->hi)
      return true;
  return false;
}

/* Begin a fill of what [lo, hi) holds around the read [read_lo,
 * read_hi) (empty: nobody's) that c neither holds nor fills, in whole
 * blocks of align, charging what neither the read nor the span bytes
 * after it ask for.
 */
static int
fill_begin (struct readahead_cache *c, uint64_t lo, uint64_t hi,
            uint32_t align, uint64_t read_lo, uint64_t read_hi,
            uint64_t span, struct readahead_range **f)
{
  const uint64_t own_lo = ROUND_DOWN (read_lo, align);
  const uint64_t own_hi = MIN (ROUND_UP (read_hi, align), MAX (hi, read_hi));
  const struct readahead_range *r;
  uint64_t ask_lo, ask_hi, asked;

  for (r = ra.list; r; r = r->next) {           /* the gap around it */
    if (r->cache != c)
      continue;
    if (r->hi <= read_lo && r->hi > lo)
      lo = r->hi;
    else if (r->lo >= read_hi && r->lo < hi)
      hi = r->lo;
  }
  lo = MIN (ROUND_UP (lo, align), own_lo);
  hi = MAX (ROUND_DOWN (hi, align), own_hi);
  if (lo == own_lo && hi == own_hi)
    return NOTHING;
  /* After n failed fills in a row, one fill in 2^n is tried. */
  if (c->failed && ++c->misses % (1u << c->failed))
    return REFUSED;
  ask_lo = MIN (MAX (read_lo, lo), hi);
  ask_hi = MAX (MIN (read_hi, hi), ask_lo);
  /* Over a plugin that fails, a fill is charged whole: if it fails,
   * what its reads asked of it was read for nothing too.
   */
  asked = MIN (read_hi + span, hi);
  asked = c->failing || asked <= ask_lo ? 0 : asked - ask_lo;
  if (!budget_charge (hi - lo - asked))
    return REFUSED;
  *f = calloc (1, sizeof **f);
  if (*f == NULL) {
    ra.pending -= hi - lo - asked;
    return REFUSED;
  }
  **f = (struct readahead_range) { .lo = lo, .hi = hi, .cache = c,
                                   .ask_lo = ask_lo, .ask_hi = ask_hi,
                                   .charged = hi - lo - asked };
  range_link (*f);
  return BEGUN;
}

/* The cache's share of the pool takes len bytes, the oldest data
 * making room.
 */
static bool
make_room (uint32_t len)
{
  uint64_t freed = 0;

  while (!pool_keep (len))
    if (!drop_oldest (&freed))
      return false;
  return true;
}

/* f ends: its data (len bytes in buf, read if ok) kept if it may be;
 * its charge moves to the data, or is wasted with what it read, or
 * refunded.  Whether buf was kept.
 */
static bool
fill_keep (struct readahead_range *f, char *buf, uint32_t len, bool ok)
{
  struct readahead_cache *c = f->cache;
  struct readahead_range **pp;

  for (pp = &ra.list; *pp != f; pp = &(*pp)->next)
    ;
  range_unlink (pp);
  pthread_cond_broadcast (&ra.filled);
  if (!ok && len == 0)                  /* never read */
    ra.pending -= f->charged;
  else if (!ok) {
    /* Fills back off until one succeeds. */
    budget_waste (len, f->charged);
    c->failed = MIN (c->failed + 1, FAILED_MAX);
    c->failing = true;
  }
  else {
    c->failed = c->misses = 0;
    if (!f->stale) {
      range_forget (c, f->lo, f->hi);
      if (make_room (len)) {
        f->buf = buf;
        for (f->chunk = 4096; (uint64_t) f->chunk * CACHE_CHUNKS < len; )
          f->chunk *= 2;
        f->unread = len - range_mark (f, f->ask_lo, f->ask_hi);
        /* The chunks a client read count whole: the charge may be
         * less.
         */
        ra.pending -= f->charged - MIN (f->unread, f->charged);
        f->charged = MIN (f->unread, f->charged);
        range_link (f);
        return true;
      }
    }
    budget_waste (len - (f->ask_hi - f->ask_lo), f->charged);
  }
  free (f);
  return false;
}

/* --- The stream, lock held but where said. --- */

struct seen {
  bool in_stream;           /* near where the stream was */
  bool streaming;           /* ... and STREAK reads before it were */
  bool pipelined;           /* its client keeps reads in flight */
  unsigned in_flight;       /* the stream's reads in flight, with it */
  bool slow;                /* a waiting client's, going on where the
                               stream ended, over a slow plugin */
};

void
readahead_stream_init (struct readahead_stream *s)
{
  *s = (struct readahead_stream) { .last = UINT64_MAX, .next = UINT64_MAX,
                                   .latency = UINT64_MAX };
}

/* Note a read of the stream and what it is to it.  A read within the
 * last one reads the same place again (a client polling): no stream.
 */
static void
stream_note (struct readahead_stream *s, uint32_t count, uint64_t offset,
             struct seen *v)
{
  const uint64_t reach = (uint64_t) REORDER * count;
  const bool repeats = offset >= s->last && offset + count <= s->next;
  bool continues, waits;

  v->in_stream = s->next != UINT64_MAX && !repeats &&
    offset + reach >= s->next && offset <= s->next + reach;
  if (!v->in_stream) {                  /* a new stream, timed anew */
    s->pipelined = false;
    s->run_lo = s->run_hi = 0;
    s->streak = 0;
    __atomic_store_n (&s->latency, UINT64_MAX, __ATOMIC_RELAXED);
  }
  else if (s->streak < STREAK)
    s->streak++;
  v->streaming = s->streak >= STREAK;
  /* A pipelining client's queue runs empty now and then: only a run of
   * reads that each came alone makes a waiting client.
   */
  v->in_flight = __atomic_add_fetch (&s->in_flight, 1, __ATOMIC_RELAXED);
  if (v->in_flight > 1)
    s->alone_run = 0, s->pipelined = true;
  else if (s->alone_run < ALONE_RUN)
    s->alone_run++;
  continues = offset == s->next;
  waits = s->alone_run >= ALONE_RUN && !s->pipelined;
  v->pipelined = s->pipelined;
  s->last = offset;
  s->next = offset + count;
  v->slow = v->in_stream && continues && waits &&
    __atomic_load_n (&s->latency, __ATOMIC_RELAXED) != UINT64_MAX &&
    __atomic_load_n (&s->latency, __ATOMIC_RELAXED) >= PLUGIN_SLOW_NS;
}

/* A direct read of the stream took ns: its fastest decides (one read
 * the scheduler delayed starts no run).  No lock.
 */
static void
stream_timed (struct readahead_stream *s, uint64_t ns)
{
  uint64_t was = __atomic_load_n (&s->latency, __ATOMIC_RELAXED);

  while (ns < was &&
         !__atomic_compare_exchange_n (&s->latency, &was, ns, true,
                                       __ATOMIC_RELAXED, __ATOMIC_RELAXED))
    ;
}

/* A fill of the stream's failed: it starts afresh, a waiting client's
 * once timed again, or every read after would try the same failing
 * fill first.
 */
static void
stream_failed (struct readahead_stream *s)
{
  s->run_lo = s->run_hi = 0;
  __atomic_store_n (&s->latency, UINT64_MAX, __ATOMIC_RELAXED);
}

/* The largest fill: reshape-readahead, within what the pool lends one
 * request, in whole blocks.  No lock.
 */
static uint32_t
fill_cap (const struct geometry *geo)
{
  return ROUND_DOWN (MIN (reshape_cfg.readahead,
                          pool_largest (POOL_REQUEST)), geo->min);
}

/* The grain a read that missed is served from; 0: none, it goes as it
 * is.
 */
static uint32_t
stream_grain (const struct io *io, const struct seen *v, uint32_t count)
{
  const struct geometry *geo = io->geo;
  const uint64_t cap = MIN (MIN (pool_largest (POOL_REQUEST), geo->max),
                            geo->exportsize);
  uint32_t grain = 0;

  if (io->autoexp && (v->streaming || v->slow))
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

/* The stream's next run after its last, recorded: twice as many
 * grains as the last, up to run_cap, reaching at least need, ending
 * no further than run_cap past the read at offset, in whole grains (a
 * run ending inside a grain would split it between two fetches, each
 * paying for all of it).  False if there is nothing to fetch.
 */
static bool
next_run (struct readahead_stream *s, const struct io *io, uint32_t grain,
          uint64_t need, uint64_t offset)
{
  const uint64_t lo = s->run_hi, cap = run_cap (io, grain);
  const uint64_t reach = ROUND_DOWN (offset, grain) + cap;
  uint64_t len = MIN (MAX (ROUND_DOWN (2 * (s->run_hi - s->run_lo), grain),
                           grain), cap);

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

/* Plan the fill for a read that missed and begin it: the read's grain
 * alone where the last run holds it (a read racing that run, or whose
 * grain it did not keep), else the stream's next run, or a new one as
 * long as a run may be.  A read across two grains goes as it is.
 */
static int
plan_begin (struct readahead_cache *c, struct readahead_stream *s,
            const struct io *io, uint32_t grain, uint32_t count,
            uint64_t offset, uint64_t span, struct readahead_range **f)
{
  const uint64_t size = io->geo->exportsize;
  uint64_t lo = ROUND_DOWN (offset, grain), hi = MIN (lo + grain, size);
  const bool run = lo >= s->run_hi;
  int r;

  if (offset + count > lo + grain)
    return NOTHING;
  if (run && s->run_hi > s->run_lo && hi - s->run_hi <= run_cap (io, grain)) {
    if (!next_run (s, io, grain, hi, offset))
      return NOTHING;
  }
  else if (run) {
    s->run_lo = lo;
    s->run_hi = MIN (lo + run_cap (io, grain), size);
  }
  if (run)
    lo = s->run_lo, hi = s->run_hi;
  r = fill_begin (c, lo, hi, io->geo->min, offset, offset + count, span, f);
  if (run) {                    /* the run is what the cache lacked */
    s->run_lo = r == BEGUN ? (*f)->lo : 0;
    s->run_hi = r == BEGUN ? (*f)->hi : 0;
  }
  return r;
}

/* A read served half way or more through the stream's last run, by a
 * client that keeps reads in flight (or over a plugin that serializes
 * requests): the next run is begun, in grains larger than the read.
 */
static struct readahead_range *
ahead_begin (struct readahead_cache *c, struct readahead_stream *s,
             const struct io *io, const struct seen *v, uint32_t count,
             uint64_t offset)
{
  const uint32_t grain = io->autoexp ? auto_published_grain (io->autoexp)
                                     : io->geo->size;
  struct readahead_range *f;

  if (!v->in_stream || v->slow ||
      !(v->pipelined || !(reshape_cfg.parallel_ok ||
                          reshape_debug_ablate & ABLATE_AHEAD)) ||
      grain <= count || grain > pool_largest (POOL_REQUEST) ||
      s->run_hi <= s->run_lo || s->run_hi >= io->geo->exportsize ||
      offset < s->run_lo || offset >= s->run_hi ||
      offset + count <= s->run_lo + (s->run_hi - s->run_lo) / 2 ||
      !next_run (s, io, grain, 0, offset))
    return NULL;
  if (fill_begin (c, s->run_lo, s->run_hi, io->geo->min, s->run_lo,
                  s->run_lo, 0, &f) != BEGUN) {
    s->run_lo = s->run_hi = 0;
    return NULL;
  }
  s->run_lo = f->lo;
  s->run_hi = f->hi;
  return f;
}

/* --- Serving a read. --- */

/* How a read goes, decided under the lock: a read in the stream waits
 * for a fill in progress that holds it; one that misses is served by a
 * fill, or goes down.
 */
enum serve { SERVED, FILL, DOWN, DOWN_TIMED };

static enum serve
readahead_serve (struct readahead_cache *c, struct readahead_stream *s,
       const struct io *io, const struct seen *v, char *buf, uint32_t count,
       uint64_t offset, struct readahead_range **f,
       struct readahead_range **ahead)
{
  const uint64_t span = (uint64_t) (v->in_flight - 1) * count;
  uint32_t grain;

  while (v->in_stream && fill_covers (c, offset, offset + count))
    pthread_cond_wait (&ra.filled, &ra.lock);
  if (range_copy (c, buf, count, offset)) {
    stats_add (C_RA_HITS, 1);
    *ahead = ahead_begin (c, s, io, v, count, offset);
    return SERVED;
  }
  if ((grain = stream_grain (io, v, count)) == 0)
    return DOWN_TIMED;
  if (plan_begin (c, s, io, grain, count, offset, span, f) != BEGUN)
    return DOWN;
  stats_add (C_RA_MISSES, 1);
  return FILL;
}

/* Read the begun fill f, serve [offset, offset+count) into dst from
 * it (dst NULL: nobody's), and end it.
 */
static enum fill_result
fill_read (struct readahead_stream *s, const struct io *io,
           struct readahead_range *f, char *dst, uint32_t count,
           uint64_t offset)
{
  const uint64_t lo = f->lo, hi = f->hi;
  enum fill_result result = FILL_UNMADE;
  char *data = NULL;
  bool kept;
  int err = 0;                  /* the client's is its own read's */

  /* Staged writes there go first; where some stay staged, the fill
   * would keep what the plugin has instead of them.
   */
  if (io->flush_staged (io, lo, hi))
    data = pool_get (POOL_REQUEST, hi - lo);
  if (data) {
    result = FILL_FAILED;
    if (split_pread_as (io, data, hi - lo, lo, true, &err) == 0) {
      result = FILL_KEPT;
      if (dst)
        memcpy (dst, data + (offset - lo), count);
      stats_add (C_RA_FILLED, hi - lo);
    }
  }
  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&ra.lock);
    kept = fill_keep (f, data, data ? hi - lo : 0, result == FILL_KEPT);
    if (result == FILL_KEPT && !kept)
      result = FILL_LOST;
    if (s && result == FILL_FAILED)
      stream_failed (s);
  }
  if (!kept)
    pool_put (POOL_REQUEST, data, hi - lo);
  if (result == FILL_LOST || result == FILL_UNMADE)
    stats_add (C_RA_LOST, 1);
  return result;
}

int
readahead_pread (struct readahead_cache *c, struct readahead_stream *s,
                 const struct io *io, void *buf, uint32_t count,
                 uint64_t offset, struct readahead_range **ahead, int *err)
{
  struct readahead_range *f = NULL;
  struct seen v;
  enum serve how;
  uint64_t start;
  int r = 0;

  *ahead = NULL;
  /* A fixed size's requests: what the plugin wants already.  (Auto's
   * are looked up: a stream's runs may hold a client's large reads.)
   */
  if (count >= io->geo->size && io->autoexp == NULL)
    return READAHEAD_PASS;
  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&ra.lock);
    stream_note (s, count, offset, &v);
    how = readahead_serve (c, s, io, &v, buf, count, offset, &f, ahead);
  }
  if (how == FILL && fill_read (s, io, f, buf, count, offset) > FILL_LOST)
    how = DOWN;                 /* its own read: what failed may not be */
  if (how == DOWN)
    r = split_pread (io, buf, count, offset, err);
  else if (how == DOWN_TIMED) {
    /* A waiting client's grains need the plugin's latency. */
    start = now_ns ();
    r = split_pread (io, buf, count, offset, err);
    if (r == 0)
      stream_timed (s, now_ns () - start);
  }
  __atomic_sub_fetch (&s->in_flight, 1, __ATOMIC_RELAXED);
  return r;
}

void
readahead_fetch_ahead (struct readahead_stream *s, const struct io *io,
                       struct readahead_range *ahead)
{
  if (ahead == NULL)
    return;
  stats_add (C_RA_AHEAD, 1);
  stats_add (C_RA_MISSES, 1);
  fill_read (s, io, ahead, NULL, 0, 0);
}

void
readahead_prefetch (struct readahead_cache *c, const struct io *io,
                    uint32_t count, uint64_t offset)
{
  const struct geometry *geo = io->geo;
  const uint64_t chunk = fill_cap (geo);
  const uint64_t end = MIN (ROUND_UP (offset + count, geo->min),
                            geo->exportsize);
  uint64_t lo = ROUND_DOWN (offset, geo->min);
  struct readahead_range *f;
  int r;

  /* What the cache holds or fills is skipped; the first chunk that
   * cannot be read in (over budget, lost, failed) ends it.
   */
  for (; chunk >= geo->min && lo < end; lo = MIN (lo + chunk, end)) {
    {
      ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&ra.lock);
      r = fill_begin (c, lo, MIN (lo + chunk, end), geo->min, lo, lo, 0, &f);
    }
    if (r == REFUSED)
      return;
    if (r == BEGUN) {
      stats_add (C_RA_CACHED, f->hi - f->lo);
      if (fill_read (NULL, io, f, NULL, 0, 0) != FILL_KEPT)
        return;
    }
  }
}

void
readahead_cache_drop (struct readahead_cache *c)
{
  struct readahead_range **pp = &ra.list;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&ra.lock);

  /* No request of its users is left: it has no fill in progress. */
  while (*pp)
    if ((*pp)->cache == c)
      range_drop (pp);
    else
      pp = &(*pp)->next;
}

void
readahead_invalidate (uint64_t lo, uint64_t hi)
{
  /* A fill is in the list before it reads the plugin: one that could
   * see data older than this write is seen here.
   */
  if (__atomic_load_n (&ra.ranges, __ATOMIC_SEQ_CST) == 0)
    return;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&ra.lock);
  range_forget (NULL, lo, hi);
}

uint64_t
readahead_reclaim (uint64_t want)
{
  uint64_t freed = 0;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&ra.lock);

  while (freed < want && drop_oldest (&freed))
    ;
  return freed;
}
