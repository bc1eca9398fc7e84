/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * The per-export read cache.  Entries are pool buffers, each holding
 * one contiguous range read by readahead.  The pool decides how much
 * all caches together may keep (pool_keep); when requests are short of
 * memory, the pool asks the caches to give some back (cache_reclaim).
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

#include "cache.h"
#include "common.h"
#include "pool.h"

struct cache_entry {
  uint64_t off;
  uint32_t len;
  char *buf;
  struct cache_entry *next;
};

struct cache {
  pthread_mutex_t lock;
  pthread_cond_t filled;            /* a fill ended */
  struct cache_entry *entries;      /* most recently used first */
  struct cache_fill *fills;
  struct cache *next;               /* the live list */
};

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
anything (void)
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
drop (struct cache_entry **pp)
{
  struct cache_entry *e = *pp;

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
  drop (pp);
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

bool
cache_read (struct cache *c, uint64_t offset, uint32_t count, void *dst)
{
  char *out = dst;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&c->lock);

  /* Check first, copy second: a miss must not copy a part. */
  for (uint64_t pos = offset; pos < offset + count; ) {
    struct cache_entry *e = find (c, pos);
    if (e == NULL)
      return false;
    pos = e->off + e->len;
  }
  for (uint64_t pos = offset; pos < offset + count; ) {
    struct cache_entry *e = find (c, pos);
    uint32_t n = min_u64 (e->off + e->len, offset + count) - pos;
    memcpy (out + (pos - offset), e->buf + (pos - e->off), n);
    pos += n;
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

bool
cache_wait_fill (struct cache *c, uint64_t lo, uint64_t hi)
{
  bool waited = false;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&c->lock);

  while (covering (c, lo, hi)) {
    waited = true;
    pthread_cond_wait (&c->filled, &c->lock);
  }
  return waited;
}

/* Link f in as a fill of [lo, hi).  Lock held. */
static void
link_fill (struct cache *c, struct cache_fill *f, uint64_t lo, uint64_t hi)
{
  f->lo = lo;
  f->hi = hi;
  f->stale = false;
  __atomic_add_fetch (&live.fills_active, 1, __ATOMIC_SEQ_CST);
  f->next = c->fills;
  c->fills = f;
}

void
cache_fill_begin (struct cache *c, struct cache_fill *f,
                  uint64_t lo, uint64_t hi)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&c->lock);
  link_fill (c, f, lo, hi);
}

bool
cache_fill_begin_unless (struct cache *c, struct cache_fill *f,
                         uint64_t lo, uint64_t hi,
                         uint64_t want_lo, uint64_t want_hi)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&c->lock);

  if (covering (c, want_lo, want_hi))
    return false;
  link_fill (c, f, lo, hi);
  return true;
}

/* Drop every entry overlapping [lo, hi).  Lock held. */
static void
forget_range (struct cache *c, uint64_t lo, uint64_t hi)
{
  struct cache_entry **pp = &c->entries;

  while (*pp) {
    if ((*pp)->off < hi && lo < (*pp)->off + (*pp)->len)
      drop (pp);
    else
      pp = &(*pp)->next;
  }
}

/* The pool's cache share takes the len bytes of a filled window,
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

/* Link f out of the fills in progress, then keep its data if it may. */
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
  if (!ok || f->stale)
    return false;
  forget_range (c, f->lo, f->lo + len);
  e = malloc (sizeof *e);
  if (e == NULL || !make_room (c, len)) {
    free (e);
    return false;
  }
  *e = (struct cache_entry) { .off = f->lo, .len = len, .buf = buf,
                              .next = c->entries };
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

  if (!anything ())             /* the common case without readahead */
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
