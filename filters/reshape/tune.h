/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * reshape-size=auto: what the filter learns of each export's plugin,
 * and the sizes it picks from that (see tune.c).  The fields of struct
 * tune are the business of tune.c, probe.c, cut.c and profile.c; the
 * rest of the filter goes through the functions.
 */

#ifndef NBDKIT_RESHAPE_TUNE_H
#define NBDKIT_RESHAPE_TUNE_H

#include <pthread.h>
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

#define MIN_SHIFT 12                    /* size classes from 4K ... */
#define NCLASSES 16                     /* ... to 128M */
#define PROBE_MAX (16 * 1024 * 1024)    /* the probe's largest read */

/* -D reshape.tune=1: the probe and every decision that changes. */
extern int reshape_debug_tune;

enum tune_dir { TUNE_READ, TUNE_WRITE, TUNE_DIRS };
enum tune_state { TUNE_UNKNOWN, TUNE_PROBING, TUNE_KNOWN };

/* What cutting goes by: a call of s bytes costs flat_ns up to grain,
 * then lat_ns + s * ns_per_byte (0: flat for good, never cut).
 */
struct cut_model {
  uint64_t grain;                       /* 0: no model */
  double flat_ns, lat_ns, ns_per_byte;
};

/* Plugin calls of one size class. */
struct cost {
  uint64_t calls, bytes, ns;            /* totals, atomic */
};

/* Cut or whole, for one direction and size class of requests. */
struct bandit {
  bool used;
  bool cut;                             /* the current choice */
  double ns_per_byte[2];                /* EWMA, [0] whole, [1] cut */
  unsigned samples[2];
  unsigned since;                       /* requests since exploring */
  unsigned every;                       /* explore every so many */
  unsigned switches;
};

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

/* One export's learning.  Kept, by export name, until the filter is
 * unloaded: a client that reconnects finds what the last one taught.
 */
struct tune {
  char *name;
  pthread_mutex_t lock;
  pthread_cond_t known;
  enum tune_state state;
  bool beside;                          /* PROBING beside connections */
  bool joinable;                        /* thread: the last such probe */
  pthread_t thread;
  const void *lender;                   /* whose plugin context it reads */
  bool cancel;                          /* the lender is ending: stop */
  uint32_t hint;                        /* told meanwhile (beside_hint) */
  struct cut_model early;               /* cut by meanwhile (ditto) */
  double floor_ns;                      /* fastest 4K of any probe, 0: none */
  /* The probe's findings. */
  bool measured;                        /* the probe got numbers */
  bool fast;                            /* no latency worth hiding */
  double probe_ns[NCLASSES];            /* 0: not probed */
  unsigned probe_reads;                 /* 0: from a profile */
  uint32_t grain;                       /* G */
  double lat_ns;                        /* L */
  double ns_per_byte;                   /* 1 / B, 0 = no bandwidth cost */
  struct tune_sizes sizes;
  char why[200];
  /* The geometry the probe ran on (a profile must match it). */
  bool from_profile;
  uint64_t exportsize;
  uint32_t min, max;
  /* Live traffic. */
  struct cost table[TUNE_DIRS][NCLASSES];
  struct bandit bandits[TUNE_DIRS][NCLASSES];
  unsigned inflight;                    /* requests timed, atomic */
  struct tune *next;
};

static inline unsigned
class_of (uint64_t bytes)
{
  unsigned c = 0;

  while (c + 1 < NCLASSES && bytes >> (c + 1 + MIN_SHIFT))
    c++;
  return c;
}

static inline uint64_t
class_bytes (unsigned c)
{
  return UINT64_C (1) << (c + MIN_SHIFT);
}

/* The model the probe found.  Its fields are set once (publish). */
static inline struct cut_model
probed (const struct tune *t)
{
  return (struct cut_model) {
    .grain = t->grain, .flat_ns = t->probe_ns[class_of (t->grain)],
    .lat_ns = t->lat_ns, .ns_per_byte = t->ns_per_byte,
  };
}

/* The cost of a call of s bytes as model m has it. */
static inline double
model_ns (const struct cut_model *m, uint64_t s)
{
  if (s <= m->grain || m->ns_per_byte == 0)
    return m->flat_ns;
  return m->lat_ns + s * m->ns_per_byte;
}

/* The export's learning; NULL with the error reported. */
extern struct tune *tune_get (const char *exportname);
extern void tune_free_all (void);
/* fn on every export's, the list locked. */
extern void tune_each (void (*fn) (struct tune *t, void *opaque),
                       void *opaque);

/* From what the probe (or a profile) found: t's sizes, and why.  t's
 * lock held, or t not yet shared.
 */
extern void tune_choose_sizes (struct tune *t);

extern void tune_sizes (struct tune *t, struct tune_sizes *s);
/* Those a new connection starts with: tune_sizes, or while the probe
 * goes on beside the connections, a preferred size only.
 */
extern void tune_start_sizes (struct tune *t, struct tune_sizes *s);

/* The filter calls the plugin (for a client, a readahead, a
 * write-back), and the call is done: while any is in flight, a
 * probe's slow read may have waited behind it (tune_plugin_busy).
 */
extern void tune_plugin_begin (void);
extern void tune_plugin_end (void);
extern bool tune_plugin_busy (void);

/* A plugin call of bytes took ns (split.c times every piece). */
extern void tune_record (struct tune *t, enum tune_dir d, uint64_t bytes,
                         uint64_t ns);

/* The learnt tables and the choices made, with their reasons, of
 * every export (the statistics report).
 */
extern void tune_report (FILE *fp);

#endif /* NBDKIT_RESHAPE_TUNE_H */
