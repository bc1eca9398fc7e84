/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Work is shared, not handed off: the requesting thread works on its
 * own request too, and helpers join it when they are free.  So a
 * request never waits for a helper, and a busy one costs parallelism,
 * never progress.
 */

#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>

#include <nbdkit-filter.h>

#include "common.h"
#include "helpers.h"
#include "tunables.h"

/* A helper's share of one request, on the requester's stack. */
struct job {
  void (*fn) (void *opaque);
  void *opaque;
  unsigned *running;            /* the request's helpers on it */
  struct job *next;
};

static struct {
  pthread_mutex_t lock;         /* all below */
  pthread_cond_t ready, done;
  struct job *head, **tail;
  pthread_t threads[PARALLEL_MAX - 1];
  unsigned n;
  bool stopping;
} team = {
  .lock = PTHREAD_MUTEX_INITIALIZER, .ready = PTHREAD_COND_INITIALIZER,
  .done = PTHREAD_COND_INITIALIZER, .tail = &team.head,
};

static void *
helpers_run (void *arg)
{
  struct job *j;

  pthread_mutex_lock (&team.lock);      /* dropped around each job */
  while (!team.stopping || team.head) {
    if ((j = team.head) == NULL) {
      pthread_cond_wait (&team.ready, &team.lock);
      continue;
    }
    if ((team.head = j->next) == NULL)
      team.tail = &team.head;
    pthread_mutex_unlock (&team.lock);
    j->fn (j->opaque);
    pthread_mutex_lock (&team.lock);
    --*j->running;
    pthread_cond_broadcast (&team.done);
  }
  pthread_mutex_unlock (&team.lock);
  return NULL;
}

int
helpers_start (unsigned n)
{
  int err;

  team.stopping = false;
  for (team.n = 0; team.n < MIN (n, PARALLEL_MAX - 1); team.n++)
    if ((err = pthread_create (&team.threads[team.n], NULL, helpers_run,
                               NULL)) != 0) {
      errno = err;
      nbdkit_error ("reshape: starting helper thread: %m");
      return -1;
    }
  return 0;
}

void
helpers_stop (void)
{
  unsigned i;

  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&team.lock);
    team.stopping = true;
    pthread_cond_broadcast (&team.ready);
  }
  for (i = 0; i < team.n; i++)
    pthread_join (team.threads[i], NULL);
  team.n = 0;
}

void
helpers_share (void (*fn) (void *), void *opaque, unsigned helpers)
{
  struct job jobs[PARALLEL_MAX - 1], **pp;
  unsigned running = 0, i;

  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&team.lock);
    for (i = 0; i < MIN (helpers, team.n); i++) {
      jobs[i] = (struct job) { .fn = fn, .opaque = opaque,
                               .running = &running };
      *team.tail = &jobs[i];
      team.tail = &jobs[i].next;
      running++;
    }
    if (running)
      pthread_cond_broadcast (&team.ready);
  }
  fn (opaque);                  /* our own share of the work */
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&team.lock);
  /* The jobs no helper has taken yet are withdrawn: the work is done. */
  for (pp = &team.head, team.tail = &team.head; *pp; )
    if ((*pp)->running == &running) {
      *pp = (*pp)->next;
      running--;
    }
    else {
      team.tail = &(*pp)->next;
      pp = &(*pp)->next;
    }
  while (running > 0)
    pthread_cond_wait (&team.done, &team.lock);
}
