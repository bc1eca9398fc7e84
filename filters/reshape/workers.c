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
#include "params.h"
#include "workers.h"

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
} crew = {
  .lock = PTHREAD_MUTEX_INITIALIZER,
  .work_ready = PTHREAD_COND_INITIALIZER,
  .work_done = PTHREAD_COND_INITIALIZER,
  .tail = &crew.head,
};

static void *
helper (void *arg)
{
  pthread_mutex_lock (&crew.lock);       /* dropped around each job */
  for (;;) {
    struct job *j = crew.head;
    if (j == NULL) {
      if (crew.stopping)
        break;
      pthread_cond_wait (&crew.work_ready, &crew.lock);
      continue;
    }
    crew.head = j->next;
    if (crew.head == NULL)
      crew.tail = &crew.head;
    pthread_mutex_unlock (&crew.lock);
    j->fn (j->opaque);
    pthread_mutex_lock (&crew.lock);
    j->share->running--;
    pthread_cond_broadcast (&crew.work_done);
  }
  pthread_mutex_unlock (&crew.lock);
  return NULL;
}

int
workers_start (unsigned n)
{
  int err;

  if (n > MAX_HELPERS)
    n = MAX_HELPERS;
  crew.stopping = false;
  for (crew.nr_threads = 0; crew.nr_threads < n; crew.nr_threads++) {
    err = pthread_create (&crew.threads[crew.nr_threads], NULL, helper, NULL);
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
workers_stop (void)
{
  unsigned i;

  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&crew.lock);
    crew.stopping = true;
    pthread_cond_broadcast (&crew.work_ready);
  }
  for (i = 0; i < crew.nr_threads; i++)
    pthread_join (crew.threads[i], NULL);
  crew.nr_threads = 0;
}

/* Remove the jobs of share s that no helper has started yet.  Lock
 * held.
 */
static void
withdraw (struct share *s)
{
  struct job **pp = &crew.head;

  crew.tail = &crew.head;
  while (*pp) {
    if ((*pp)->share == s) {
      *pp = (*pp)->next;
      s->running--;
    }
    else {
      crew.tail = &(*pp)->next;
      pp = &(*pp)->next;
    }
  }
}

void
workers_share (void (*fn) (void *), void *opaque, unsigned helpers)
{
  struct job jobs[MAX_HELPERS];
  struct share s = { .running = 0 };
  unsigned i;

  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&crew.lock);
    if (helpers > crew.nr_threads)
      helpers = crew.nr_threads;
    for (i = 0; i < helpers; i++) {
      jobs[i] = (struct job) { .share = &s, .fn = fn, .opaque = opaque };
      *crew.tail = &jobs[i];
      crew.tail = &jobs[i].next;
      jobs[i].next = NULL;
      s.running++;
    }
    if (helpers)
      pthread_cond_broadcast (&crew.work_ready);
  }

  fn (opaque);                    /* our own share of the work */

  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&crew.lock);
  withdraw (&s);
  while (s.running > 0)
    pthread_cond_wait (&crew.work_done, &crew.lock);
}
