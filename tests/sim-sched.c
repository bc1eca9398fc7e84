/* nbdkit-reshape-filter: simulated time for tests/unit-sim.
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Coroutines (ucontext) on one OS thread, a clock that moves only when
 * every coroutine waits, and pthread's locks, conditions and threads
 * as the filter uses them, rebuilt on them (see sim-sched.h).
 */

#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ucontext.h>

#include "sim-sched.h"

enum { STACK = 256 * 1024, SLOTS = 1 << 16 };

struct sim_co {
  ucontext_t ctx;
  void *stack;
  void (*fn) (void *);
  void *arg;
  void *(*thread_fn) (void *);  /* a pthread's, with its result */
  void *result;
  bool done;
  struct sim_co *next;          /* in the ready list or a wait list */
  struct sim_co *joiner;
};

static struct sim_co main_co;   /* the program outside any coroutine */
static struct sim_co *cur = &main_co;
static ucontext_t sched_ctx;
static struct sim_waitq ready;
static uint64_t now_ns;
static unsigned live;           /* coroutines not finished */

/* Timers: a binary heap by (due, seq). */
struct timer {
  uint64_t due, seq;
  struct sim_co *co;
};
static struct timer *heap;
static size_t heap_len, heap_cap;
static uint64_t timer_seq;

static void
die (const char *what)
{
  fprintf (stderr, "unit-sim: %s\n", what);
  abort ();
}

uint64_t
sim_now (void)
{
  return now_ns;
}

static void
push (struct sim_waitq *q, struct sim_co *co)
{
  co->next = NULL;
  if (q->tail)
    q->tail->next = co;
  else
    q->head = co;
  q->tail = co;
}

static struct sim_co *
pop (struct sim_waitq *q)
{
  struct sim_co *co = q->head;

  if (co) {
    q->head = co->next;
    if (q->head == NULL)
      q->tail = NULL;
  }
  return co;
}

static bool
timer_less (const struct timer *a, const struct timer *b)
{
  return a->due < b->due || (a->due == b->due && a->seq < b->seq);
}

static void
timer_add (uint64_t due, struct sim_co *co)
{
  size_t i;

  if (heap_len == heap_cap) {
    heap_cap = heap_cap ? heap_cap * 2 : 256;
    heap = realloc (heap, heap_cap * sizeof *heap);
    if (heap == NULL)
      die ("out of memory");
  }
  i = heap_len++;
  heap[i] = (struct timer) { .due = due, .seq = timer_seq++, .co = co };
  while (i > 0 && timer_less (&heap[i], &heap[(i - 1) / 2])) {
    struct timer t = heap[i];
    heap[i] = heap[(i - 1) / 2];
    heap[(i - 1) / 2] = t;
    i = (i - 1) / 2;
  }
}

static struct timer
timer_pop (void)
{
  struct timer top = heap[0];
  size_t i = 0;

  heap[0] = heap[--heap_len];
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < heap_len && timer_less (&heap[l], &heap[m]))
      m = l;
    if (r < heap_len && timer_less (&heap[r], &heap[m]))
      m = r;
    if (m == i)
      break;
    struct timer t = heap[i];
    heap[i] = heap[m];
    heap[m] = t;
    i = m;
  }
  return top;
}

/* The running coroutine gives way until something makes it ready. */
static void
block (void)
{
  if (cur == &main_co)
    die ("the program outside the simulation would wait");
  swapcontext (&cur->ctx, &sched_ctx);
}

static void
make_ready (struct sim_co *co)
{
  push (&ready, co);
}

static struct sim_co *starting;

static void
trampoline (void)
{
  struct sim_co *co = starting;

  if (co->thread_fn)
    co->result = co->thread_fn (co->arg);
  else
    co->fn (co->arg);
  co->done = true;
  live--;
  if (co->joiner)
    make_ready (co->joiner);
  swapcontext (&co->ctx, &sched_ctx);
  die ("a finished coroutine ran again");
}

static struct sim_co *
co_new (void)
{
  struct sim_co *co = calloc (1, sizeof *co);

  if (co == NULL || (co->stack = malloc (STACK)) == NULL)
    die ("out of memory");
  getcontext (&co->ctx);
  co->ctx.uc_stack.ss_sp = co->stack;
  co->ctx.uc_stack.ss_size = STACK;
  co->ctx.uc_link = NULL;
  makecontext (&co->ctx, trampoline, 0);
  live++;
  return co;
}

struct sim_co *
sim_spawn (void (*fn) (void *), void *arg)
{
  struct sim_co *co = co_new ();

  co->fn = fn;
  co->arg = arg;
  make_ready (co);
  return co;
}

void
sim_sleep (uint64_t ns)
{
  timer_add (now_ns + ns, cur);
  block ();
}

void
sim_wait (struct sim_waitq *q)
{
  push (q, cur);
  block ();
}

bool
sim_wake_one (struct sim_waitq *q)
{
  struct sim_co *co = pop (q);

  if (co)
    make_ready (co);
  return co != NULL;
}

void
sim_wake_all (struct sim_waitq *q)
{
  while (sim_wake_one (q))
    ;
}

uint64_t
sim_run (unsigned *blocked)
{
  for (;;) {
    struct sim_co *co = pop (&ready);

    if (co == NULL) {
      if (heap_len == 0)
        break;
      struct timer t = timer_pop ();
      now_ns = t.due;
      make_ready (t.co);
      continue;
    }
    starting = co;
    cur = co;
    swapcontext (&sched_ctx, &co->ctx);
    cur = &main_co;
    if (co->done && co->joiner == NULL && co->thread_fn == NULL) {
      free (co->stack);
      free (co);
    }
  }
  *blocked = live;
  return now_ns;
}

/* --- pthread and the clock, as the filter's objects see them. --- */

/* What the simulation knows of a lock or a condition, by address. */
struct sync {
  const void *addr;
  struct sim_co *owner;         /* a lock's */
  struct sim_waitq waiters;
};
static struct sync *table;

static struct sync *
sync_of (const void *addr)
{
  size_t i = ((uintptr_t) addr >> 3) * 2654435761u % SLOTS;

  if (table == NULL && (table = calloc (SLOTS, sizeof *table)) == NULL)
    die ("out of memory");
  for (;; i = (i + 1) % SLOTS) {
    if (table[i].addr == addr)
      return &table[i];
    if (table[i].addr == NULL) {
      table[i].addr = addr;
      return &table[i];
    }
  }
}

static void
sync_reset (const void *addr)
{
  struct sync *s = sync_of (addr);

  if (s->owner || s->waiters.head)
    die ("a lock or condition in use was initialized or destroyed");
}

int
__wrap_pthread_mutex_init (pthread_mutex_t *m, const pthread_mutexattr_t *a)
{
  sync_reset (m);
  return 0;
}

int
__wrap_pthread_mutex_destroy (pthread_mutex_t *m)
{
  sync_reset (m);
  return 0;
}

int
__wrap_pthread_mutex_lock (pthread_mutex_t *m)
{
  struct sync *s = sync_of (m);

  if (s->owner == cur)
    die ("a lock taken twice by one thread");
  if (s->owner == NULL) {
    s->owner = cur;
    return 0;
  }
  sim_wait (&s->waiters);       /* handed over by unlock */
  return 0;
}

int
__wrap_pthread_mutex_trylock (pthread_mutex_t *m)
{
  struct sync *s = sync_of (m);

  if (s->owner)
    return EBUSY;
  s->owner = cur;
  return 0;
}

int
__wrap_pthread_mutex_unlock (pthread_mutex_t *m)
{
  struct sync *s = sync_of (m);

  if (s->owner != cur)
    die ("a lock released by a thread that does not hold it");
  s->owner = pop (&s->waiters);
  if (s->owner)
    make_ready (s->owner);
  return 0;
}

int
__wrap_pthread_cond_init (pthread_cond_t *c, const pthread_condattr_t *a)
{
  sync_reset (c);
  return 0;
}

int
__wrap_pthread_cond_destroy (pthread_cond_t *c)
{
  sync_reset (c);
  return 0;
}

int
__wrap_pthread_cond_wait (pthread_cond_t *c, pthread_mutex_t *m)
{
  struct sync *s = sync_of (c);

  push (&s->waiters, cur);
  __wrap_pthread_mutex_unlock (m);
  block ();
  return __wrap_pthread_mutex_lock (m);
}

int
__wrap_pthread_cond_signal (pthread_cond_t *c)
{
  sim_wake_one (&sync_of (c)->waiters);
  return 0;
}

int
__wrap_pthread_cond_broadcast (pthread_cond_t *c)
{
  sim_wake_all (&sync_of (c)->waiters);
  return 0;
}

int
__wrap_pthread_create (pthread_t *t, const pthread_attr_t *a,
                       void *(*fn) (void *), void *arg)
{
  struct sim_co *co = co_new ();

  co->thread_fn = fn;
  co->arg = arg;
  make_ready (co);
  *t = (pthread_t) co;
  return 0;
}

int
__wrap_pthread_join (pthread_t t, void **result)
{
  struct sim_co *co = (struct sim_co *) t;

  if (!co->done) {
    co->joiner = cur;
    block ();
  }
  if (result)
    *result = co->result;
  free (co->stack);
  free (co);
  return 0;
}

pthread_t
__wrap_pthread_self (void)
{
  return (pthread_t) cur;
}

/* Every clock reads the simulated time (after a second, never 0). */
int
__wrap_clock_gettime (clockid_t clk, struct timespec *ts)
{
  const uint64_t t = now_ns + 1000000000;

  ts->tv_sec = t / 1000000000;
  ts->tv_nsec = t % 1000000000;
  return 0;
}
