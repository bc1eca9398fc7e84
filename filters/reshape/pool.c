/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Buffers are page-aligned powers of 2, kept on free lists when
 * returned, so that the next request reuses warm memory instead of
 * calling malloc.  What the pool holds, idle or in use, never exceeds
 * reshape-pool, shared out here alone:
 *
 *   reserve    BLOCK_MIN_MAX, for bounce buffers only;
 *   staging    1/STAGING_SHARE of the rest, at most STAGING_MAX, so
 *              that what is acknowledged but not in the plugin stays
 *              bounded;
 *   requests   the rest, for fills, of which the cache may keep
 *              CACHE_SHARE_NUM/DEN; the cache gives memory back (the
 *              reclaim callback) when fills need it.
 *
 * No buffer but a bounce buffer is larger than a quarter of the rest.
 *
 * Why no parameter value can deadlock: only bounce buffers wait; every
 * other use takes memory that is there or goes without (a read goes
 * direct, a write through).  A thread holding a bounce buffer asks
 * for nothing else, and the other uses stay within the cap less the
 * reserve, which is no smaller than a bounce buffer.  So a bounce
 * buffer waits only for others, whose holders wait only for the
 * plugin.
 */

#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#include <nbdkit-filter.h>

#include "common.h"
#include "pool.h"
#include "stats.h"
#include "tunables.h"

/* Buffer sizes: powers of 2 from 4K to 2G. */
enum { MIN_SHIFT = 12, NCLASSES = 20, HUGE_PAGE = 2 * 1024 * 1024 };

struct free_buf {
  struct free_buf *next;
};

static struct {
  pthread_mutex_t lock;             /* all below */
  pthread_cond_t returned;
  struct free_buf *free_list[NCLASSES];
  uint64_t cap;
  uint64_t share[POOL_USES];
  uint32_t largest[POOL_USES];
  uint64_t total;                   /* allocated, idle or not */
  uint64_t idle;                    /* on the free lists */
  uint64_t used[POOL_USES];
  uint64_t (*reclaim) (uint64_t want);
} pool = {
  .lock = PTHREAD_MUTEX_INITIALIZER, .returned = PTHREAD_COND_INITIALIZER,
};

void
pool_init (uint64_t cap)
{
  const uint64_t rest = cap > BLOCK_MIN_MAX ? cap - BLOCK_MIN_MAX : 0;
  const uint64_t quarter = rest / STAGING_SHARE;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&pool.lock);

  pool.cap = cap;
  pool.share[POOL_BOUNCE] = cap;
  pool.share[POOL_STAGING] = MIN (quarter, STAGING_MAX);
  pool.share[POOL_REQUEST] = rest - pool.share[POOL_STAGING];
  pool.share[POOL_CACHE] =
    pool.share[POOL_REQUEST] * CACHE_SHARE_NUM / CACHE_SHARE_DEN;
  pool.largest[POOL_BOUNCE] = BLOCK_MIN_MAX;
  pool.largest[POOL_REQUEST] = pool.largest[POOL_CACHE] =
    quarter >= 1 << MIN_SHIFT ? MIN (pow2_floor (quarter), UINT32_MAX / 2 + 1)
                              : 0;
  pool.largest[POOL_STAGING] =
    pool.share[POOL_STAGING] >= 1 << MIN_SHIFT ?
    MIN (pow2_floor (pool.share[POOL_STAGING]), pool.largest[POOL_REQUEST])
    : 0;
}

void
pool_set_reclaim (uint64_t (*reclaim) (uint64_t want))
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&pool.lock);
  pool.reclaim = reclaim;
}

uint32_t
pool_largest (enum pool_use use)
{
  return pool.largest[use];
}

static unsigned
class_of (uint32_t len)
{
  unsigned c = 0;

  while (((uint64_t) 1 << (c + MIN_SHIFT)) < len)
    c++;
  assert (c < NCLASSES);
  return c;
}

static uint64_t
class_bytes (unsigned c)
{
  return (uint64_t) 1 << (c + MIN_SHIFT);
}

/* Give the largest idle buffer back to the system: it frees most room
 * for the fewest lost buffers.  False if none is idle.
 */
static bool
release_one_idle (void)
{
  int c;

  for (c = NCLASSES - 1; c >= 0; c--) {
    struct free_buf *b = pool.free_list[c];
    if (b) {
      pool.free_list[c] = b->next;
      pool.idle -= class_bytes (c);
      pool.total -= class_bytes (c);
      free (b);
      return true;
    }
  }
  return false;
}

/* A buffer of class c for use if its share and the cap allow it now:
 * an idle one, or NULL with *alloc set (room reserved: allocate it
 * outside the lock), or NULL.  Requests and the cache share a share.
 */
static void *
pool_take (enum pool_use use, unsigned c, bool *alloc)
{
  const uint64_t want = class_bytes (c);
  const uint64_t used = pool.used[use] +
    (use == POOL_REQUEST ? pool.used[POOL_CACHE] : 0);
  struct free_buf *b = pool.free_list[c];

  *alloc = false;
  if (used + want > pool.share[use])
    return NULL;
  pool.used[use] += want;
  if (b) {
    pool.free_list[c] = b->next;
    pool.idle -= want;
    stats_add (C_POOL_REUSES, 1);
    return b;
  }
  while (pool.total + want > pool.cap)
    if (!release_one_idle ()) {
      pool.used[use] -= want;
      return NULL;
    }
  pool.total += want;
  stats_max (C_POOL_HIGH, pool.total);
  *alloc = true;
  return NULL;
}

/* Buffers of 2M and up are aligned to and advised into huge pages: a
 * fresh 8M fill otherwise faults in 2048 pages, which in a VM cost
 * more than the plugin's reads (docs/design.md, The pool).
 */
static void *
pool_allocate (enum pool_use use, unsigned c)
{
  const size_t len = class_bytes (c);
  const size_t align = len >= HUGE_PAGE ? HUGE_PAGE : 4096;
  void *p = NULL;
  int r = posix_memalign (&p, align, len);

  if (r != 0) {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&pool.lock);
    pool.total -= len;
    pool.used[use] -= len;
    pthread_cond_broadcast (&pool.returned);
    errno = r;
    return NULL;
  }
#ifdef MADV_HUGEPAGE
  if (align == HUGE_PAGE)
    madvise (p, len, MADV_HUGEPAGE);
#endif
  stats_add (C_POOL_ALLOCS, 1);
  return p;
}

void *
pool_get (enum pool_use use, uint32_t len)
{
  const unsigned c = class_of (len);
  bool alloc, waited = false, reclaimed = false;
  uint64_t (*reclaim) (uint64_t);
  void *b;

  assert (use != POOL_CACHE);
  if (len > pool_largest (use)) {
    errno = ENOMEM;
    return NULL;
  }
  pthread_mutex_lock (&pool.lock);      /* dropped to reclaim and wait */
  while ((b = pool_take (use, c, &alloc)) == NULL && !alloc) {
    if (use == POOL_REQUEST && !reclaimed && (reclaim = pool.reclaim)) {
      /* Once: if what the cache gave back did not make room, nothing
       * will soon.
       */
      reclaimed = true;
      pthread_mutex_unlock (&pool.lock);
      const uint64_t freed = reclaim (class_bytes (c));
      pthread_mutex_lock (&pool.lock);
      if (freed > 0)
        continue;
    }
    if (use != POOL_BOUNCE)
      break;
    if (!waited)
      stats_add (C_POOL_WAITS, 1);
    waited = true;
    pthread_cond_wait (&pool.returned, &pool.lock);
  }
  pthread_mutex_unlock (&pool.lock);
  if (alloc)
    return pool_allocate (use, c);
  if (b == NULL)
    errno = ENOMEM;
  return b;
}

void
pool_put (enum pool_use use, void *buf, uint32_t len)
{
  struct free_buf *b = buf;
  unsigned c;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&pool.lock);

  if (buf == NULL)
    return;
  c = class_of (len);
  assert (pool.used[use] >= class_bytes (c));
  pool.used[use] -= class_bytes (c);
  b->next = pool.free_list[c];
  pool.free_list[c] = b;
  pool.idle += class_bytes (c);
  pthread_cond_broadcast (&pool.returned);
}

bool
pool_keep (uint32_t len)
{
  const uint64_t bytes = class_bytes (class_of (len));
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&pool.lock);

  if (pool.used[POOL_CACHE] + bytes > pool.share[POOL_CACHE])
    return false;
  pool.used[POOL_REQUEST] -= bytes;
  pool.used[POOL_CACHE] += bytes;
  return true;
}

void
pool_free_all (void)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&pool.lock);

  while (release_one_idle ())
    ;
}

void
pool_usage (struct pool_usage *u)
{
  unsigned i;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&pool.lock);

  *u = (struct pool_usage) { .cap = pool.cap, .total = pool.total,
                             .idle = pool.idle };
  for (i = 0; i < POOL_USES; i++) {
    u->used[i] = pool.used[i];
    u->share[i] = pool.share[i];
  }
}
