/* nbdkit-reshape-filter: simulated time for tests/unit-sim.
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * The filter's own code runs unchanged in simulated time: every
 * thread is a coroutine on one OS thread, switched only where a real
 * thread would wait (a lock held by another, a condition, a plugin
 * call's cost).  The program links the filter's sources with the
 * linker's --wrap for pthread's locks, conditions and threads and for
 * clock_gettime (sim-sched.c), so what the filter decides from the
 * times it measures is what it would decide on a machine where the
 * plugin and nbdkit cost exactly what the model says, and the client
 * costs nothing.  Runs are deterministic: coroutines that become
 * ready at the same time run in the order they did so.
 */

#ifndef NBDKIT_RESHAPE_SIM_SCHED_H
#define NBDKIT_RESHAPE_SIM_SCHED_H

#include <stdbool.h>
#include <stdint.h>

struct sim_co;

/* A list of coroutines waiting for something. */
struct sim_waitq {
  struct sim_co *head, *tail;
};

/* The simulated time now, in ns. */
extern uint64_t sim_now (void);
/* Start fn (arg) as a coroutine, ready now. */
extern struct sim_co *sim_spawn (void (*fn) (void *), void *arg);
/* The calling coroutine waits ns of simulated time. */
extern void sim_sleep (uint64_t ns);
/* The calling coroutine waits on q until sim_wake_one/all. */
extern void sim_wait (struct sim_waitq *q);
extern bool sim_wake_one (struct sim_waitq *q);
extern void sim_wake_all (struct sim_waitq *q);
/* Run until no coroutine is ready or due; the time they stopped at.
 * *blocked: coroutines left waiting (not finished).
 */
extern uint64_t sim_run (unsigned *blocked);

#endif /* NBDKIT_RESHAPE_SIM_SCHED_H */
