/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * reshape-size=auto: what the filter learns of each export's plugin
 * from the clients' own traffic, and the sizes it picks from that.
 * learn.c decides; tune.c keeps one export's learning under a lock,
 * and export.c keeps it for the export's name.  struct tune is
 * tune.c's alone; the rest of the filter goes through these
 * functions.
 */

#ifndef NBDKIT_RESHAPE_TUNE_H
#define NBDKIT_RESHAPE_TUNE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "learn.h"
#include "tunables.h"
#include "walk.h"

/* -D reshape.tune=1: every change of what is known. */
extern int reshape_debug_tune;

struct tune;

/* The learning of the export named name, nothing learnt yet; name is
 * borrowed, and must outlive the learning.  NULL with errno set.
 */
extern struct tune *tune_new (const char *name);
extern void tune_free (struct tune *t);
extern const char *tune_name (const struct tune *t);

/* A walk over the learning of every export remembered (export_each):
 * fn on each, the registry's lock held.
 */
typedef void tune_visit (struct tune *t, void *opaque);
typedef void tune_walk (tune_visit *fn, void *opaque);

/* A connection to the export settled its geometry.  What was learnt
 * on another geometry (the plugin changed under the same name) is
 * forgotten.
 */
extern void tune_connect (struct tune *t, const struct geometry *geo);

/* What was learnt (false: nothing yet), for a profile to keep, and
 * what a profile kept, taken as learnt if nothing is yet.
 */
extern bool tune_get_learnt (struct tune *t, struct geometry *geo,
                             struct learnt *l);
extern void tune_teach (struct tune *t, const struct learnt *l);
/* Bumped whenever what is learnt changes (a profile saves then). */
extern unsigned tune_generation (void);

extern void tune_get_sizes (struct tune *t, struct learn_sizes *s);
/* Learnt to have no latency: nothing the filter could read ahead,
 * fetch or cut for it pays, nor timing its calls.  Without a lock,
 * like tune_grain: every request asks.
 */
extern bool tune_fast (struct tune *t);
/* The learnt grain (0: none). */
extern uint32_t tune_grain (struct tune *t);
/* The model requests are cut by: 1 with *m set; 0 if nothing is
 * learnt yet; -1 if the plugin was learnt to have no latency (nothing
 * pays for cutting).
 */
extern int tune_model (struct tune *t, struct cut_model *m);

/* A plugin call of bytes took ns (split.c times every whole piece). */
extern void tune_record (struct tune *t, enum learn_dir d, uint64_t bytes,
                         uint64_t ns);

/* learn_grain (learn.h), for the export. */
extern uint32_t tune_stream_grain (struct tune *t, uint32_t count,
                                   uint64_t cap);

/* The statistics report's part on what was learnt of every export
 * each walks: a line per export for the summary; the choices made
 * with their reasons, and the tables of call costs; a JSON array.
 */
extern void tune_summary (tune_walk *each, FILE *fp);
extern void tune_tables (tune_walk *each, FILE *fp);
extern void tune_json (tune_walk *each, FILE *fp);

#endif /* NBDKIT_RESHAPE_TUNE_H */
