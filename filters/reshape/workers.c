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
#define MAX_HELPERS (PARALLEL_MAX - 1)

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

static struct {
  pthread_mutex_t lock;
  pthread_cond_t work_ready;
  pthread_cond_t work_done;
  struct job *head, **tail;
  pthread_t threads[MAX_HELPERS];
  unsigned nr_threads;
  bool stopping;
} w = {
  .lock = PTHREAD_MUTEX_INITIALIZER,
  .work_ready = PTHREAD_COND_INITIALIZER,
  .work_done = PTHREAD_COND_INITIALIZER,
  .tail = &w.head,
};

static void *
helper (void *arg)
{
  pthread_mutex_lock (&w.lock);       /* dropped around each job */
  for (;;) {
    struct job *j = w.head;
    if (j == NULL) {
      if (w.stopping)
        break;
      pthread_cond_wait (&w.work_ready, &w.lock);
      continue;
    }
    w.head = j->next;
    if (w.head == NULL)
      w.tail = &w.head;
    pthread_mutex_unlock (&w.lock);
    j->fn (j->opaque);
    pthread_mutex_lock (&w.lock);
    j->share->running--;
    pthread_cond_broadcast (&w.work_done);
  }
  pthread_mutex_unlock (&w.lock);
  return NULL;
}

int
workers_start (unsigned n)
{
  int err;

  if (n > MAX_HELPERS)
    n = MAX_HELPERS;
  w.stopping = false;
  for (w.nr_threads = 0; w.nr_threads < n; w.nr_threads++) {
    err = pthread_create (&w.threads[w.nr_threads], NULL, helper, NULL);
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
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&w.lock);
    w.stopping = true;
    pthread_cond_broadcast (&w.work_ready);
  }
  for (i = 0; i < w.nr_threads; i++)
    pthread_join (w.threads[i], NULL);
  w.nr_threads = 0;
}

/* Remove the jobs of share s that no helper has started yet.  Lock
 * held.
 */
static void
withdraw (struct share *s)
{
  struct job **pp = &w.head;

  w.tail = &w.head;
  while (*pp) {
    if ((*pp)->share == s) {
      *pp = (*pp)->next;
      s->running--;
    }
    else {
      w.tail = &(*pp)->next;
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
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&w.lock);
    if (helpers > w.nr_threads)
      helpers = w.nr_threads;
    for (i = 0; i < helpers; i++) {
      jobs[i] = (struct job) { .share = &s, .fn = fn, .opaque = opaque };
      *w.tail = &jobs[i];
      w.tail = &jobs[i].next;
      jobs[i].next = NULL;
      s.running++;
    }
    if (helpers)
      pthread_cond_broadcast (&w.work_ready);
  }

  fn (opaque);                    /* our own share of the work */

  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&w.lock);
  withdraw (&s);
  while (s.running > 0)
    pthread_cond_wait (&w.work_done, &w.lock);
}
