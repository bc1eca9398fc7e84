/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Helper threads, so that the pieces of one request can run at the same
 * time.  Work is shared, not handed off: the requesting thread always
 * works on its own request too, and helpers join it when they are free.
 * So a request never waits for a helper to become available, and a
 * busy or missing helper only costs parallelism, never progress.
 *
 * Threads start the nbdkit way, after nbdkit forks (after_fork), and
 * stop at cleanup, when no connection is left.
 */

#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <nbdkit-filter.h>

#include "reshape.h"

#define MAX_HELPERS 64

struct job {
  struct share *share;          /* NULL: a detached job */
  void (*fn) (void *opaque);
  void *opaque;
  struct job *next;
};

/* One request's shared work: how many helpers are still on it. */
struct share {
  unsigned running;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work_ready = PTHREAD_COND_INITIALIZER;
static pthread_cond_t work_done = PTHREAD_COND_INITIALIZER;
static struct job *queue_head, **queue_tail = &queue_head;
static pthread_t threads[MAX_HELPERS];
static unsigned nr_threads;
static bool stopping;

static void *
helper (void *arg)
{
  pthread_mutex_lock (&lock);
  for (;;) {
    struct job *j = queue_head;
    if (j == NULL) {
      if (stopping)
        break;
      pthread_cond_wait (&work_ready, &lock);
      continue;
    }
    queue_head = j->next;
    if (queue_head == NULL)
      queue_tail = &queue_head;
    pthread_mutex_unlock (&lock);
    j->fn (j->opaque);
    pthread_mutex_lock (&lock);
    if (j->share) {
      j->share->running--;
      pthread_cond_broadcast (&work_done);
    }
    else
      free (j);
  }
  pthread_mutex_unlock (&lock);
  return NULL;
}

int
reshape_workers_start (unsigned n)
{
  int err;

  if (n > MAX_HELPERS)
    n = MAX_HELPERS;
  stopping = false;
  for (nr_threads = 0; nr_threads < n; nr_threads++) {
    err = pthread_create (&threads[nr_threads], NULL, helper, NULL);
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
reshape_workers_stop (void)
{
  unsigned i;

  pthread_mutex_lock (&lock);
  stopping = true;
  pthread_cond_broadcast (&work_ready);
  pthread_mutex_unlock (&lock);
  for (i = 0; i < nr_threads; i++)
    pthread_join (threads[i], NULL);
  nr_threads = 0;
}

unsigned
reshape_workers_count (void)
{
  return nr_threads;
}

static void
enqueue (struct job *j)
{
  j->next = NULL;
  *queue_tail = j;
  queue_tail = &j->next;
}

/* Remove the jobs of share s that no helper has started yet. */
static void
withdraw (struct share *s)
{
  struct job **pp = &queue_head;

  queue_tail = &queue_head;
  while (*pp) {
    if ((*pp)->share == s) {
      *pp = (*pp)->next;
      s->running--;
    }
    else {
      queue_tail = &(*pp)->next;
      pp = &(*pp)->next;
    }
  }
}

void
reshape_workers_share (void (*fn) (void *), void *opaque, unsigned helpers)
{
  struct job jobs[MAX_HELPERS];
  struct share s = { .running = 0 };
  unsigned i;

  if (helpers > nr_threads)
    helpers = nr_threads;
  pthread_mutex_lock (&lock);
  for (i = 0; i < helpers; i++) {
    jobs[i] = (struct job) { .share = &s, .fn = fn, .opaque = opaque };
    enqueue (&jobs[i]);
    s.running++;
  }
  if (helpers)
    pthread_cond_broadcast (&work_ready);
  pthread_mutex_unlock (&lock);

  fn (opaque);                    /* our own share of the work */

  pthread_mutex_lock (&lock);
  withdraw (&s);
  while (s.running > 0)
    pthread_cond_wait (&work_done, &lock);
  pthread_mutex_unlock (&lock);
}

bool
reshape_workers_submit (void (*fn) (void *), void *opaque)
{
  struct job *j;

  if (nr_threads == 0)
    return false;
  j = malloc (sizeof *j);
  if (j == NULL)
    return false;
  *j = (struct job) { .share = NULL, .fn = fn, .opaque = opaque };
  pthread_mutex_lock (&lock);
  if (stopping) {
    pthread_mutex_unlock (&lock);
    free (j);
    return false;
  }
  enqueue (j);
  pthread_cond_signal (&work_ready);
  pthread_mutex_unlock (&lock);
  return true;
}
