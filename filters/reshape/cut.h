/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * reshape-size=auto: where a request is cut (see cut.c).
 */

#ifndef NBDKIT_RESHAPE_CUT_H
#define NBDKIT_RESHAPE_CUT_H

#include <stdbool.h>
#include <stdint.h>

#include "tune.h"

/* One export's choices, cut or whole, by direction and size class. */
struct cut;

/* NULL on failure, with errno set. */
extern struct cut *cut_new (void);
extern void cut_free (struct cut *choices);

/* Where to cut one request of count bytes: cut_begin returns the step
 * (count itself: do not cut), cut_end tells how long the whole request
 * took, so that cutting is kept only where it is measured to be
 * faster.
 */
struct cut_choice {
  int cls;                  /* -1: not a decision worth learning */
  bool cut;                 /* cut (true) or whole */
  uint64_t count;
  uint64_t start_ns;
};
extern uint32_t cut_begin (struct cut *choices, struct tune *t,
                           enum learn_dir d, uint64_t count, uint32_t max,
                           struct cut_choice *c);
extern void cut_end (struct cut *choices, enum learn_dir d,
                     const struct cut_choice *c, bool ok);

/* Where to cut a read the filter makes itself (a window, a run of
 * grains): no client chose its size, so the learnt model alone
 * decides, with no exploring (before it, 2M pieces in parallel).
 * Returns the step; count: whole.
 */
extern uint64_t cut_own (struct cut *choices, struct tune *t, uint64_t count,
                         uint32_t max);

#endif /* NBDKIT_RESHAPE_CUT_H */
