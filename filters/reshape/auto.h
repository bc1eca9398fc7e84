/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * reshape-size=auto: what plugin calls cost by size, from the calls
 * clients' requests make anyway, and the sizes picked from that: the
 * grain a stream's small reads are served from, and where a request
 * is cut.
 *
 * The decisions are a pure core (struct auto_core: no lock, clock or
 * I/O; tests/unit-auto.c drives it from a simulated plugin).  The glue
 * (struct auto_export) keeps one export's core under a lock, publishes
 * what every request asks, and writes the report's part.
 */

#ifndef NBDKIT_RESHAPE_AUTO_H
#define NBDKIT_RESHAPE_AUTO_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common.h"
#include "stats.h"
#include "tunables.h"
#include "walk.h"

enum auto_dir { AUTO_READ, AUTO_WRITE, AUTO_DIRS };

/* Size classes by powers of 2, rounding down: class 0 holds sizes up
 * to 8K (exclusive), the last from 128M on.
 */
enum { SIZE_CLASS_SHIFT = 12, SIZE_CLASSES = 16 };

extern unsigned size_class (uint64_t bytes);
extern uint64_t size_class_bytes (unsigned c);

/* --- The core. --- */

/* The calls of one size class in one age of the table (AGE calls):
 * their count, total, and the fastest of PLUGIN_SLOW_NS or more (0:
 * none; faster ones come from a cache, and tell the mean only).
 */
struct auto_bucket {
  uint32_t n;
  uint64_t sum_ns, min_ns;
};

/* One size class: what the current and the previous age saw (older
 * calls are forgotten), and totals for the report.
 */
struct auto_class {
  uint64_t age;
  struct auto_bucket cur, prev;
  uint64_t calls, bytes, ns;
};

/* A call of s bytes costs lat_ns + s * ns_per_byte; grain: the
 * smallest piece worth cutting to (a cluster decoded whole).
 */
struct auto_model {
  uint64_t grain;
  double lat_ns, ns_per_byte;
};

/* What the stream's reads are known to be. */
enum auto_state {
  AUTO_NONE,                /* no read of a stream timed (recently) */
  AUTO_FAST,                /* they take under PLUGIN_SLOW_NS: nothing
                               to hide, nothing fetched or cut */
  AUTO_GUESS,               /* slow: grains of GUESS_PREFERRED until
                               GUESS_CALLS are timed */
  AUTO_KNOWN,               /* the line through a read and a grain */
};

/* Parts switched off, to measure what each buys (-D reshape.ablate=N,
 * the sum): grains, cuts, runs fetched ahead over a plugin that
 * serializes requests, the forgetting.
 */
enum {
  ABLATE_GRAINS = 1, ABLATE_CUTS = 4, ABLATE_AHEAD = 8, ABLATE_FORGET = 16,
};
extern int reshape_debug_ablate;

struct auto_core {
  bool parallel;                        /* set by the caller */
  unsigned off;                         /* ABLATE_*: parts switched off */
  uint64_t min;                         /* the plugin's minimum block */
  uint64_t calls;                       /* timed so far: the table's clock */
  uint64_t cap;                         /* the largest grain a stream
                                           may get (a power of 2) */
  unsigned base;                        /* the stream's read class;
                                           SIZE_CLASSES: none seen */
  uint64_t probed[AUTO_DIRS];           /* the age of the last probe + 1:
                                           a stream's read, a cut */
  uint64_t grain_probed;                /* ... a grain of the top size */
  uint64_t step[AUTO_DIRS];             /* the last cut (0: none) */
  unsigned depth;                       /* requests in flight, at most */
  uint64_t depth_age;                   /* ... in this age + 1 */
  enum auto_state state;
  struct auto_class table[AUTO_DIRS][SIZE_CLASSES];
  struct auto_model line;               /* reads, in AUTO_KNOWN */
  uint32_t grain;                       /* 0: none known */
  char why[200];                        /* of the grain */
  unsigned said[AUTO_DIRS];             /* cut decisions said so far */
  unsigned said_why[AUTO_DIRS];         /* ... the last: why, the step */
  uint64_t said_step[AUTO_DIRS];        /* (0: whole) */
  char cut_why[AUTO_DIRS][160];
};

/* Forget everything. */
extern void auto_forget (struct auto_core *a);
/* calls plugin calls of bytes each took sum_ns together, the fastest
 * of PLUGIN_SLOW_NS or more min_ns (0: none).  True if the grain
 * changed.
 */
extern bool auto_record (struct auto_core *a, enum auto_dir d,
                         uint64_t bytes, uint32_t calls, uint64_t sum_ns,
                         uint64_t min_ns);
/* The grain a stream's read of count bytes that missed the cache is
 * served from, at most cap (rounded down to a power of 2); 0: the
 * read goes as it is.
 */
extern uint32_t auto_grain (struct auto_core *a, uint32_t count,
                            uint64_t cap);
/* Where a request of count bytes is cut, over a plugin that takes
 * parallel calls at once, inflight requests (this one too) being cut:
 * the step (count: whole, up to max).  own: a read the filter makes
 * itself (a run of grains), which no probe slows.
 */
extern uint64_t auto_cut (struct auto_core *a, enum auto_dir d,
                          uint64_t count, uint32_t max, unsigned parallel,
                          unsigned inflight, bool own);

/* --- The glue: one export's core under a lock. --- */

/* -D reshape.auto=1: every change of the grain or of a cut. */
extern int reshape_debug_auto;

struct auto_export;

/* name is borrowed and must outlive it.  NULL with errno set. */
extern struct auto_export *auto_new (const char *name);
extern void auto_free (struct auto_export *e);

/* A walk over every export's (export_each), the registry's lock held. */
typedef void auto_visit (struct auto_export *e, void *opaque);
typedef void auto_walk (auto_visit *fn, void *opaque);

/* A connection settled its geometry (another one forgets what was
 * measured: the plugin changed under the name).
 */
extern void auto_connect (struct auto_export *e, const struct geometry *geo,
                          bool parallel);
/* Read without a lock: every request asks. */
extern bool auto_fast (struct auto_export *e);
extern uint32_t auto_published_grain (struct auto_export *e);

/* A request's pieces, timed, told in one batch: at most four sizes
 * (the first, the middle ones, the last, the export's short last
 * block); a fifth goes untimed.
 */
struct auto_batch {
  unsigned n;
  struct { uint64_t bytes, sum_ns, min_ns; uint32_t calls; } size[4];
};
extern void auto_batch_add (struct auto_batch *b, uint64_t bytes,
                            uint64_t ns);
extern void auto_time (struct auto_export *e, enum auto_dir d,
                       const struct auto_batch *b);
extern uint32_t auto_stream_grain (struct auto_export *e, uint32_t count,
                                   uint64_t cap);
/* The step for a request of count bytes (see auto_cut); auto_cut_end
 * after it.
 */
extern uint64_t auto_cut_begin (struct auto_export *e, enum auto_dir d,
                                uint64_t count, uint32_t max,
                                unsigned parallel, bool own);
extern void auto_cut_end (struct auto_export *e, uint64_t count);

/* The report's part, over every export: a line each, the tables, or
 * a JSON array.
 */
struct auto_report {
  FILE *fp;
  enum stats_part part;
  unsigned n;                           /* exports written */
  const char *sep;
};
extern void auto_report (auto_walk *each, FILE *fp, enum stats_part part);

#endif /* NBDKIT_RESHAPE_AUTO_H */
