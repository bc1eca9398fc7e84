/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * reshape-size=auto: what the filter learns of each export's plugin,
 * and the sizes it picks from that.
 */

#ifndef NBDKIT_RESHAPE_TUNE_H
#define NBDKIT_RESHAPE_TUNE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <nbdkit-filter.h>

#include "walk.h"

/* A plugin call answered faster than this (memory, a file in the page
 * cache) has no latency worth hiding: neither helper threads
 * (split.c) nor readahead (readahead.c) pay for themselves there, and
 * the probe stops at once.
 */
#define PLUGIN_SLOW_NS (50 * 1000)

enum tune_dir { TUNE_READ, TUNE_WRITE, TUNE_DIRS };

/* One export's learning.  Kept, by export name, until the filter is
 * unloaded: a client that reconnects finds what the last one taught.
 */
struct tune;

/* The export's learning; NULL with the error reported. */
extern struct tune *tune_get (const char *exportname);
extern void tune_free_all (void);

/* What the first connection to an export learns by timed reads of
 * growing sizes (later connections wait for it and reuse it), unless
 * a profile (tune_load) already told.  A plugin too slow to hold the
 * handshake for that is probed beside the connections, in a thread
 * reading through this connection's next, and connections made
 * meanwhile keep the static sizes; lender (the connection; NULL:
 * never beside) must call tune_release before next is gone.  Never
 * fails: a plugin that cannot be measured keeps the static guesses.
 */
extern void tune_probe (struct tune *t, nbdkit_next *next,
                        const struct geometry *geo, const void *lender);

/* The connection lender is ending: a probe reading through its next
 * stops at its next read (nothing is learnt; the next connection
 * probes again), and its thread is joined.
 */
extern void tune_release (struct tune *t, const void *lender);

/* The sizes picked for a connection with this geometry: the size told
 * to clients as preferred, the unit that writes are staged in and
 * reads are fetched in, and the smallest piece a request may be cut
 * into.  0: no opinion (the static guesses stand).
 */
struct tune_sizes {
  uint32_t preferred;
  uint32_t unit;
  uint32_t grain;           /* cost is flat up to here: never cut below */
};
extern void tune_sizes (struct tune *t, struct tune_sizes *s);
/* Those a new connection starts with: tune_sizes, or while the probe
 * goes on beside the connections, a preferred size only.
 */
extern void tune_start_sizes (struct tune *t, struct tune_sizes *s);

/* The filter calls the plugin (for a client, a readahead, a
 * write-back), and the call is done: while any is in flight, a
 * probe's slow read may have waited behind it.
 */
extern void tune_plugin_begin (void);
extern void tune_plugin_end (void);

/* A plugin call of bytes took ns (split.c times every piece). */
extern void tune_record (struct tune *t, enum tune_dir d, uint64_t bytes,
                         uint64_t ns);

/* Where to cut one request of count bytes: tune_cut_begin returns the
 * step (count itself: do not cut), tune_cut_end tells how long the
 * whole request took, so that cutting is kept only where it is
 * measured to be faster.
 */
struct tune_choice {
  int cls;                  /* -1: not a decision worth learning */
  bool cut;                 /* cut (true) or whole */
  uint64_t count;
  uint64_t start_ns;
};
extern uint32_t tune_cut_begin (struct tune *t, enum tune_dir d,
                                uint64_t count, uint32_t max,
                                struct tune_choice *c);
extern void tune_cut_end (struct tune *t, enum tune_dir d,
                          const struct tune_choice *c, bool ok);

/* Where to cut a read the filter makes itself (a readahead window or
 * a grain fetch): no client chose its size, so the model alone
 * decides, with no exploration.  Returns the step; count: whole.
 */
extern uint64_t tune_cut_model (struct tune *t, uint64_t count,
                                uint32_t max);

/* The learnt tables and the choices made, with their reasons, of
 * every export (the statistics report).
 */
extern void tune_report (FILE *fp);

/* reshape-profile=FILE: what was learnt of each export, kept across
 * restarts.  tune_load reads it at start-up (a missing file is made
 * later; a corrupt or foreign one is ignored with a warning); -1 only
 * if it cannot be read at all.  tune_save writes it (atomically) after
 * every probe and at exit.
 */
extern int tune_load (const char *file);
extern void tune_save (void);

#endif /* NBDKIT_RESHAPE_TUNE_H */
