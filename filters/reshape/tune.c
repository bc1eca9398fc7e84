/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * reshape-size=auto, the glue: one export's learning (learn.c, which
 * decides) under its lock, with the debug lines and the statistics
 * report's part on what was learnt.  export.c keeps one per export
 * name, and walks them.
 */

#include <config.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include <nbdkit-filter.h>

#include "common.h"
#include "params.h"
#include "stats.h"
#include "tunables.h"
#include "tune.h"

NBDKIT_DLL_PUBLIC int reshape_debug_tune;


struct tune {
  const char *name;                     /* the export's, borrowed */
  char *shown;                          /* quoted, for log lines */
  pthread_mutex_t lock;                 /* all below */
  struct geometry geo;                  /* learnt on; exportsize 0: none */
  struct learn learn;
  /* What every request asks, published after each change so that it
   * reads it without the lock: the grain | fast << 32.  Atomic.
   */
  uint64_t published;
};

/* Bumped whenever what is learnt changes, atomic. */
static unsigned generation;

struct tune *
tune_new (const char *name)
{
  struct tune *t = calloc (1, sizeof *t);

  if (t == NULL)
    return NULL;
  t->name = name;
  t->shown = stats_log_name (name);
  if (t->shown == NULL) {
    free (t);
    return NULL;
  }
  pthread_mutex_init (&t->lock, NULL);
  learn_forget (&t->learn);
  return t;
}

void
tune_free (struct tune *t)
{
  pthread_mutex_destroy (&t->lock);
  free (t->shown);
  free (t);
}

const char *
tune_name (const struct tune *t)
{
  return t->name;
}

unsigned
tune_generation (void)
{
  return __atomic_load_n (&generation, __ATOMIC_RELAXED);
}

static bool
same_geometry (const struct geometry *a, const struct geometry *b)
{
  return a->exportsize == b->exportsize && a->min == b->min &&
    a->max == b->max;
}

/* The export's learning, told the plugin's thread model (known once
 * nbdkit has asked the stack for it).  Lock held.
 */
static struct learn *
core (struct tune *t)
{
  t->learn.parallel = reshape_cfg.parallel_ok;
  return &t->learn;
}

/* The learning may have changed: publish what requests read.  Lock
 * held.
 */
static void
publish (struct tune *t)
{
  const uint64_t fast = learn_known (&t->learn) && t->learn.learnt.fast;
  const uint64_t word = t->learn.sizes.grain | fast << 32;

  /* Written only when it changes (every timed plugin call comes here),
   * and as an atomic exchange, which valgrind's helgrind does not take
   * for a racing plain store.
   */
  if (__atomic_load_n (&t->published, __ATOMIC_RELAXED) != word)
    __atomic_exchange_n (&t->published, word, __ATOMIC_RELAXED);
}

/* What is learnt changed: profiles save it.  Lock held. */
static void
learnt_changed (struct tune *t)
{
  __atomic_add_fetch (&generation, 1, __ATOMIC_RELAXED);
  if (reshape_debug_tune)
    nbdkit_debug ("reshape: tune: export %s: %s", t->shown, t->learn.why);
}

void
tune_connect (struct tune *t, const struct geometry *geo)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);

  if (t->geo.exportsize && !same_geometry (&t->geo, geo)) {
    if (reshape_debug_tune)
      nbdkit_debug ("reshape: tune: export %s changed (size %" PRIu64
                    " now): learnt anew", t->shown, geo->exportsize);
    learn_forget (&t->learn);
  }
  t->geo = *geo;
  t->learn.min = geo->min;
  publish (t);
}

bool
tune_get_learnt (struct tune *t, struct geometry *geo,
                 struct learnt *l)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);

  if (!learn_known (&t->learn) || t->geo.exportsize == 0)
    return false;
  *geo = t->geo;
  *l = t->learn.learnt;
  return true;
}

void
tune_teach (struct tune *t, const struct learnt *l)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);

  if (learn_teach (core (t), l) && reshape_debug_tune)
    nbdkit_debug ("reshape: tune: export %s: %s", t->shown, t->learn.why);
  publish (t);
}

bool
tune_fast (struct tune *t)
{
  return __atomic_load_n (&t->published, __ATOMIC_RELAXED) >> 32;
}

uint32_t
tune_grain (struct tune *t)
{
  return __atomic_load_n (&t->published, __ATOMIC_RELAXED) & UINT32_MAX;
}

void
tune_get_sizes (struct tune *t, struct learn_sizes *s)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);

  *s = t->learn.sizes;
}

int
tune_model (struct tune *t, struct cut_model *m)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);

  return learn_model (&t->learn, m);
}

/* What is known changed, if a size told or fetched did.  Lock held. */
static void
changed (struct tune *t, const struct learn_sizes *was)
{
  if (was->preferred != t->learn.sizes.preferred ||
      was->grain != t->learn.sizes.grain)
    learnt_changed (t);
  publish (t);
}

void
tune_record (struct tune *t, enum learn_dir d, uint64_t bytes, uint64_t ns)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);
  const struct learn_sizes was = t->learn.sizes;

  learn_record (core (t), d, bytes, ns);
  changed (t, &was);
}

uint32_t
tune_stream_grain (struct tune *t, uint32_t count, uint64_t cap)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);
  const struct learn_sizes was = t->learn.sizes;
  uint32_t g;

  g = learn_grain (core (t), count, cap);
  changed (t, &was);
  return g;
}

/* What the export's learning says, in a few words: its state. */
static const char *
state_name (const struct tune *t)
{
  static const char *const names[] = {
    [LEARN_NONE] = "nothing learnt", [LEARN_GUESS] = "guessing",
    [LEARN_KNOWN] = "learnt",
  };

  return names[t->learn.state];
}

static void
summary_one (struct tune *t, void *fpv)
{
  FILE *fp = fpv;
  char b1[32], b2[32];
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);

  fputs ("size: auto, export ", fp);
  stats_text_name (fp, t->name);
  fprintf (fp, ": %s", state_name (t));
  if (t->learn.sizes.preferred && t->learn.sizes.grain)
    fprintf (fp, ", grain %s, clients told %s",
             stats_human (t->learn.sizes.grain, b1, sizeof b1),
             stats_human (t->learn.sizes.preferred, b2, sizeof b2));
  else if (t->learn.sizes.preferred)
    fprintf (fp, ", clients told %s",
             stats_human (t->learn.sizes.preferred, b2, sizeof b2));
  fputc ('\n', fp);
}

static void
tables_one (struct tune *t, void *fpv)
{
  FILE *fp = fpv;
  static const char *const dirs[LEARN_DIRS] = { "reads", "writes" };
  char b1[32], b2[32];
  unsigned d, c;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);

  fputs ("\nreshape-size=auto, export ", fp);
  stats_text_name (fp, t->name);
  if (learn_known (&t->learn))
    fprintf (fp, ": %s\n", t->learn.why);
  else if (t->learn.state == LEARN_GUESS)
    fprintf (fp, ": %s reads are slow; %s grains until a few are timed\n",
             stats_human (size_class_bytes (t->learn.base), b1, sizeof b1),
             stats_human (GUESS_PREFERRED, b2, sizeof b2));
  else
    fprintf (fp, ": nothing learnt (no client read a stream of small "
             "reads)\n");
  fprintf (fp, "  %-8s %8s %10s %10s %10s\n", "", "size", "calls",
           "mean ms", "per s");
  for (d = 0; d < LEARN_DIRS; d++)
    for (c = 0; c < SIZE_CLASSES; c++) {
      const struct samples *s = &t->learn.table[d][c];
      if (s->calls == 0)
        continue;
      fprintf (fp, "  %-8s %8s %10" PRIu64 " %10.3f %8s/s\n", dirs[d],
               stats_human (size_class_bytes (c), b1, sizeof b1), s->calls,
               (double) s->ns / s->calls / 1e6,
               stats_human (s->ns ? (uint64_t) (s->bytes * 1e9 / s->ns) : 0,
                            b2, sizeof b2));
    }
}

/* The states as JSON names them. */
static const char *const state_keys[] = {
  [LEARN_NONE] = "none", [LEARN_GUESS] = "guess",
  [LEARN_KNOWN] = "known",
};

/* One export as a JSON object; *opaque counts those written. */
struct json_out {
  FILE *fp;
  unsigned n;
};

static void
json_one (struct tune *t, void *opaque)
{
  struct json_out *o = opaque;
  FILE *fp = o->fp;
  static const char *const dirs[LEARN_DIRS] = { "read", "write" };
  const char *sep = "";
  unsigned d, c;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);

  fprintf (fp, "%s\n    {\"name\": ", o->n++ ? "," : "");
  if (!stats_json_string (fp, t->name)) {
    fputs (", \"name_hex\": ", fp);   /* the name is not UTF-8 */
    stats_json_hex (fp, t->name);
  }
  fprintf (fp, ", \"state\": \"%s\", \"why\": ",
           state_keys[t->learn.state]);
  stats_json_string (fp, learn_known (&t->learn) ? t->learn.why : "");
  fprintf (fp, ",\n     \"preferred\": %" PRIu32 ", \"grain\": %" PRIu32
           ", \"unit\": %" PRIu32 ", \"trying\": %" PRIu32
           ",\n     \"calls\": [", t->learn.sizes.preferred,
           t->learn.sizes.grain, t->learn.sizes.unit,
           t->learn.state == LEARN_GUESS ? GUESS_PREFERRED : 0);
  for (d = 0; d < LEARN_DIRS; d++)
    for (c = 0; c < SIZE_CLASSES; c++) {
      const struct samples *s = &t->learn.table[d][c];
      if (s->calls == 0)
        continue;
      fprintf (fp, "%s\n       {\"dir\": \"%s\", \"size\": %" PRIu64
               ", \"calls\": %" PRIu64 ", \"bytes\": %" PRIu64
               ", \"ns\": %" PRIu64 "}", sep, dirs[d], size_class_bytes (c),
               s->calls, s->bytes, s->ns);
      sep = ",";
    }
  fprintf (fp, "]}");
}

void
tune_summary (tune_walk *each, FILE *fp)
{
  each (summary_one, fp);
}

void
tune_tables (tune_walk *each, FILE *fp)
{
  each (tables_one, fp);
}

void
tune_json (tune_walk *each, FILE *fp)
{
  struct json_out o = { .fp = fp };

  fprintf (fp, "[");
  each (json_one, &o);
  fprintf (fp, "%s]", o.n ? "\n  " : "");
}
