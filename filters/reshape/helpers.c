/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Helper threads.  Work is shared, not handed off: the requesting
 * thread always works on its own request too, and helpers join it when
 * they are free.  So a request never waits for a helper to become
 * available, and a busy or missing helper only costs parallelism,
 * never progress.
 *
 * Threads start the nbdkit way, after nbdkit forks (after_fork), and
 * stop at cleanup, when no connection is left.
 */

#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>

#include <nbdkit-filter.h>

#include "common.h"
#include "helpers.h"
#include "tunables.h"

/* The requesting thread works too: one fewer than the fan-out. */
enum { MAX_HELPERS = PARALLEL_MAX - 1 };

/* A helper's share of one request's work, on the requester's stack. */
struct job {
  struct share *share;
  void (*fn) (void *opaque);
  void *opaque;
  struct job *next;
};

/* One request's shared work: how many helpers are still on it. */
struct share {
  unsigned running;
};

/* The helper threads and the jobs they take. */
static struct {
  pthread_mutex_t lock;
  pthread_cond_t work_ready;
  pthread_cond_t work_done;
  struct job *head, **tail;
  pthread_t threads[MAX_HELPERS];
  unsigned nr_threads;
  bool stopping;
} team = {
  .lock = PTHREAD_MUTEX_INITIALIZER,
  .work_ready = PTHREAD_COND_INITIALIZER,
  .work_done = PTHREAD_COND_INITIALIZER,
  .tail = &team.head,
};

static void *
helper (void *arg)
{
  pthread_mutex_lock (&team.lock);       /* dropped around each job */
  for (;;) {
    struct job *j = team.head;
    if (j == NULL) {
      if (team.stopping)
        break;
      pthread_cond_wait (&team.work_ready, &team.lock);
      continue;
    }
    team.head = j->next;
    if (team.head == NULL)
      team.tail = &team.head;
    pthread_mutex_unlock (&team.lock);
    j->fn (j->opaque);
    pthread_mutex_lock (&team.lock);
    j->share->running--;
    pthread_cond_broadcast (&team.work_done);
  }
  pthread_mutex_unlock (&team.lock);
  return NULL;
}

int
helpers_start (unsigned n)
{
  int err;

  if (n > MAX_HELPERS)
    n = MAX_HELPERS;
  team.stopping = false;
  for (team.nr_threads = 0; team.nr_threads < n; team.nr_threads++) {
    err = pthread_create (&team.threads[team.nr_threads], NULL, helper, NULL);
    if (err) {
      errno = err;
      nbdkit_error ("reshape: starting helper thread: %m");
      return -1;
    }
  }
  return 0;
}

/* Called with no connection left, so nothing new is queued. */
void
helpers_stop (void)
{
  unsigned i;

  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&team.lock);
    team.stopping = true;
    pthread_cond_broadcast (&team.work_ready);
  }
  for (i = 0; i < team.nr_threads; i++)
    pthread_join (team.threads[i], NULL);
  team.nr_threads = 0;
}

/* Remove the jobs of share s that no helper has started yet.  Lock
 * held.
 */
static void
withdraw (struct share *s)
{
  struct job **pp = &team.head;

  team.tail = &team.head;
  while (*pp) {
    if ((*pp)->share == s) {
      *pp = (*pp)->next;
      s->running--;
    }
    else {
      team.tail = &(*pp)->next;
      pp = &(*pp)->next;
    }
  }
}

void
helpers_share (void (*fn) (void *), void *opaque, unsigned helpers)
{
  struct job jobs[MAX_HELPERS];
  struct share s = { .running = 0 };
  unsigned i;

  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&team.lock);
    if (helpers > team.nr_threads)
      helpers = team.nr_threads;
    for (i = 0; i < helpers; i++) {
      jobs[i] = (struct job) { .share = &s, .fn = fn, .opaque = opaque };
      *team.tail = &jobs[i];
      team.tail = &jobs[i].next;
      jobs[i].next = NULL;
      s.running++;
    }
    if (helpers)
      pthread_cond_broadcast (&team.work_ready);
  }

  fn (opaque);                    /* our own share of the work */

  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&team.lock);
  withdraw (&s);
  while (s.running > 0)
    pthread_cond_wait (&team.work_done, &team.lock);
}
