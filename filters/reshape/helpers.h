/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Helper threads, so that the pieces of one request run at once.
 */

#ifndef NBDKIT_RESHAPE_HELPERS_H
#define NBDKIT_RESHAPE_HELPERS_H

/* Start n helpers (after nbdkit forks); -1 with the error reported. */
extern int helpers_start (unsigned n);
/* Stop them (at cleanup, when no connection is left). */
extern void helpers_stop (void);

/* Run fn (opaque) in this thread, and in up to helpers helper threads
 * as they come free; returns when every run has returned.  fn takes
 * its work from opaque until none is left, so that it does not matter
 * how many threads join.
 */
extern void helpers_share (void (*fn) (void *), void *opaque,
                           unsigned helpers);

#endif /* NBDKIT_RESHAPE_HELPERS_H */
