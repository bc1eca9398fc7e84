/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Helpers every file may use, as nbdkit's own common/ has them (not
 * installed for filters built outside its tree).  No nbdkit headers:
 * the unit tests use it too.
 */

#ifndef NBDKIT_RESHAPE_COMMON_H
#define NBDKIT_RESHAPE_COMMON_H

#include <assert.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <pthread.h>

#define KiB UINT64_C (1024)
#define MiB (1024 * KiB)
#define GiB (1024 * MiB)

/* On sizes: each argument evaluated once, as a uint64_t; rounding to
 * multiples of any m > 0.  Unique names (__COUNTER__) let them nest.
 */
#define U64_NAME_(base, n) base##n
#define U64_NAME(base, n) U64_NAME_ (base, n)
#define U64_PAIR_(a, b, x, y, expr)                                     \
  ({ const uint64_t x = (a), y = (b); (uint64_t) (expr); })
#define U64_PAIR(a, b, expr_of)                                         \
  expr_of (a, b, U64_NAME (u64_x_, __COUNTER__),                        \
           U64_NAME (u64_y_, __COUNTER__))
#define MIN_(a, b, x, y) U64_PAIR_ (a, b, x, y, x < y ? x : y)
#define MAX_(a, b, x, y) U64_PAIR_ (a, b, x, y, x > y ? x : y)
#define ROUND_DOWN_(v, m, x, y) U64_PAIR_ (v, m, x, y, x - x % y)
#define ROUND_UP_(v, m, x, y)                                           \
  U64_PAIR_ (v, m, x, y, x % y ? x + (y - x % y) : x)
#define MIN(a, b) U64_PAIR (a, b, MIN_)
#define MAX(a, b) U64_PAIR (a, b, MAX_)
#define ROUND_DOWN(v, m) U64_PAIR (v, m, ROUND_DOWN_)
#define ROUND_UP(v, m) U64_PAIR (v, m, ROUND_UP_)

static inline bool
is_power_of_2 (uint64_t v)
{
  return v && (v & (v - 1)) == 0;
}

/* The largest power of 2 not above v (v > 0). */
static inline uint64_t
pow2_floor (uint64_t v)
{
  assert (v > 0);
  return UINT64_C (1) << (63 - __builtin_clzll (v));
}

/* The power of 2 times lo nearest target, from lo up to hi. */
static inline uint64_t
pow2_nearest (uint64_t lo, double target, uint64_t hi)
{
  while (lo < hi && lo * 1.41421356 < target)
    lo *= 2;
  return lo;
}

static inline uint64_t
now_ns (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * UINT64_C (1000000000) + ts.tv_nsec;
}

/* CLEANUP_FREE char *p: freed when p goes out of scope. */
static inline void
free_cleanup (void *ptr)
{
  free (*(void **) ptr);
}
#define CLEANUP_FREE __attribute__ ((cleanup (free_cleanup)))

/* m locked from here to the end of the scope (nbdkit's name). */
static inline pthread_mutex_t *
scoped_lock_take (pthread_mutex_t *m)
{
  pthread_mutex_lock (m);
  return m;
}
static inline void
scoped_lock_release (pthread_mutex_t **m)
{
  pthread_mutex_unlock (*m);
}
#define ACQUIRE_LOCK_FOR_CURRENT_SCOPE(m)                               \
  pthread_mutex_t *U64_NAME (scoped_lock_, __LINE__)                    \
  __attribute__ ((cleanup (scoped_lock_release), unused)) =             \
    scoped_lock_take (m)

#endif /* NBDKIT_RESHAPE_COMMON_H */
