/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * The learning's decisions (reshape-size=auto), pure: no lock, no
 * clock, no plugin call.  Times and sizes come in, choices come out;
 * tune.c measures, locks and hands them on, and tests/unit-learn.c
 * drives the same functions from a simulated plugin.
 */

#ifndef NBDKIT_RESHAPE_LEARN_H
#define NBDKIT_RESHAPE_LEARN_H

#include <stdbool.h>
#include <stdint.h>

#include "common.h"
#include "tunables.h"

enum learn_dir { LEARN_READ, LEARN_WRITE, LEARN_DIRS };

/* Size classes by powers of 2, rounding down: class 0 holds sizes up
 * to 8K (exclusive), the last SIZE_CLASSES - 1 from 128M on.  The
 * learning keeps its costs by class (the pool has classes of its own,
 * which round up: alloc_class).
 */
enum { SIZE_CLASS_SHIFT = 12, SIZE_CLASSES = 16 };

extern unsigned size_class (uint64_t bytes);
extern uint64_t size_class_bytes (unsigned c);

/* What an export's learning is doing. */
enum learn_state {
  LEARN_NONE,               /* nothing yet: no stream of small reads */
  LEARN_LADDER,             /* trying grains of growing size */
  LEARN_KNOWN,              /* learnt: sizes adopted */
  LEARN_RECHECK,            /* learnt, and trying the knee once more */
};

/* The learnt cost of a plugin call of s bytes: flat_ns up to grain,
 * then lat_ns + s * ns_per_byte (ns_per_byte 0: flat as far as was
 * measured).
 */
struct cut_model {
  uint64_t grain;
  double flat_ns, lat_ns, ns_per_byte;
};

static inline double
model_ns (const struct cut_model *m, uint64_t s)
{
  if (s <= m->grain || m->ns_per_byte == 0)
    return m->flat_ns;
  return m->lat_ns + s * m->ns_per_byte;
}

/* The sizes picked from what was learnt: told to clients as preferred,
 * the unit writes are staged in, and the grain small sequential reads
 * are fetched in (the cost is flat up to it).  0: not learnt (the
 * static sizes stand).
 */
struct learn_sizes {
  uint32_t preferred;
  uint32_t unit;
  uint32_t grain;
};

/* What was learnt of an export, as a profile keeps it. */
struct learnt {
  bool fast;                    /* no latency worth hiding */
  bool queued;                  /* calls wait for each other (busy) */
  uint32_t grain;
  double flat_ns, lat_ns, ns_per_byte;
};

/* How a read of count bytes that continues a stream, and missed the
 * cache, is served: from an aligned grain of size bytes fetched for
 * it (0: the read goes to the plugin as it is).  While the export is
 * being learnt, the grain is fetched alone (not in a run of them),
 * and the read or the grain may be a sample: then learn_sample must
 * follow, with the time its plugin read took (0: none was made, or it
 * failed).
 */
struct learn_fetch {
  uint32_t size;
  bool alone;                   /* the grain alone, not a run */
  uint32_t rung;                /* a sample of this rung, 0: none */
  unsigned try;                 /* ... in this try of the rung */
  unsigned pair;                /* ... of this pair */
  bool grain;                   /* the grain, or the read */
};

/* The plugin calls of one size class. */
struct samples {
  uint64_t calls, bytes, ns;            /* totals, for the report */
  uint64_t fastest;                     /* ns, 0: none */
  double recent;                        /* ns, a moving average */
};

/* The ladder: what is known so far, and the rung being tried with its
 * pairs of samples (ns, 0: not back).
 */
struct ladder {
  unsigned base;                        /* the stream's read class */
  uint64_t cap;                         /* the largest grain it may try */
  unsigned warmup;                      /* misses before the first pair */
  uint32_t flat;                        /* largest grain found flat */
  uint32_t knee;                        /* smallest found not, 0: none */
  double flat_ns;                       /* ... their grains' time */
  double knee_ns, knee_base_ns;         /* ... and the base then */
  uint32_t rung;                        /* grain size tried, 0: none */
  unsigned others;                      /* misses of other sizes since
                                           the last of the base's */
  bool judged;                          /* a rung was flat or the knee */
  bool retried;                         /* the first rung tried again */
  uint32_t confirmed;                   /* a knee found twice: final */
  unsigned recheck_in;                  /* misses until the knee is
                                           tried again, 0: none due */
  unsigned tries;                       /* rungs tried (samples' epoch) */
  unsigned sent;                        /* samples handed out */
  float base_ns[PAIRS], block_ns[PAIRS];
  bool lost[PAIRS];                     /* a pair that cannot count */
};

/* One export's learning.  The caller sets parallel (the plugin takes
 * requests in parallel) and min (its minimum block) before use.
 */
struct learn {
  bool parallel;
  uint64_t min;
  enum learn_state state;
  struct samples table[LEARN_DIRS][SIZE_CLASSES];
  struct ladder ladder;
  struct learnt learnt;            /* valid from LEARN_KNOWN */
  struct learn_sizes sizes;
  char why[200];                        /* what was learnt, and why */
  char note[200];                       /* the last rung's judgment */
};

/* Forget what was learnt and measured. */
extern void learn_forget (struct learn *l);
/* A plugin call of bytes took ns. */
extern void learn_record (struct learn *l, enum learn_dir d, uint64_t bytes,
                          uint64_t ns);
/* How a stream's read of count bytes that missed the cache, with
 * in_flight of its connection's reads in the filter at its start
 * (itself included), is served (see struct learn_fetch), with grains
 * of at most cap bytes.
 * Once learnt, a read gets grains only where they pay: a plugin that
 * is fast, flat no further than the read, or takes requests in
 * parallel and is not busy, where the stream's reads in flight hide
 * its latency better than grains would (they keep the reads waiting),
 * gets the read as it is.
 */
extern void learn_fetch (struct learn *l, uint32_t count, unsigned in_flight,
                         uint64_t cap, struct learn_fetch *f);
/* A sample handed out by learn_fetch took ns (0: lost).  True if what
 * is learnt changed (adopted, or learnt anew); then why says what.
 * note holds the rung's judgment, if one was made (else "").
 */
extern bool learn_sample (struct learn *l, const struct learn_fetch *f,
                          uint64_t ns);
/* Take l as learnt, as a profile kept it (if nothing is yet). */
extern bool learn_teach (struct learn *l, const struct learnt *t);
/* The model requests are cut by: 1 with *m set; 0 if nothing is
 * learnt yet; -1 if the plugin was learnt to have no latency.
 */
extern int learn_model (const struct learn *l, struct cut_model *m);

static inline bool
learn_known (const struct learn *l)
{
  return l->state >= LEARN_KNOWN;
}

#endif /* NBDKIT_RESHAPE_LEARN_H */
