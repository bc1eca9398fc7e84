/* nbdkit-reshape-filter: unit test of split.c's block-range locks.
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Threads take random ranges, shared or exclusive, and while they hold
 * one they mark its units: an exclusive holder must find its units
 * free, a shared holder must find no exclusive holder.  An alarm
 * fails the test if the threads stop making progress (deadlock).
 */

#include <config.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "split.h"

#define UNITS 64
#define THREADS 12
#define ROUNDS 20000

static int excl[UNITS], shared[UNITS];       /* holders per unit, atomic */
static unsigned waits;

static void
broken (const char *what, unsigned lo, unsigned hi)
{
  fprintf (stderr, "unit-rangelock: %s in [%u,%u)\n", what, lo, hi);
  exit (EXIT_FAILURE);
}

static void *
worker (void *arg)
{
  unsigned seed = (unsigned) (uintptr_t) arg, i, u;

  for (i = 0; i < ROUNDS; i++) {
    unsigned lo = rand_r (&seed) % UNITS;
    unsigned hi = lo + 1 + rand_r (&seed) % 8;
    bool exclusive = rand_r (&seed) % 3 == 0;
    struct split_lock e;

    if (hi > UNITS)
      hi = UNITS;
    if (split_lock_blocks (&e, lo, hi, exclusive))
      __atomic_add_fetch (&waits, 1, __ATOMIC_RELAXED);
    for (u = lo; u < hi; u++) {
      if (__atomic_load_n (&excl[u], __ATOMIC_SEQ_CST))
        broken ("two holders, one exclusive,", lo, hi);
      if (exclusive && __atomic_load_n (&shared[u], __ATOMIC_SEQ_CST))
        broken ("an exclusive holder beside shared ones", lo, hi);
      __atomic_add_fetch (exclusive ? &excl[u] : &shared[u], 1,
                          __ATOMIC_SEQ_CST);
    }
    if (rand_r (&seed) % 8 == 0)
      usleep (1);
    for (u = lo; u < hi; u++)
      __atomic_sub_fetch (exclusive ? &excl[u] : &shared[u], 1,
                          __ATOMIC_SEQ_CST);
    split_unlock_blocks (&e);
  }
  return NULL;
}

int
main (int argc, char *argv[])
{
  unsigned seed = argc > 1 ? atoi (argv[1]) : 1, i;
  pthread_t t[THREADS];

  printf ("unit-rangelock: seed %u\n", seed);
  alarm (120);                          /* a deadlock fails the test */
  for (i = 0; i < THREADS; i++)
    if (pthread_create (&t[i], NULL, worker,
                        (void *) (uintptr_t) (seed + i)) != 0)
      broken ("pthread_create failed", 0, 0);
  for (i = 0; i < THREADS; i++)
    pthread_join (t[i], NULL);
  /* Nothing left in the table: a lock over every unit is granted at
   * once (an entry left would hang it, and the alarm fail the test).
   */
  {
    struct split_lock all;
    if (split_lock_blocks (&all, 0, UNITS, true))
      broken ("entries left in the table", 0, UNITS);
    split_unlock_blocks (&all);
  }
  if (waits == 0)
    broken ("nobody ever waited: conflicts untested", 0, UNITS);
  printf ("unit-rangelock: ok, %u threads x %u ranges, %u waits\n",
          THREADS, ROUNDS, waits);
  return EXIT_SUCCESS;
}
