/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 */

#include <config.h>

#include <assert.h>
#include <pthread.h>

#include "common.h"
#include "rangelock.h"

static bool
conflicts (const struct rangelock_entry *a, const struct rangelock_entry *b)
{
  if (!a->exclusive && !b->exclusive)
    return false;
  return a->lo < b->hi && b->lo < a->hi;
}

/* Must e wait?  Only entries older than e count. */
static bool
blocked (const struct rangelock_entry *e)
{
  const struct rangelock_entry *o;

  for (o = e->prev; o != NULL; o = o->prev)
    if (conflicts (o, e))
      return true;
  return false;
}

bool
rangelock_acquire (struct rangelock *rl, struct rangelock_entry *e,
                   uint64_t lo, uint64_t hi, bool exclusive)
{
  bool waited = false;

  assert (lo < hi);
  e->lo = lo;
  e->hi = hi;
  e->exclusive = exclusive;
  e->next = NULL;

  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&rl->lock);
  e->prev = rl->tail;
  if (rl->tail)
    rl->tail->next = e;
  else
    rl->head = e;
  rl->tail = e;
  while (blocked (e)) {
    waited = true;
    pthread_cond_wait (&rl->changed, &rl->lock);
  }
  return waited;
}

void
rangelock_release (struct rangelock *rl, struct rangelock_entry *e)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&rl->lock);

  if (e->prev)
    e->prev->next = e->next;
  else
    rl->head = e->next;
  if (e->next)
    e->next->prev = e->prev;
  else
    rl->tail = e->prev;
  pthread_cond_broadcast (&rl->changed);
}
