/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * The buffer pool.  Every buffer the filter needs comes from here:
 * page-aligned, sized in powers of 2, kept on free lists when returned
 * so the next request reuses warm memory instead of calling malloc.
 * The total the pool holds (idle and in use) never exceeds the cap,
 * reshape-pool, and this file alone shares it out:
 *
 *   reserve    BLOCK_MIN_MAX (64K), for bounce buffers only;
 *   staging    a quarter of the rest, at most STAGING_MAX (64M), for
 *              write-back pages: what is acknowledged but not yet in
 *              the plugin stays bounded whatever reshape-pool says;
 *   requests   the other three quarters, for readahead windows being
 *   and cache  and grains being filled, of which the cache may keep
 *              up to two thirds; the cache gives memory back (the
 *              reclaim callback) when requests need it.
 *
 * No single buffer other than a bounce buffer is larger than a quarter
 * of the rest (rounded down to a power of 2): pool_largest tells
 * callers, who size their windows and pages by it.
 *
 * Why no parameter values can deadlock.  Buffers are held while
 * asking for others: a readahead window or a grain, or a
 * staged page being written back, needs a bounce buffer when a piece
 * of it is a partial block.  So:
 *
 *   1. Only POOL_BOUNCE waits.  Every other use takes memory that is
 *      there at once, or goes without: a read is sent directly instead
 *      of read ahead, a write goes through
 *      instead of being staged.
 *   2. A thread holding a bounce buffer asks for nothing else: it
 *      reads, patches and writes one block, and returns the buffer.
 *   3. The other uses together stay within cap - reserve, so at least
 *      the reserve is left to bounce buffers, and no bounce buffer is
 *      larger than the reserve.
 *
 * A bounce request therefore waits only for other bounce buffers,
 * whose holders wait for nothing but the plugin: every wait ends.
 */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#include <nbdkit-filter.h>

#include "common.h"
#include "pool.h"
#include "stats.h"
#include "tunables.h"

NBDKIT_DLL_PUBLIC int reshape_debug_pool;

/* Buffer sizes: powers of 2 from 4K (one page) to 2G. */
enum { MIN_SHIFT = 12, NCLASSES = 20, HUGE_PAGE = 2 * 1024 * 1024 };

struct free_buf {
  struct free_buf *next;
};

static struct {
  pthread_mutex_t lock;
  pthread_cond_t returned;
  struct free_buf *free_list[NCLASSES];
  uint64_t cap;                     /* reshape-pool */
  uint64_t share[POOL_USES];        /* budget of each use */
  uint32_t largest;                 /* largest single non-bounce buffer */
  uint32_t largest_staging;         /* the same, for a staging page */
  uint64_t total;                   /* bytes allocated, idle or not */
  uint64_t idle;                    /* bytes on the free lists */
  uint64_t used[POOL_USES];         /* bytes in use, by use */
  uint64_t (*reclaim) (uint64_t want);
} pool = {
  .lock = PTHREAD_MUTEX_INITIALIZER,
  .returned = PTHREAD_COND_INITIALIZER,
};

void
pool_init (uint64_t cap)
{
  const uint64_t rest = cap > BLOCK_MIN_MAX ? cap - BLOCK_MIN_MAX : 0;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&pool.lock);

  pool.cap = cap;
  pool.share[POOL_BOUNCE] = cap;
  pool.share[POOL_STAGING] = MIN (rest / STAGING_SHARE, STAGING_MAX);
  pool.share[POOL_REQUEST] = rest - pool.share[POOL_STAGING]; /* + cache */
  pool.share[POOL_CACHE] =
    pool.share[POOL_REQUEST] * CACHE_SHARE_NUM / CACHE_SHARE_DEN;
  pool.largest = rest / STAGING_SHARE >= (1 << MIN_SHIFT) ?
    MIN (pow2_floor (rest / STAGING_SHARE), UINT32_MAX / 2 + 1) : 0;
  pool.largest_staging = pool.share[POOL_STAGING] >= (1 << MIN_SHIFT) ?
    MIN (pow2_floor (pool.share[POOL_STAGING]), pool.largest) : 0;
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
  switch (use) {
  case POOL_BOUNCE: return BLOCK_MIN_MAX;
  case POOL_STAGING: return pool.largest_staging;
  default: return pool.largest;
  }
}

static unsigned
alloc_class (uint32_t len)
{
  unsigned c = 0;

  while (((uint64_t) 1 << (c + MIN_SHIFT)) < len)
    c++;
  assert (c < NCLASSES);
  return c;
}

static uint64_t
alloc_bytes (unsigned c)
{
  return (uint64_t) 1 << (c + MIN_SHIFT);
}

static uint64_t
in_use (void)
{
  return pool.total - pool.idle;
}

/* Does want more bytes of use fit its share?  Requests and the cache
 * share one budget.  Lock held.
 */
static bool
share_has_room (enum pool_use use, uint64_t want)
{
  uint64_t used = pool.used[use];

  if (use == POOL_REQUEST)
    used += pool.used[POOL_CACHE];
  return used + want <= pool.share[use];
}

/* Give one idle buffer back to the system to make room.  The largest
 * goes first: it frees most room for the fewest lost buffers.
 * Lock held.  Returns false if nothing was idle.
 */
static bool
release_one_idle (void)
{
  int c;

  for (c = NCLASSES - 1; c >= 0; c--) {
    struct free_buf *b = pool.free_list[c];
    if (b) {
      pool.free_list[c] = b->next;
      pool.idle -= alloc_bytes (c);
      pool.total -= alloc_bytes (c);
      free (b);
      return true;
    }
  }
  return false;
}

/* Allocate outside the lock; room was reserved in pool.total already.
 * Buffers of 2M and up (readahead windows, big staging pages) are
 * aligned to and advised into huge pages where the kernel allows: a
 * fresh 8M window otherwise faults in 2048 pages, which in a VM cost
 * more than the plugin's reads (docs/design.md, The pool).
 */
static void *
allocate (enum pool_use use, unsigned c)
{
  const size_t len = alloc_bytes (c);
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

/* Take a buffer of class c for use if the cap and the use's share
 * allow it now.  Lock held.  Returns the buffer, or NULL with *alloc
 * set when one must be allocated (room is reserved), or NULL with
 * *alloc false when there is no room.
 */
static void *
take (enum pool_use use, unsigned c, bool *alloc)
{
  const uint64_t want = alloc_bytes (c);
  struct free_buf *b;

  *alloc = false;
  if (!share_has_room (use, want))
    return NULL;
  b = pool.free_list[c];
  if (b) {
    pool.free_list[c] = b->next;
    pool.idle -= want;
    pool.used[use] += want;
    stats_add (C_POOL_REUSES, 1);
    return b;
  }
  while (pool.total + want > pool.cap)
    if (!release_one_idle ())
      return NULL;
  pool.total += want;
  pool.used[use] += want;
  stats_max (C_POOL_HIGH, pool.total);
  *alloc = true;
  return NULL;
}

void *
pool_get (enum pool_use use, uint32_t len)
{
  const unsigned c = alloc_class (len);
  bool alloc, waited = false, reclaimed = false;
  void *b;

  assert (use != POOL_CACHE);
  if (len > pool_largest (use)) {
    errno = ENOMEM;
    return NULL;
  }
  pthread_mutex_lock (&pool.lock);    /* dropped to reclaim and wait */
  for (;;) {
    b = take (use, c, &alloc);
    if (b || alloc)
      break;
    if (use == POOL_REQUEST && !reclaimed && pool.reclaim) {
      /* The cache gives back what it keeps (through pool_put); once
       * is enough: if that did not make room, nothing will soon.
       */
      uint64_t (*reclaim) (uint64_t) = pool.reclaim;
      uint64_t freed;

      reclaimed = true;
      pthread_mutex_unlock (&pool.lock);
      freed = reclaim (alloc_bytes (c));
      pthread_mutex_lock (&pool.lock);
      if (freed > 0)
        continue;
    }
    if (use != POOL_BOUNCE)
      break;
    if (!waited) {
      stats_add (C_POOL_WAITS, 1);
      if (reshape_debug_pool)
        nbdkit_debug ("reshape: pool: bounce buffer waits for %" PRIu64
                      " bytes (%" PRIu64 " of %" PRIu64 " in use)",
                      alloc_bytes (c), in_use (), pool.cap);
      waited = true;
    }
    pthread_cond_wait (&pool.returned, &pool.lock);
  }
  pthread_mutex_unlock (&pool.lock);
  if (alloc)
    return allocate (use, c);
  if (b == NULL)
    errno = ENOMEM;
  return b;
}

void
pool_put (enum pool_use use, void *buf, uint32_t len)
{
  const unsigned c = alloc_class (len);
  struct free_buf *b = buf;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&pool.lock);

  if (buf == NULL)
    return;
  assert (pool.used[use] >= alloc_bytes (c));
  pool.used[use] -= alloc_bytes (c);
  b->next = pool.free_list[c];
  pool.free_list[c] = b;
  pool.idle += alloc_bytes (c);
  pthread_cond_broadcast (&pool.returned);
}

bool
pool_keep (uint32_t len)
{
  const uint64_t bytes = alloc_bytes (alloc_class (len));
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&pool.lock);

  /* Requests and the cache share a budget: only the cache's own
   * bound is new to the buffer.
   */
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

  u->cap = pool.cap;
  u->total = pool.total;
  u->idle = pool.idle;
  for (i = 0; i < POOL_USES; i++) {
    u->used[i] = pool.used[i];
    u->share[i] = pool.share[i];
  }
}
