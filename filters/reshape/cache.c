/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * The per-export read cache.  Entries are pool buffers, each holding
 * one contiguous range read by readahead.  The pool decides how much
 * all exports' caches may keep (pool_keep); when requests are short of
 * memory, the pool asks the caches to give some back (cache_shrink).
 *
 * Coherence: every write, zero and trim calls cache_invalidate for its
 * range before it is acknowledged, which drops overlapping entries and
 * marks overlapping fills in progress stale, so data read before the
 * write can never be kept after it.
 */

#include <config.h>

#include <stdlib.h>
#include <string.h>

#include <nbdkit-filter.h>

#include "common.h"
#include "reshape.h"

struct cache_entry {
  uint64_t off;
  uint32_t len;
  char *buf;
  struct cache_entry *next;
};

static uint64_t cached_bytes;          /* all exports, atomic */
static unsigned fills_active;          /* fills in progress, atomic */

/* Could any cache hold, or be about to keep, data?  Lets writes skip
 * the invalidation (and its registry lock) when readahead is idle.  A
 * fill counts from before it reads the plugin, so one that could see
 * data older than a write is always seen here by that write.
 */
bool
cache_anything (void)
{
  return __atomic_load_n (&fills_active, __ATOMIC_SEQ_CST) > 0 ||
    __atomic_load_n (&cached_bytes, __ATOMIC_SEQ_CST) > 0;
}

void
cache_init (struct cache *c)
{
  pthread_mutex_init (&c->lock, NULL);
  c->entries = NULL;
  c->fills = NULL;
}

static void
drop (struct cache_entry **pp)
{
  struct cache_entry *e = *pp;

  *pp = e->next;
  __atomic_sub_fetch (&cached_bytes, e->len, __ATOMIC_SEQ_CST);
  pool_put (POOL_CACHE, e->buf, e->len);
  free (e);
}

void
cache_destroy (struct cache *c)
{
  cache_shrink (c, UINT64_MAX);
  pthread_mutex_destroy (&c->lock);
}

/* The entry holding offset, moved to the front (most recently used). */
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
  bool hit = true;

  pthread_mutex_lock (&c->lock);
  /* Check first, copy second: a miss must not copy a part. */
  for (uint64_t pos = offset; pos < offset + count; ) {
    struct cache_entry *e = find (c, pos);
    if (e == NULL) {
      hit = false;
      break;
    }
    pos = e->off + e->len;
  }
  for (uint64_t pos = offset; hit && pos < offset + count; ) {
    struct cache_entry *e = find (c, pos);
    uint64_t end = e->off + e->len;
    uint32_t n = (end < offset + count ? end : offset + count) - pos;
    memcpy (out + (pos - offset), e->buf + (pos - e->off), n);
    pos += n;
  }
  pthread_mutex_unlock (&c->lock);
  return hit;
}

void
cache_fill_begin (struct cache *c, struct cache_fill *f,
                  uint64_t lo, uint64_t hi)
{
  f->lo = lo;
  f->hi = hi;
  f->stale = false;
  __atomic_add_fetch (&fills_active, 1, __ATOMIC_SEQ_CST);
  pthread_mutex_lock (&c->lock);
  f->next = c->fills;
  c->fills = f;
  pthread_mutex_unlock (&c->lock);
}

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

/* Drop the least recently used entry; false if there is none. */
static bool
drop_oldest (struct cache *c)
{
  struct cache_entry **pp = &c->entries;

  if (*pp == NULL)
    return false;
  while ((*pp)->next)
    pp = &(*pp)->next;
  drop (pp);
  return true;
}

/* The pool's cache share takes the len bytes of a filled window,
 * making room by dropping this export's oldest entries.
 */
static bool
make_room (struct cache *c, uint32_t len)
{
  while (!pool_keep (len))
    if (!drop_oldest (c))
      return false;
  return true;
}

bool
cache_fill_end (struct cache *c, struct cache_fill *f,
                void *buf, uint32_t len, bool ok)
{
  struct cache_fill **pp;
  struct cache_entry *e = NULL;
  bool kept = false;

  pthread_mutex_lock (&c->lock);
  for (pp = &c->fills; *pp != f; pp = &(*pp)->next)
    ;
  *pp = f->next;
  if (ok && !f->stale) {
    forget_range (c, f->lo, f->lo + len);
    e = malloc (sizeof *e);
    if (e && make_room (c, len)) {
      *e = (struct cache_entry) { .off = f->lo, .len = len, .buf = buf,
                                  .next = c->entries };
      c->entries = e;
      __atomic_add_fetch (&cached_bytes, len, __ATOMIC_SEQ_CST);
      kept = true;
    }
    else
      free (e);
  }
  pthread_mutex_unlock (&c->lock);
  __atomic_sub_fetch (&fills_active, 1, __ATOMIC_SEQ_CST);
  return kept;
}

void
cache_invalidate (struct cache *c, uint64_t lo, uint64_t hi)
{
  struct cache_fill *f;

  pthread_mutex_lock (&c->lock);
  forget_range (c, lo, hi);
  for (f = c->fills; f; f = f->next)
    if (f->lo < hi && lo < f->hi)
      f->stale = true;
  pthread_mutex_unlock (&c->lock);
}

uint64_t
cache_shrink (struct cache *c, uint64_t want)
{
  uint64_t freed = 0;
  SCOPED_LOCK (&c->lock);

  while (freed < want && c->entries) {
    struct cache_entry *e = c->entries;
    while (e->next)
      e = e->next;
    freed += e->len;
    drop_oldest (c);
  }
  return freed;
}
