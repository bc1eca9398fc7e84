/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Small helpers every file may use: arithmetic on sizes, cleanup
 * attributes and scoped locks, the clock.  No nbdkit headers, so that
 * the unit tests can use it too.  (nbdkit's own common/ directory
 * holds similar helpers, but it is not installed for filters built
 * outside its tree.)
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

/* MIN, MAX, ROUND_DOWN and ROUND_UP on sizes, as nbdkit's own
 * common/include has them (macros, so that they cost a reader no
 * detour): each argument is evaluated once, then converted to
 * uint64_t (arithmetic inside an argument is done in its own type, as
 * for a function's argument).  Rounding
 * is to multiples of m (m > 0, any value, not only powers of 2).
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
  uint64_t p = 1;

  assert (v > 0);
  while (p <= v / 2)
    p *= 2;
  return p;
}

/* The power of 2 times lo nearest target, from lo up to hi. */
static inline uint64_t
pow2_nearest (uint64_t lo, double target, uint64_t hi)
{
  uint64_t p = lo;

  while (p < hi && p * 1.41421356 < target)
    p *= 2;
  return p;
}

static inline uint64_t
now_ns (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * UINT64_C (1000000000) + ts.tv_nsec;
}

/* CLEANUP_FREE char *p = malloc (...): freed when p goes out of scope. */
static inline void
free_cleanup (void *ptr)
{
  free (*(void **) ptr);
}
#define CLEANUP_FREE __attribute__ ((cleanup (free_cleanup)))

/* ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&m): m is locked from here to the
 * end of the scope (the name nbdkit's own sources use for the same
 * thing).  Functions that drop and retake a lock inside one scope use
 * explicit pthread_mutex_lock/unlock instead, and say so.
 */
static inline pthread_mutex_t *
scoped_lock_take (pthread_mutex_t *m)
{
  int r = pthread_mutex_lock (m);

  assert (r == 0);
  return m;
}
static inline void
scoped_lock_release (pthread_mutex_t **m)
{
  int r = pthread_mutex_unlock (*m);

  assert (r == 0);
}
#define SCOPED_LOCK_NAME_(line) scoped_lock_##line
#define SCOPED_LOCK_NAME(line) SCOPED_LOCK_NAME_ (line)
#define ACQUIRE_LOCK_FOR_CURRENT_SCOPE(m)                               \
  pthread_mutex_t *SCOPED_LOCK_NAME (__LINE__)                          \
  __attribute__ ((cleanup (scoped_lock_release), unused)) =             \
    scoped_lock_take (m)

#endif /* NBDKIT_RESHAPE_COMMON_H */
