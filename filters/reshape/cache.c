/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Read caches: an export's, or one connection's (reshape.c decides).
 * Entries are pool buffers, each holding one contiguous range a fill
 * read.  The pool decides how much all caches together may keep
 * (pool_keep); when requests are short of memory, the pool asks the
 * caches to give some back (cache_reclaim).
 *
 * The budget (budget.c) is charged for the bytes a fill reads that
 * no read asks for (neither the read that made it nor the reads in
 * flight that missed: they are about to take their bytes), refunded
 * as clients read them, and told of every byte read from the plugin
 * that no client read.
 *
 * Coherence: every write, zero and trim calls cache_invalidate_all for
 * its range before it is acknowledged, which drops overlapping entries
 * and marks overlapping fills in progress stale, so data read before
 * the write can never be kept after it.
 *
 * Locks: the list of live caches has its own lock, taken to create or
 * free a cache and by invalidate_all and reclaim, which then take each
 * cache's lock in turn (always in that order).
 */

#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "budget.h"
#include "cache.h"
#include "common.h"
#include "pool.h"
#include "stats.h"
#include "tunables.h"

/* Fills failed in a row beyond which the back-off grows no more (one
 * fill tried in 256).
 */
#define FAILED_MAX 8

struct cache_entry {
  uint64_t off;
  uint32_t len;
  char *buf;
  struct cache_entry *next;
  uint32_t chunk;                   /* bytes per bit of read[] */
  uint64_t unread;                  /* bytes no client read yet */
  uint64_t charged;                 /* of those, charged to the budget */
  uint64_t read[CACHE_CHUNKS / 64];       /* chunks a client asked for */
};

struct cache {
  pthread_mutex_t lock;
  pthread_cond_t filled;            /* a fill ended */
  struct cache_entry *entries;      /* most recently used first */
  struct cache_fill *fills;
  struct cache_ask *asks;           /* reads that missed, in flight */
  unsigned failed;                  /* fills failed in a row */
  unsigned misses;                  /* fill attempts since */
  bool failing;                     /* a fill ever failed */
  struct cache *next;               /* the live list */
};

/* Mark what a client read of [lo, hi) in e; returns the bytes of the
 * chunks read for the first time.  Lock held.
 */
static uint64_t
mark_read (struct cache_entry *e, uint64_t lo, uint64_t hi)
{
  uint64_t n = 0, i, first, last;

  lo = MAX (lo, e->off);
  hi = MIN (hi, e->off + e->len);
  if (lo >= hi)
    return 0;
  first = (lo - e->off) / e->chunk;
  last = (hi - 1 - e->off) / e->chunk;
  for (i = first; i <= last; i++) {
    const uint64_t bit = UINT64_C (1) << (i % 64);
    if (e->read[i / 64] & bit)
      continue;
    e->read[i / 64] |= bit;
    n += MIN (e->chunk, e->len - i * e->chunk);
  }
  return n;
}

static struct {
  pthread_mutex_t lock;             /* the list, never data */
  struct cache *list;
  uint64_t cached_bytes;            /* atomic */
  unsigned fills_active;            /* atomic */
} live = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* Could any cache hold, or be about to keep, data?  Lets writes skip
 * the invalidation (and its locks) when readahead is idle.  A fill
 * counts from before it reads the plugin, so one that could see data
 * older than a write is always seen here by that write.
 */
static bool
any_cached (void)
{
  return __atomic_load_n (&live.fills_active, __ATOMIC_SEQ_CST) > 0 ||
    __atomic_load_n (&live.cached_bytes, __ATOMIC_SEQ_CST) > 0;
}

struct cache *
cache_new (void)
{
  struct cache *c = calloc (1, sizeof *c);

  if (c == NULL)
    return NULL;
  pthread_mutex_init (&c->lock, NULL);
  pthread_cond_init (&c->filled, NULL);
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&live.lock);
  c->next = live.list;
  live.list = c;
  return c;
}

static void
drop (struct cache *c, struct cache_entry **pp)
{
  struct cache_entry *e = *pp;

  if (e->unread)
    budget_waste (e->unread, e->charged);
  *pp = e->next;
  __atomic_sub_fetch (&live.cached_bytes, e->len, __ATOMIC_SEQ_CST);
  pool_put (POOL_CACHE, e->buf, e->len);
  free (e);
}

/* Drop the least recently used entry; false if there is none.  Lock
 * held, or the cache no longer shared (cache_free).
 */
static bool
drop_oldest (struct cache *c, uint64_t *freed)
{
  struct cache_entry **pp = &c->entries;

  if (*pp == NULL)
    return false;
  while ((*pp)->next)
    pp = &(*pp)->next;
  *freed += (*pp)->len;
  drop (c, pp);
  return true;
}

void
cache_free (struct cache *c)
{
  struct cache **pp;
  uint64_t freed = 0;

  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&live.lock);
    for (pp = &live.list; *pp != c; pp = &(*pp)->next)
      ;
    *pp = c->next;
  }
  while (drop_oldest (c, &freed))
    ;
  pthread_cond_destroy (&c->filled);
  pthread_mutex_destroy (&c->lock);
  free (c);
}

/* The entry holding offset, moved to the front (most recently used).
 * Lock held.
 */
static struct cache_entry *
find (struct cache *c, uint64_t offset)
{
  struct cache_entry **pp, *e;

  for (pp = &c->entries; (e = *pp) != NULL; pp = &e->next) {
    if (e->off <= offset && offset < e->off + e->len) {
      *pp = e->next;
      e->next = c->entries;
      c->entries = e;
      return e;
    }
  }
  return NULL;
}

/* A client read n bytes of e for the first time.  The bytes asked
 * for when it was filled (not charged) are taken first: so the charge
 * is held until the unasked bytes are what is read.
 */
static void
entry_read (struct cache_entry *e, uint64_t n)
{
  const uint64_t asked = e->unread - e->charged;
  uint64_t refund;

  n = MIN (n, e->unread);
  refund = n > asked ? n - asked : 0;
  e->unread -= n;
  e->charged -= refund;
  budget_refund (refund);
}

/* Does c hold [offset, offset+count) whole?  Lock held. */
static bool
holds (struct cache *c, uint64_t offset, uint32_t count)
{
  for (uint64_t pos = offset; pos < offset + count; ) {
    struct cache_entry *e = find (c, pos);
    if (e == NULL)
      return false;
    pos = e->off + e->len;
  }
  return true;
}

/* A fill in progress that covers [lo, hi), or NULL.  Lock held. */
static struct cache_fill *
covering (struct cache *c, uint64_t lo, uint64_t hi)
{
  struct cache_fill *f;

  for (f = c->fills; f; f = f->next)
    if (f->lo <= lo && hi <= f->hi)
      return f;
  return NULL;
}

static void
ask_unlink (struct cache *c, struct cache_ask *ask)
{
  struct cache_ask **pp;

  for (pp = &c->asks; *pp != ask; pp = &(*pp)->next)
    ;
  *pp = ask->next;
  ask->linked = false;
}

bool
cache_lookup (struct cache *c, uint64_t offset, uint32_t count, void *dst,
              struct cache_ask *ask, bool wait)
{
  char *out = dst;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&c->lock);

  while (wait && covering (c, offset, offset + count))
    pthread_cond_wait (&c->filled, &c->lock);
  /* Check first, copy second: a miss must not copy a part. */
  if (!holds (c, offset, count)) {
    if (ask && !ask->linked) {
      ask->lo = offset;
      ask->hi = offset + count;
      ask->linked = true;
      ask->next = c->asks;
      c->asks = ask;
    }
    return false;
  }
  for (uint64_t pos = offset; pos < offset + count; ) {
    struct cache_entry *e = find (c, pos);
    uint32_t n = MIN (e->off + e->len, offset + count) - pos;
    entry_read (e, mark_read (e, pos, pos + n));
    memcpy (out + (pos - offset), e->buf + (pos - e->off), n);
    pos += n;
  }
  return true;
}

void
cache_ask_end (struct cache *c, struct cache_ask *ask)
{
  if (!ask->linked)
    return;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&c->lock);
  ask_unlink (c, ask);
}

/* Narrow [*lo, *hi) to the gap around [read_lo, read_hi) that r, held
 * or being filled, leaves.
 */
static void
gap_narrow (uint64_t r_lo, uint64_t r_hi, uint64_t read_lo,
            uint64_t read_hi, uint64_t *lo, uint64_t *hi)
{
  if (r_hi <= read_lo && r_hi > *lo)
    *lo = r_hi;
  else if (r_lo >= read_hi && r_lo < *hi)
    *hi = r_lo;
}

/* The bytes of [lo, hi) that the read [read_lo, read_hi) and the
 * reads asking cover (the first ASKS_COUNTED of them: beyond, bytes
 * are charged that need not be).  Lock held.
 */
static uint64_t
asked_bytes (const struct cache *c, uint64_t lo, uint64_t hi,
             uint64_t read_lo, uint64_t read_hi, uint64_t expect)
{
  struct { uint64_t lo, hi; } r[ASKS_COUNTED + 1], t;
  const struct cache_ask *a;
  unsigned n = 0, i, j;
  uint64_t bytes = 0, end = lo;

  r[n].lo = read_lo, r[n++].hi = read_hi + expect;
  for (a = c->asks; a && n <= ASKS_COUNTED; a = a->next)
    if (a->lo < hi && lo < a->hi)
      r[n].lo = a->lo, r[n++].hi = a->hi;
  for (i = 1; i < n; i++)                 /* by start: few, mostly sorted */
    for (j = i; j > 0 && r[j].lo < r[j - 1].lo; j--)
      t = r[j], r[j] = r[j - 1], r[j - 1] = t;
  for (i = 0; i < n; i++) {
    const uint64_t from = MAX (MAX (r[i].lo, end), lo);
    const uint64_t to = MIN (r[i].hi, hi);
    if (from < to) {
      bytes += to - from;
      end = to;
    }
  }
  return bytes;
}

/* [*lo, *hi) narrowed to the gap around the read that the cache
 * neither holds nor fills, in whole blocks of align, and at least
 * the read's own blocks [own_lo, own_hi).  Lock held.
 */
static void
to_gap (struct cache *c, uint32_t align, uint64_t read_lo, uint64_t read_hi,
        uint64_t own_lo, uint64_t own_hi, uint64_t *lo, uint64_t *hi)
{
  const struct cache_entry *e;
  const struct cache_fill *f;

  for (e = c->entries; e; e = e->next)
    gap_narrow (e->off, e->off + e->len, read_lo, read_hi, lo, hi);
  for (f = c->fills; f; f = f->next)
    gap_narrow (f->lo, f->hi, read_lo, read_hi, lo, hi);
  *lo = MIN (ROUND_UP (*lo, align), own_lo);
  *hi = MAX (ROUND_DOWN (*hi, align), own_hi);
}

int
cache_fill_begin (struct cache *c, struct cache_fill *f, uint64_t lo,
                  uint64_t hi, uint32_t align, uint64_t read_lo,
                  uint64_t read_hi, uint64_t expect, struct cache_ask *ask)
{
  const uint64_t own_lo = ROUND_DOWN (read_lo, align);
  const uint64_t own_hi = MIN (ROUND_UP (read_hi, align), MAX (hi, read_hi));
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&c->lock);

  if (read_lo < read_hi && covering (c, read_lo, read_hi))
    return 0;
  to_gap (c, align, read_lo, read_hi, own_lo, own_hi, &lo, &hi);
  if (lo == own_lo && hi == own_hi)
    return CACHE_NOTHING;
  /* After n failed fills in a row, one fill in 2^n is tried. */
  if (c->failed && ++c->misses % (1u << c->failed))
    return CACHE_REFUSED;
  f->ask_lo = MIN (MAX (read_lo, lo), hi);
  f->ask_hi = MAX (MIN (read_hi, hi), f->ask_lo);
  /* Over a plugin that fails, a fill is charged whole while it runs:
   * if it fails, what reads asked of it was read for nothing too.
   */
  f->charged = (hi - lo) - (c->failing ? 0 :
                            asked_bytes (c, lo, hi, f->ask_lo, f->ask_hi,
                                         expect));
  if (!budget_charge (f->charged))
    return CACHE_REFUSED;
  if (ask && ask->linked)               /* the fill serves the read */
    ask_unlink (c, ask);
  f->lo = lo;
  f->hi = hi;
  f->stale = false;
  __atomic_add_fetch (&live.fills_active, 1, __ATOMIC_SEQ_CST);
  f->next = c->fills;
  c->fills = f;
  return 1;
}

/* Drop every entry overlapping [lo, hi).  Lock held. */
static void
forget_range (struct cache *c, uint64_t lo, uint64_t hi)
{
  struct cache_entry **pp = &c->entries;

  while (*pp) {
    if ((*pp)->off < hi && lo < (*pp)->off + (*pp)->len)
      drop (c, pp);
    else
      pp = &(*pp)->next;
  }
}

/* The pool's cache share takes the len bytes of a filled run,
 * making room by dropping this cache's oldest entries.  Lock held.
 */
static bool
make_room (struct cache *c, uint32_t len)
{
  uint64_t freed = 0;

  while (!pool_keep (len))
    if (!drop_oldest (c, &freed))
      return false;
  return true;
}

/* An entry for f's data, what its client asked for marked read. */
static struct cache_entry *
entry_new (const struct cache_fill *f, void *buf, uint32_t len)
{
  struct cache_entry *e = calloc (1, sizeof *e);

  if (e == NULL)
    return NULL;
  e->off = f->lo;
  e->len = len;
  e->buf = buf;
  e->chunk = 4096;
  while ((uint64_t) e->chunk * CACHE_CHUNKS < len)
    e->chunk *= 2;
  e->unread = len - mark_read (e, f->ask_lo, f->ask_hi);
  e->charged = MIN (e->unread, f->charged);
  return e;
}

/* Link f out of the fills in progress, then keep its data if it may.
 * Its charge moves to the entry, or is wasted with all it read beyond
 * its read (read for nothing), or refunded (nothing was read).
 */
static bool
keep (struct cache *c, struct cache_fill *f, void *buf, uint32_t len,
      bool ok)
{
  struct cache_fill **pp;
  struct cache_entry *e;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&c->lock);

  for (pp = &c->fills; *pp != f; pp = &(*pp)->next)
    ;
  *pp = f->next;
  pthread_cond_broadcast (&c->filled);
  if (!ok && len == 0) {            /* never read */
    budget_refund (f->charged);
    return false;
  }
  if (!ok) {
    /* What a failed fill read was read for nothing (its read goes down
     * again), and fills back off until one succeeds.
     */
    budget_waste (len, f->charged);
    c->failed = MIN (c->failed + 1, FAILED_MAX);
    c->failing = true;
    return false;
  }
  c->failed = c->misses = 0;
  e = f->stale ? NULL : entry_new (f, buf, len);
  if (e)
    forget_range (c, f->lo, f->lo + len);
  if (e == NULL || !make_room (c, len)) {
    free (e);
    budget_waste (len - (f->ask_hi - f->ask_lo), f->charged);
    return false;
  }
  /* The chunks a client read count whole: the charge may be less. */
  budget_refund (f->charged - e->charged);
  e->next = c->entries;
  c->entries = e;
  __atomic_add_fetch (&live.cached_bytes, len, __ATOMIC_SEQ_CST);
  return true;
}

bool
cache_fill_end (struct cache *c, struct cache_fill *f,
                void *buf, uint32_t len, bool ok)
{
  bool kept = keep (c, f, buf, len, ok);

  __atomic_sub_fetch (&live.fills_active, 1, __ATOMIC_SEQ_CST);
  return kept;
}

void
cache_invalidate_all (uint64_t lo, uint64_t hi)
{
  struct cache *c;

  if (!any_cached ())           /* the common case without readahead */
    return;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&live.lock);
  for (c = live.list; c; c = c->next) {
    struct cache_fill *f;
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&c->lock);

    forget_range (c, lo, hi);
    for (f = c->fills; f; f = f->next)
      if (f->lo < hi && lo < f->hi)
        f->stale = true;
  }
}

uint64_t
cache_reclaim (uint64_t want)
{
  struct cache *c;
  uint64_t freed = 0;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&live.lock);

  for (c = live.list; c && freed < want; c = c->next) {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&c->lock);
    while (freed < want && drop_oldest (c, &freed))
      ;
  }
  return freed;
}
