/* nbdkit-reshape-filter: unit test of pool.c (budgets and the progress
 * guarantee).
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * 1. For caps that are multiples of nothing as well as round ones, the
 *    shares add up to at most the cap less the bounce reserve, and the
 *    largest buffer of each use is within its share.
 * 2. Many threads, small caps, the nesting the filter does: a request
 *    buffer held while bounce buffers come and go (readahead window,
 *    merge buffer), staging pages held long and written back through
 *    bounce buffers, filled windows kept by a cache that gives memory
 *    back when asked.  The pool must never hold more than its cap or
 *    a use more than its share, and every thread must finish: an alarm
 *    fails the test on a deadlock.
 */

#include <config.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "pool.h"
#include "tunables.h"

#define THREADS 16
#define ROUNDS 3000
#define HELD_STAGING 4

static void
fail (const char *what, uint64_t cap)
{
  fprintf (stderr, "unit-pool: cap %llu: %s\n", (unsigned long long) cap,
           what);
  exit (EXIT_FAILURE);
}

static void
check_usage (void)
{
  struct pool_usage u;
  uint64_t level1;

  pool_usage (&u);
  if (u.total > u.cap)
    fail ("the pool holds more than its cap", u.cap);
  level1 = u.used[POOL_REQUEST] + u.used[POOL_CACHE] + u.used[POOL_STAGING];
  if (level1 + BLOCK_MIN_MAX > u.cap && level1 > 0)
    fail ("requests, cache and staging ate into the bounce reserve", u.cap);
  if (u.used[POOL_STAGING] > u.share[POOL_STAGING])
    fail ("staging above its share", u.cap);
  if (u.used[POOL_CACHE] > u.share[POOL_CACHE])
    fail ("the cache above its share", u.cap);
  if (u.used[POOL_REQUEST] + u.used[POOL_CACHE] > u.share[POOL_REQUEST])
    fail ("requests and cache above their share", u.cap);
}

/* The cache of the test: buffers kept, given back on demand. */
struct kept {
  void *buf;
  uint32_t len;
  struct kept *next;
};
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static struct kept *cache;
static unsigned reclaims;

static uint64_t
reclaim (uint64_t want)
{
  uint64_t freed = 0;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&cache_lock);

  __atomic_add_fetch (&reclaims, 1, __ATOMIC_RELAXED);
  while (cache && freed < want) {
    struct kept *k = cache;
    cache = k->next;
    pool_put (POOL_CACHE, k->buf, k->len);
    freed += k->len;
    free (k);
  }
  return freed;
}

static void
bounce (unsigned *seed, uint64_t cap)
{
  uint32_t len = 1 + rand_r (seed) % BLOCK_MIN_MAX;
  char *b = pool_get (POOL_BOUNCE, len);

  if (b == NULL)
    fail ("a bounce buffer failed", cap);
  memset (b, 1, len);                   /* it is really ours */
  check_usage ();
  pool_put (POOL_BOUNCE, b, len);
}

static void
window (unsigned *seed, uint64_t cap)
{
  const uint32_t largest = pool_largest (POOL_REQUEST);
  uint32_t len;
  char *w;
  unsigned i;

  if (largest == 0)
    return;
  len = 1 + rand_r (seed) % largest;
  w = pool_get (POOL_REQUEST, len);
  if (w == NULL)
    return;                             /* the filter reads directly */
  for (i = rand_r (seed) % 3; i > 0; i--)
    bounce (seed, cap);                 /* partial blocks of the window */
  if (rand_r (seed) % 2 && pool_keep (len)) {
    struct kept *k = malloc (sizeof *k);
    if (k == NULL)
      fail ("malloc", cap);
    *k = (struct kept) { .buf = w, .len = len };
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&cache_lock);
    k->next = cache;
    cache = k;
  }
  else
    pool_put (POOL_REQUEST, w, len);
}

struct staged {
  void *buf;
  uint32_t len;
};

static void
stage (unsigned *seed, uint64_t cap, struct staged *held)
{
  unsigned i = rand_r (seed) % HELD_STAGING;
  const uint32_t largest = pool_largest (POOL_STAGING);

  if (held[i].buf) {                    /* write it back, let it go */
    bounce (seed, cap);
    pool_put (POOL_STAGING, held[i].buf, held[i].len);
    held[i].buf = NULL;
  }
  else if (largest) {
    held[i].len = 1 + rand_r (seed) % largest;
    held[i].buf = pool_get (POOL_STAGING, held[i].len);
  }
}

static uint64_t test_cap;

static void *
worker (void *arg)
{
  unsigned seed = (unsigned) (uintptr_t) arg, i;
  struct staged held[HELD_STAGING] = { { NULL } };

  for (i = 0; i < ROUNDS; i++) {
    switch (rand_r (&seed) % 3) {
    case 0: bounce (&seed, test_cap); break;
    case 1: window (&seed, test_cap); break;
    case 2: stage (&seed, test_cap, held); break;
    }
    check_usage ();
  }
  for (i = 0; i < HELD_STAGING; i++)
    if (held[i].buf)
      pool_put (POOL_STAGING, held[i].buf, held[i].len);
  return NULL;
}

static void
shares (uint64_t cap)
{
  struct pool_usage u;
  uint32_t largest, staged;

  pool_init (cap);
  largest = pool_largest (POOL_REQUEST);
  pool_usage (&u);
  if (u.share[POOL_STAGING] + u.share[POOL_REQUEST] + BLOCK_MIN_MAX > cap)
    fail ("the shares add up to more than the cap less the reserve", cap);
  if (u.share[POOL_CACHE] > u.share[POOL_REQUEST])
    fail ("the cache's share is not within the requests'", cap);
  if (pool_largest (POOL_BOUNCE) != BLOCK_MIN_MAX)
    fail ("the bounce reserve is not 64K", cap);
  if (largest && (!is_power_of_2 (largest) ||
                  largest > u.share[POOL_CACHE]))
    fail ("the largest buffer does not fit the requests' shares", cap);
  staged = pool_largest (POOL_STAGING);
  if (staged && (!is_power_of_2 (staged) || staged > largest ||
                 staged > u.share[POOL_STAGING]))
    fail ("the largest staging page does not fit staging", cap);
  if (u.share[POOL_STAGING] > STAGING_MAX)
    fail ("staging is not bounded apart from the cap", cap);
  if (cap == 64 * KiB && largest != 0)
    fail ("a 64K pool lends more than bounce buffers", cap);
}

static void
stress (uint64_t cap, unsigned seed)
{
  pthread_t t[THREADS];
  struct pool_usage u;
  unsigned i;

  test_cap = cap;
  shares (cap);
  for (i = 0; i < THREADS; i++)
    if (pthread_create (&t[i], NULL, worker,
                        (void *) (uintptr_t) (seed + i)) != 0)
      fail ("pthread_create", cap);
  for (i = 0; i < THREADS; i++)
    pthread_join (t[i], NULL);
  reclaim (UINT64_MAX);
  pool_usage (&u);
  for (i = 0; i < POOL_USES; i++)
    if (u.used[i])
      fail ("memory still counted in use after everything came back", cap);
  pool_free_all ();
  pool_usage (&u);
  if (u.total != 0)
    fail ("idle memory not freed", cap);
  printf ("unit-pool: cap %llu: largest %u, %u threads x %u rounds, ok\n",
          (unsigned long long) cap, pool_largest (POOL_REQUEST), THREADS,
          ROUNDS);
}

int
main (int argc, char *argv[])
{
  static const uint64_t caps[] = {
    64 * KiB, 100 * KiB, 128 * KiB, 256 * KiB, 1000000, 1 * MiB,
    3 * MiB, 64 * MiB,
  };
  unsigned seed = argc > 1 ? atoi (argv[1]) : 1, i;

  printf ("unit-pool: seed %u\n", seed);
  alarm (300);                          /* a deadlock fails the test */
  pool_set_reclaim (reclaim);
  for (i = 0; i < sizeof caps / sizeof caps[0]; i++)
    stress (caps[i], seed);
  /* Shares only: staging stays bounded when the cap is huge. */
  shares (1024 * GiB);
  shares (512 * MiB);
  pool_free_all ();
  if (reclaims == 0)
    fail ("the cache was never asked to give memory back", 0);
  printf ("unit-pool: ok, %u reclaims\n", reclaims);
  return EXIT_SUCCESS;
}
