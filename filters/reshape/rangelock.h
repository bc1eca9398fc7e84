/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Block-range locks.  A writer that must read-modify-write a block
 * takes its range exclusively; writers of whole blocks take theirs
 * shared.  Requests to unrelated blocks never wait for each other, and
 * no lock is held by the whole filter across I/O.
 */

#ifndef NBDKIT_RESHAPE_RANGELOCK_H
#define NBDKIT_RESHAPE_RANGELOCK_H

#include <stdbool.h>
#include <stdint.h>
#include <pthread.h>

/* One holder or waiter, living on the caller's stack. */
struct rangelock_entry {
  uint64_t lo, hi;                 /* [lo, hi) */
  bool exclusive;
  struct rangelock_entry *prev, *next;
};

/* Entries are kept in arrival order; an entry is granted once no
 * earlier entry (granted or waiting) conflicts with it.  That is fair
 * (no writer starves) and cannot deadlock, since each entry only ever
 * waits for older ones.
 */
/* Initialize statically: { PTHREAD_MUTEX_INITIALIZER,
 * PTHREAD_COND_INITIALIZER }.
 */
struct rangelock {
  pthread_mutex_t lock;            /* guards the list only, never I/O */
  pthread_cond_t changed;
  struct rangelock_entry *head, *tail;
};

/* Returns true if it had to wait. */
extern bool rangelock_acquire (struct rangelock *rl,
                               struct rangelock_entry *e,
                               uint64_t lo, uint64_t hi, bool exclusive);
extern void rangelock_release (struct rangelock *rl,
                               struct rangelock_entry *e);

#endif /* NBDKIT_RESHAPE_RANGELOCK_H */
