/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * reshape-size=auto: the probe (see probe.c).
 */

#ifndef NBDKIT_RESHAPE_PROBE_H
#define NBDKIT_RESHAPE_PROBE_H

#include <nbdkit-filter.h>

#include "tune.h"
#include "walk.h"

/* What the first connection to an export learns by timed reads of
 * growing sizes (later connections wait for it and reuse it), unless
 * a profile (profile_load) already told.  A plugin too slow to hold
 * the handshake for that is probed beside the connections, in a thread
 * reading through this connection's next, and connections made
 * meanwhile keep the static sizes; lender (the connection; NULL:
 * never beside) must call probe_release before next is gone.  Never
 * fails: a plugin that cannot be measured keeps the static guesses.
 */
extern void probe_start (struct tune *t, nbdkit_next *next,
                         const struct geometry *geo, const void *lender);

/* The connection lender is ending: a probe reading through its next
 * stops at its next read (nothing is learnt; the next connection
 * probes again), and its thread is joined.
 */
extern void probe_release (struct tune *t, const void *lender);

/* The filter is unloading: every probe still beside the connections
 * stops (at its next read) and is joined, before what it uses is
 * freed.  Its connection should have closed first (probe_release), but
 * the thread must not outlive the filter if one did not.
 */
extern void probe_stop_all (void);

#endif /* NBDKIT_RESHAPE_PROBE_H */
