/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * The buffer pool.  Every buffer the filter needs comes from here:
 * page-aligned, sized in powers of 2, kept on free lists when returned
 * so the next request reuses warm memory instead of calling malloc.
 * The total the pool holds (idle and in use) is capped; at the cap a
 * caller waits for a buffer to come back.
 *
 * Why it cannot deadlock: nobody asks for a buffer while holding
 * another one (callers take one buffer at a time and return it before
 * the next), so every buffer in use is returned without waiting.  A
 * request larger than the whole cap is let through, alone, when
 * nothing else is in use.
 */

#include <config.h>

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/mman.h>

#include <nbdkit-filter.h>

#include "reshape.h"

#define MIN_SHIFT 12                    /* 4K, one page */
#define NCLASSES 20                     /* 4K .. 2G */
#define HUGE_PAGE (2 * 1024 * 1024)

struct free_buf {
  struct free_buf *next;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t returned = PTHREAD_COND_INITIALIZER;
static struct free_buf *free_list[NCLASSES];
static uint64_t cap;                    /* reshape-pool */
static uint64_t total;                  /* bytes allocated, idle or not */
static uint64_t idle;                   /* bytes on the free lists */
static unsigned waiters;                /* threads waiting for memory */

void
reshape_pool_init (uint64_t c)
{
  cap = c;
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

/* Give one idle buffer back to the system to make room.  The largest
 * goes first: it frees most room for the fewest lost buffers.
 * Called with the lock held.  Returns false if nothing was idle.
 */
static bool
release_one_idle (void)
{
  int c;

  for (c = NCLASSES - 1; c >= 0; c--) {
    struct free_buf *b = free_list[c];
    if (b) {
      free_list[c] = b->next;
      idle -= class_bytes (c);
      total -= class_bytes (c);
      free (b);
      return true;
    }
  }
  return false;
}

/* Allocate outside the lock; room was reserved in total already.
 * Buffers of 2M and up (readahead windows, big staging blocks) are
 * aligned to and advised into huge pages where the kernel allows:
 * filling a fresh 8M window otherwise takes 2048 page faults, which in
 * a VM cost more than the plugin's reads (naive 4K reader over a 1 ms
 * plugin: 0.86 s, of which 0.67 s is the client's own floor).
 */
static void *
allocate (unsigned c)
{
  const size_t len = class_bytes (c);
  const size_t align = len >= HUGE_PAGE ? HUGE_PAGE : 4096;
  void *p = NULL;
  int r = posix_memalign (&p, align, len);

  if (r != 0) {
    pthread_mutex_lock (&lock);
    total -= class_bytes (c);
    pthread_cond_broadcast (&returned);
    pthread_mutex_unlock (&lock);
    errno = r;
    return NULL;
  }
#ifdef MADV_HUGEPAGE
  if (align == HUGE_PAGE)
    madvise (p, len, MADV_HUGEPAGE);
#endif
  reshape_stats_add (C_POOL_ALLOCS, 1);
  return p;
}

static void *pool_get (uint32_t len, bool wait);

void *
reshape_pool_get (uint32_t len)
{
  return pool_get (len, true);
}

/* For memory kept a long time (staging): never waits, NULL if full. */
void *
reshape_pool_try_get (uint32_t len)
{
  return pool_get (len, false);
}

static void *
pool_get (uint32_t len, bool wait)
{
  const unsigned c = class_of (len);
  const uint64_t want = class_bytes (c);
  bool waited = false;
  uint64_t freed;

  pthread_mutex_lock (&lock);
  for (;;) {
    struct free_buf *b = free_list[c];
    if (b) {
      free_list[c] = b->next;
      idle -= want;
      pthread_mutex_unlock (&lock);
      reshape_stats_add (C_POOL_REUSES, 1);
      return b;
    }
    /* Room under the cap, or alone and oversized: allocate. */
    if (total + want <= cap || total == 0) {
      total += want;
      reshape_stats_max (C_POOL_HIGH, total);
      pthread_mutex_unlock (&lock);
      return allocate (c);
    }
    if (release_one_idle ())
      continue;
    if (!wait) {
      pthread_mutex_unlock (&lock);
      return NULL;
    }
    /* The caches hold memory that they can give back.  Ask them, with
     * the pool unlocked (they return buffers through the pool).
     */
    pthread_mutex_unlock (&lock);
    freed = reshape_export_shrink_caches ();
    pthread_mutex_lock (&lock);
    if (freed)
      continue;
    if (!waited) {
      reshape_stats_add (C_POOL_WAITS, 1);
      if (reshape_debug_pool)
        nbdkit_debug ("reshape: pool: waiting for %" PRIu64 " bytes "
                      "(%" PRIu64 " of %" PRIu64 " in use)",
                      want, total - idle, cap);
      waited = true;
    }
    __atomic_add_fetch (&waiters, 1, __ATOMIC_RELAXED);
    pthread_cond_wait (&returned, &lock);
    __atomic_sub_fetch (&waiters, 1, __ATOMIC_RELAXED);
  }
}

/* Is anybody waiting for memory?  Then nothing should keep any. */
bool
reshape_pool_pressure (void)
{
  return __atomic_load_n (&waiters, __ATOMIC_RELAXED) > 0;
}

void
reshape_pool_put (void *buf, uint32_t len)
{
  const unsigned c = class_of (len);
  struct free_buf *b = buf;

  if (buf == NULL)
    return;
  pthread_mutex_lock (&lock);
  if (total > cap) {
    /* The oversized exception (or a lowered cap): do not keep it. */
    total -= class_bytes (c);
    free (buf);
  }
  else {
    b->next = free_list[c];
    free_list[c] = b;
    idle += class_bytes (c);
  }
  pthread_cond_broadcast (&returned);
  pthread_mutex_unlock (&lock);
}

void
reshape_pool_free_all (void)
{
  pthread_mutex_lock (&lock);
  while (release_one_idle ())
    ;
  pthread_mutex_unlock (&lock);
}
