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

/* What an export's learning knows. */
enum learn_state {
  LEARN_NONE,               /* no slow read of a stream timed yet */
  LEARN_GUESS,              /* a stream's reads are slow: grains of
                               GUESS_PREFERRED until one is timed */
  LEARN_KNOWN,              /* the costs of the stream's reads and of
                               a grain are known (or a profile's) */
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

/* The sizes picked from what is known: told to clients as preferred,
 * the unit writes are staged in, and the grain small sequential reads
 * are fetched in.  0: nothing known (the static sizes stand).
 */
struct learn_sizes {
  uint32_t preferred;
  uint32_t unit;
  uint32_t grain;
};

/* What is known of an export, as a profile keeps it. */
struct learnt {
  bool fast;                    /* no latency worth hiding */
  uint32_t grain;
  double flat_ns, lat_ns, ns_per_byte;
};

/* The plugin calls of one size class. */
struct samples {
  uint64_t calls, bytes, ns;            /* totals, for the report */
  uint64_t fastest;                     /* ns, 0: none */
};

/* One export's learning.  The caller sets parallel (the plugin takes
 * requests in parallel) and min (its minimum block) before use.
 */
struct learn {
  bool parallel;
  uint64_t min;
  enum learn_state state;
  unsigned base;                        /* the class of the stream's
                                           reads last timed;
                                           SIZE_CLASSES: none */
  struct samples table[LEARN_DIRS][SIZE_CLASSES];
  struct learnt learnt;                 /* valid in LEARN_KNOWN */
  struct learn_sizes sizes;
  char why[200];                        /* what is known, and why */
};

/* Forget what was learnt and measured. */
extern void learn_forget (struct learn *l);
/* A plugin call of bytes took ns.  True if what is known changed
 * (then why says what).
 */
extern bool learn_record (struct learn *l, enum learn_dir d, uint64_t bytes,
                          uint64_t ns);
/* The grain a stream's read of count bytes that missed the cache is
 * served from (the aligned grain holding it, one plugin call), at most
 * cap; 0: the read goes to the plugin as it is.  Grains go only to
 * reads measured slow (a read of their size class took PLUGIN_SLOW_NS
 * or more every time), smaller than BASE_MAX.
 */
extern uint32_t learn_grain (struct learn *l, uint32_t count, uint64_t cap);
/* Take t as known, as a profile kept it (if nothing is yet). */
extern bool learn_teach (struct learn *l, const struct learnt *t);
/* The model requests are cut by: 1 with *m set; 0 if nothing is
 * known yet; -1 if the plugin is known to have no latency.
 */
extern int learn_model (const struct learn *l, struct cut_model *m);

static inline bool
learn_known (const struct learn *l)
{
  return l->state == LEARN_KNOWN;
}

#endif /* NBDKIT_RESHAPE_LEARN_H */
