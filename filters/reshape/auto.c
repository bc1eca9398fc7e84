/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * reshape-size=auto (see auto.h and docs/design.md).  It never asks
 * for a read: nothing at the handshake, nothing for a client that
 * reads nothing or reads alone.  Every plugin call is timed into its
 * size class, in buckets by auto_age (AGE calls each), and what is older
 * than two ages is forgotten, so that a plugin that turns slow or fast
 * is followed; what a rule rests on and no call times any more is
 * timed again by one probe an age.  From the table come the grain a
 * stream's small reads are served from (update, auto_grain) and where
 * a request is cut (auto_cut).
 */

#include <config.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <nbdkit-filter.h>

#include "auto.h"
#include "stats.h"

unsigned
size_class (uint64_t bytes)
{
  unsigned c = 0;

  while (c + 1 < SIZE_CLASSES && bytes >> (c + 1 + SIZE_CLASS_SHIFT))
    c++;
  return c;
}

uint64_t
size_class_bytes (unsigned c)
{
  return UINT64_C (1) << (c + SIZE_CLASS_SHIFT);
}

/* --- The core. --- */

void
auto_forget (struct auto_core *a)
{
  const bool parallel = a->parallel;
  const uint64_t min = a->min;

  memset (a, 0, sizeof *a);
  a->parallel = parallel;
  a->min = min;
  a->base = SIZE_CLASSES;
}

/* The table's age: AGE calls each (ABLATE_FORGET: one age, ever). */
static uint64_t
auto_age (const struct auto_core *a)
{
  return a->off & ABLATE_FORGET ? 0 : a->calls / AGE;
}

static void
auto_merge (struct auto_bucket *b, const struct auto_bucket *o)
{
  if (o->min_ns && (b->min_ns == 0 || o->min_ns < b->min_ns))
    b->min_ns = o->min_ns;
  b->n += o->n;
  b->sum_ns += o->sum_ns;
}

/* The calls of class k in the last two ages. */
static struct auto_bucket
auto_recent (const struct auto_core *a, const struct auto_class *k)
{
  const uint64_t now = auto_age (a);
  struct auto_bucket b = { 0 };

  if (k->age == now) {
    b = k->cur;
    auto_merge (&b, &k->prev);
  }
  else if (k->age + 1 == now)
    b = k->cur;
  return b;
}

static void
auto_add (struct auto_core *a, struct auto_class *k, const struct auto_bucket *b)
{
  const uint64_t now = auto_age (a);

  if (k->age != now) {
    k->prev = k->age + 1 == now ? k->cur : (struct auto_bucket) { 0 };
    k->cur = (struct auto_bucket) { 0 };
    k->age = now;
  }
  auto_merge (&k->cur, b);
}

/* The line from a call of read bytes costing r_ns to the class from
 * from up whose fastest recent call (or mean) is cheapest per byte
 * beyond it (a size timed only while the machine was slow hides no
 * other); its size in m->grain.  Returns the calls of those classes
 * (0: no line).
 */
static uint64_t
auto_line (const struct auto_core *a, enum auto_dir d, double read, double r_ns,
      unsigned from, bool mean, struct auto_model *m)
{
  uint64_t calls = 0;
  double best = 0;
  unsigned c;

  for (c = from; c < SIZE_CLASSES; c++) {
    const struct auto_bucket b = auto_recent (a, &a->table[d][c]);
    double npb;

    if (b.min_ns == 0 || size_class_bytes (c) <= read)
      continue;
    npb = ((mean ? (double) b.sum_ns / b.n : b.min_ns) - r_ns) /
      (size_class_bytes (c) - read);
    if (calls == 0 || npb < best) {
      best = npb;
      m->grain = size_class_bytes (c);
    }
    calls += b.n;
  }
  /* Doubles: common.h's MIN and MAX are for sizes. */
  m->ns_per_byte = best > 0 ? best : 0;
  m->lat_ns = r_ns > read * m->ns_per_byte ? r_ns - read * m->ns_per_byte : 0;
  return calls;
}

/* What the table says of the stream's reads now, from the calls of
 * the top size or more.  A read's class forgotten keeps what was known
 * until one is timed again; so do the top size's while a smaller grain
 * serves the stream (auto_grain probes them).  True if a size picked
 * changed.
 */
static bool
auto_update (struct auto_core *a)
{
  const uint32_t was = a->grain;
  const uint64_t top = a->cap ? MIN (GUESS_PREFERRED, a->cap) :
    GUESS_PREFERRED;

  struct auto_bucket r;
  struct auto_model m;
  double read, r_ns;
  uint64_t calls;
  bool queue;

  if (a->base >= SIZE_CLASSES)
    return false;
  r = auto_recent (a, &a->table[AUTO_READ][a->base]);
  if (r.n == 0)
    return false;
  read = MAX (size_class_bytes (a->base), a->min);
  /* Reads that queue at the plugin (their mean KNEE times their
   * fastest: clusters decoded one at a time under a client's reads in
   * flight) are compared by their means, taken under the same load;
   * the fastest read beside grains timed only under load would make
   * the grain look dear.
   */
  queue = r.sum_ns > KNEE * r.min_ns * r.n;
  r_ns = queue ? (double) r.sum_ns / r.n : r.min_ns;
  if ((double) r.sum_ns / r.n < PLUGIN_SLOW_NS) {
    a->state = AUTO_FAST;
    a->grain = 0;
    snprintf (a->why, sizeof a->why, "reads take %.0f us: no latency, "
              "nothing fetched or cut", (double) r.sum_ns / r.n / 1000);
  }
  else if ((calls = auto_line (a, AUTO_READ, read, r_ns,
                          MAX (size_class (top), a->base + 1), queue,
                          &m)) == 0 && a->state == AUTO_KNOWN)
    ;                           /* as known, until auto_grain probes */
  else if (calls < GUESS_CALLS && (calls == 0 || a->state != AUTO_KNOWN)) {
    a->state = AUTO_GUESS;
    a->grain = 0;
  }
  else {
    const double g_ns = m.lat_ns + top * m.ns_per_byte;
    m.grain = top;
    if (g_ns > KNEE * r_ns)
      m.grain = pow2_nearest (4096, 2 * r_ns / m.ns_per_byte, top);
    a->state = AUTO_KNOWN;
    a->line = m;
    a->grain = m.grain;
    snprintf (a->why, sizeof a->why, "grains of %" PRIu64 "K; calls cost "
              "%.2f ms + %.0f MB/s", m.grain / 1024, m.lat_ns / 1e6,
              m.ns_per_byte > 0 ? 1e3 / m.ns_per_byte : 0.0);
  }
  return was != a->grain;
}

bool
auto_record (struct auto_core *a, enum auto_dir d, uint64_t bytes,
             uint32_t calls, uint64_t sum_ns, uint64_t min_ns)
{
  const unsigned c = size_class (bytes);
  struct auto_class *k = &a->table[d][c];

  k->calls += calls;
  k->bytes += bytes * calls;
  k->ns += sum_ns;
  auto_add (a, k, &(struct auto_bucket) { .n = calls, .sum_ns = sum_ns,
                                     .min_ns = min_ns });
  a->calls += calls;
  if (d == AUTO_READ && a->base < SIZE_CLASSES &&
      c >= a->base)
    return auto_update (a);
  return false;
}

uint32_t
auto_grain (struct auto_core *a, uint32_t count, uint64_t cap)
{
  const unsigned c = size_class (count);
  const struct auto_bucket r = auto_recent (a, &a->table[AUTO_READ][c]);
  uint64_t g, top;

  if (count >= GUESS_PREFERRED / 2 || cap == 0 || a->off & ABLATE_GRAINS)
    return 0;
  a->cap = pow2_floor (cap);
  top = MIN (GUESS_PREFERRED, a->cap);
  if (r.n && c != a->base) {
    a->base = c;
    auto_update (a);
  }
  /* What the line rests on forgotten: one read an age goes as it is,
   * or one grain of the top size, to time it again.
   */
  if (c == a->base && r.n == 0 &&
      a->probed[AUTO_READ] != auto_age (a) + 1) {
    a->probed[AUTO_READ] = auto_age (a) + 1;
    return 0;
  }
  if (c == a->base && a->state == AUTO_KNOWN && top > count &&
      a->grain_probed != auto_age (a) + 1 &&
      !auto_line (a, AUTO_READ, 0, 0, size_class (top), false,
             &(struct auto_model) { 0 })) {
    a->grain_probed = auto_age (a) + 1;
    return top;
  }
  if (a->state == AUTO_KNOWN)
    g = a->grain;
  else if (a->state == AUTO_GUESS && c == a->base)
    g = top;
  else
    return 0;
  g = MIN (g, top);
  if (g <= count || (a->min && g % a->min))
    return 0;
  return g;
}

static double
model_ns (const struct auto_model *m, uint64_t s)
{
  return m->lat_ns + s * m->ns_per_byte;
}

/* The model's best step for count bytes, and its gain over whole. */
static uint64_t
best_cut (unsigned lanes, const struct auto_model *m, uint64_t count,
          uint32_t max, double *gain)
{
  const double whole = model_ns (m, MIN (count, max)) *
    ((count + max - 1) / max);
  uint64_t s, best = MIN (count, max);
  double best_ns = whole;

  for (s = m->grain; s <= count / 2 && s <= max; s *= 2) {
    const uint64_t pieces = (count + s - 1) / s;
    const double ns = ((pieces + lanes - 1) / lanes) * model_ns (m, s);
    if (ns < best_ns) {
      best_ns = ns;
      best = s;
    }
  }
  *gain = whole / best_ns;
  return best;
}

/* The line through the recent calls of d of PIECE_MIN or more (what
 * smaller calls cost tells nothing of a cluster decoded whole), from
 * the smallest, by their mean: pieces that queue for the plugin
 * (clusters, a plugin's few lanes) cost what they cost under the load
 * a cut makes.
 */
static bool
auto_fit (const struct auto_core *a, enum auto_dir d, struct auto_model *m)
{
  struct auto_bucket b = { 0 };
  unsigned c;

  for (c = size_class (PIECE_MIN); c < SIZE_CLASSES && b.n == 0; c++)
    b = auto_recent (a, &a->table[d][c]);
  if (b.n == 0 ||
      auto_line (a, d, MAX (size_class_bytes (c - 1), a->min),
            (double) b.sum_ns / b.n, c, true, m) == 0)
    return false;
  m->grain = PIECE_MIN;
  return true;
}

/* Reads of count bytes whose mean is KNEE times their fastest wait
 * for the plugin (clusters decoded one at a time, a plugin's own few
 * lanes): more pieces would only wait longer, and their times, taken
 * while others wait, tell nothing of what a cut saves.  Fewer than
 * GUESS_CALLS timed: not known not to (a client reading clusters
 * starts many at once).  The filter's own reads are cut on the
 * stream's line, whose grain splits no cluster, as their client waits
 * for all of it; writes decode nothing (and a writer one at a time
 * measures a loaded machine's noise as queueing).
 */
static bool
auto_queued (const struct auto_core *a, uint64_t count)
{
  const struct auto_bucket b =
    auto_recent (a, &a->table[AUTO_READ][size_class (count)]);

  return b.n < GUESS_CALLS || b.sum_ns > KNEE * b.min_ns * b.n;
}

/* Why a client's request is cut as it is (said when it changes). */
enum cut_why {
  WHY_NONE, WHY_FAST, WHY_SHARED, WHY_OFF, WHY_OWN, WHY_PROBE, WHY_ONE,
  WHY_SMALL, WHY_QUEUED, WHY_MODEL,
};

static uint64_t
cut_pick (struct auto_core *a, enum auto_dir d, uint64_t count,
          uint32_t max, unsigned lanes, bool own, enum cut_why *why,
          struct auto_model *m, double *gain)
{
  const uint64_t whole = MIN (count, max);
  const uint64_t now = auto_age (a) + 1;
  uint64_t cut;

  *why = a->state == AUTO_FAST ? WHY_FAST : lanes <= 1 ? WHY_SHARED :
    a->off & ABLATE_CUTS ? WHY_OFF : WHY_OWN;
  if (*why != WHY_OWN)
    return whole;
  if (d == AUTO_READ && a->state == AUTO_KNOWN)
    *m = a->line;
  else if (own)
    /* A run's client waits for all of it: 2M pieces at once, none
     * splitting a cluster (a qcow2's are at most 2M).
     */
    return count > 2 * GUESS_PREFERRED ? MIN (GUESS_PREFERRED, max) : whole;
  else if (!auto_fit (a, d, m)) {
    /* One size timed lately: as last decided, but for one request an
     * age that times the size next to it (first whole, then halves).
     */
    const uint64_t last = a->step[d] && a->step[d] < whole ?
      a->step[d] : whole;
    *why = WHY_ONE;
    if (count < 2 * PIECE_MIN || a->probed[d] == now ||
        (a->step[d] == 0 &&
         auto_recent (a, &a->table[d][size_class (whole)]).n == 0))
      return last;
    a->probed[d] = now;
    *why = WHY_PROBE;
    return last < whole ? MIN (2 * last, whole) : pow2_floor (count / 2);
  }
  *why = count < 2 * m->grain ? WHY_SMALL :
    !own && d == AUTO_READ && auto_queued (a, whole) ? WHY_QUEUED : WHY_MODEL;
  if (*why != WHY_MODEL)
    return whole;
  cut = best_cut (lanes, m, count, max, gain);
  a->step[d] = *gain >= CUT_GAIN ? cut : whole;
  return a->step[d];
}

uint64_t
auto_cut (struct auto_core *a, enum auto_dir d, uint64_t count,
          uint32_t max, unsigned parallel, unsigned inflight, bool own)
{
  static const char *const words[] = {
    [WHY_FAST] = "calls take under 50 us",
    [WHY_SHARED] = "the requests in flight take all the plugin's lanes",
    [WHY_OFF] = "-D reshape.ablate",
    [WHY_ONE] = "one size timed lately",
    [WHY_SMALL] = "under two of the model's pieces",
    [WHY_QUEUED] = "its calls queue at the plugin",
  };
  const uint64_t now = auto_age (a) + 1;
  struct auto_model m = { 0 };
  enum cut_why why;
  double gain = 0;
  uint64_t step, key;
  unsigned lanes;

  /* The plugin's parallelism shared by the requests in flight, as many
   * as were lately (a client that keeps eight in flight gives the
   * plugin eight streams already, even while it has fewer, and a
   * request cut wider than its share only slows the others).
   */
  if (a->depth_age + 1 < now || inflight > a->depth) {
    a->depth = inflight;
    a->depth_age = now;
  }
  lanes = MAX (parallel / MAX (a->depth, 1), 1);
  step = cut_pick (a, d, count, max, lanes, own, &why, &m, &gain);
  key = step < MIN (count, max) ? step : 0;
  if (own || why == WHY_PROBE ||
      (why == a->said_why[d] && key == a->said_step[d]))
    return step;
  a->said_why[d] = why;
  a->said_step[d] = key;
  a->said[d]++;
  if (why != WHY_MODEL)
    snprintf (a->cut_why[d], sizeof a->cut_why[d], "%s of %" PRIu64 "K "
              "whole: %s", d == AUTO_READ ? "reads" : "writes",
              count / 1024, words[why]);
  else
    snprintf (a->cut_why[d], sizeof a->cut_why[d], "%s of %" PRIu64 "K "
              "%s %" PRIu64 "K: pieces on %u lanes %.2fx as fast; calls "
              "cost %.2f ms + %.0f MB/s", d == AUTO_READ ? "reads" : "writes",
              count / 1024, key ? "cut at" : "whole, not cut at",
              (key ? key : best_cut (lanes, &m, count, max, &gain)) / 1024,
              lanes, gain, m.lat_ns / 1e6,
              m.ns_per_byte > 0 ? 1e3 / m.ns_per_byte : 0.0);
  return step;
}

/* --- The glue. --- */

NBDKIT_DLL_PUBLIC int reshape_debug_auto;
NBDKIT_DLL_PUBLIC int reshape_debug_ablate;

struct auto_export {
  const char *name;                     /* borrowed */
  char *shown;                          /* quoted, for log lines */
  pthread_mutex_t lock;                 /* geo and core */
  struct geometry geo;                  /* measured on; exportsize 0: none */
  struct auto_core core;
  uint64_t published;                   /* grain | fast << 32, atomic */
  unsigned inflight;                    /* requests being cut, atomic */
};

struct auto_export *
auto_new (const char *name)
{
  struct auto_export *e = calloc (1, sizeof *e);

  if (e == NULL)
    return NULL;
  e->name = name;
  e->shown = stats_log_name (name);
  if (e->shown == NULL) {
    free (e);
    return NULL;
  }
  pthread_mutex_init (&e->lock, NULL);
  auto_forget (&e->core);
  return e;
}

void
auto_free (struct auto_export *e)
{
  pthread_mutex_destroy (&e->lock);
  free (e->shown);
  free (e);
}

/* After the core may have changed.  Lock held. */
static void
auto_publish (struct auto_export *e, bool changed)
{
  const uint64_t word = e->core.grain |
    (uint64_t) (e->core.state == AUTO_FAST) << 32;

  if (changed && reshape_debug_auto)
    nbdkit_debug ("reshape: auto: export %s: %s", e->shown, e->core.why);
  /* Written only when it changes, as an atomic exchange (which
   * helgrind does not take for a racing plain store).
   */
  if (__atomic_load_n (&e->published, __ATOMIC_RELAXED) != word)
    __atomic_exchange_n (&e->published, word, __ATOMIC_RELAXED);
}

void
auto_connect (struct auto_export *e, const struct geometry *geo,
              bool parallel)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&e->lock);

  if (e->geo.exportsize && (e->geo.exportsize != geo->exportsize ||
                            e->geo.min != geo->min ||
                            e->geo.max != geo->max)) {
    if (reshape_debug_auto)
      nbdkit_debug ("reshape: auto: export %s changed: measured anew",
                    e->shown);
    auto_forget (&e->core);
  }
  e->geo = *geo;
  e->core.min = geo->min;
  e->core.parallel = parallel;
  e->core.off = reshape_debug_ablate;
  auto_publish (e, false);
}

bool
auto_fast (struct auto_export *e)
{
  return __atomic_load_n (&e->published, __ATOMIC_RELAXED) >> 32;
}

uint32_t
auto_published_grain (struct auto_export *e)
{
  return __atomic_load_n (&e->published, __ATOMIC_RELAXED) & UINT32_MAX;
}

void
auto_batch_add (struct auto_batch *b, uint64_t bytes, uint64_t ns)
{
  unsigned i;

  for (i = 0; i < b->n && b->size[i].bytes != bytes; i++)
    ;
  if (i == 4)
    return;
  if (i == b->n)
    b->size[b->n++] = (typeof (b->size[0])) { .bytes = bytes };
  b->size[i].calls++;
  b->size[i].sum_ns += ns;
  if (ns >= PLUGIN_SLOW_NS &&
      (b->size[i].min_ns == 0 || ns < b->size[i].min_ns))
    b->size[i].min_ns = ns;
}

void
auto_time (struct auto_export *e, enum auto_dir d, const struct auto_batch *b)
{
  bool changed = false;
  unsigned i;

  if (b->n == 0)
    return;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&e->lock);
  for (i = 0; i < b->n; i++)
    changed |= auto_record (&e->core, d, b->size[i].bytes, b->size[i].calls,
                            b->size[i].sum_ns, b->size[i].min_ns);
  auto_publish (e, changed);
}

uint32_t
auto_stream_grain (struct auto_export *e, uint32_t count, uint64_t cap)
{
  uint32_t was, g;

  if (count >= GUESS_PREFERRED / 2)     /* no grain: no need to lock */
    return 0;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&e->lock);
  was = e->core.grain;
  g = auto_grain (&e->core, count, cap);
  auto_publish (e, was != e->core.grain);
  return g;
}

/* Only requests that may be cut count in flight: they share the
 * plugin's lanes (a client's small reads in flight do not stop a
 * run's pieces).
 */
uint64_t
auto_cut_begin (struct auto_export *e, enum auto_dir d, uint64_t count,
                uint32_t max, unsigned parallel, bool own)
{
  uint64_t step;
  unsigned n, said;

  if (count < 2 * PIECE_MIN)
    return count;
  n = __atomic_add_fetch (&e->inflight, 1, __ATOMIC_RELAXED);
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&e->lock);
  said = e->core.said[d];
  step = auto_cut (&e->core, d, count, max, parallel, n, own);
  if (reshape_debug_auto && e->core.said[d] != said)
    nbdkit_debug ("reshape: auto: export %s: %s", e->shown,
                  e->core.cut_why[d]);
  return step;
}

void
auto_cut_end (struct auto_export *e, uint64_t count)
{
  if (count >= 2 * PIECE_MIN)
    __atomic_sub_fetch (&e->inflight, 1, __ATOMIC_RELAXED);
}

static const char *const state_names[] = {
  [AUTO_NONE] = "none", [AUTO_FAST] = "fast", [AUTO_GUESS] = "guess",
  [AUTO_KNOWN] = "known",
};

/* One export's part of the report, under its lock. */
static void
report_one (struct auto_export *e, void *opaque)
{
  static const char *const dirs[AUTO_DIRS] = { "read", "write" };
  struct auto_report *o = opaque;
  const struct auto_core *a = &e->core;
  FILE *fp = o->fp;
  char b1[32], b2[32];
  unsigned d, c;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&e->lock);

  if (o->part == STATS_JSON) {
    fprintf (fp, "%s\n    {\"name\": ", o->n++ ? "," : "");
    stats_json_string (fp, e->name);
    fprintf (fp, ", \"state\": \"%s\", \"why\": ", state_names[a->state]);
    stats_json_string (fp, a->state == AUTO_FAST || a->state == AUTO_KNOWN ?
                       a->why : "");
    fprintf (fp, ",\n     \"grain\": %" PRIu32 ", \"trying\": %" PRIu32
             ",\n     \"calls\": [", a->grain,
             a->state == AUTO_GUESS ? GUESS_PREFERRED : 0);
  }
  else {
    fputs (o->part == STATS_SUMMARY ? "size: auto, export " :
           "\nreshape-size=auto, export ", fp);
    stats_text_name (fp, e->name);
  }
  if (o->part == STATS_SUMMARY) {
    fprintf (fp, ": %s", state_names[a->state]);
    if (a->grain)
      fprintf (fp, ", grain %s", stats_human (a->grain, b1, sizeof b1));
    fputc ('\n', fp);
    return;
  }
  if (o->part == STATS_TABLES)
    fprintf (fp, ": %s\n  %-8s %8s %10s %10s %10s\n",
             a->state == AUTO_GUESS ? "reads are slow; 2M grains until a "
             "few are timed" : a->state == AUTO_NONE ?
             "no client read a stream of small reads" : a->why,
             "", "size", "calls", "mean ms", "per s");
  for (d = 0; d < AUTO_DIRS; d++)
    for (c = 0; c < SIZE_CLASSES; c++) {
      const struct auto_class *k = &a->table[d][c];
      if (k->calls == 0)
        continue;
      if (o->part == STATS_JSON)
        fprintf (fp, "%s\n       {\"dir\": \"%s\", \"size\": %" PRIu64
                 ", \"calls\": %" PRIu64 ", \"bytes\": %" PRIu64
                 ", \"ns\": %" PRIu64 "}", o->sep, dirs[d],
                 size_class_bytes (c), k->calls, k->bytes, k->ns);
      else
        fprintf (fp, "  %-8s %8s %10" PRIu64 " %10.3f %8s/s\n",
                 d ? "writes" : "reads",
                 stats_human (size_class_bytes (c), b1, sizeof b1), k->calls,
                 (double) k->ns / k->calls / 1e6,
                 stats_human (k->ns ? (uint64_t) (k->bytes * 1e9 / k->ns) : 0,
                              b2, sizeof b2));
      o->sep = ",";
    }
  if (o->part == STATS_JSON)
    fputs ("]}", fp);
  o->sep = "";
}

void
auto_report (auto_walk *each, FILE *fp, enum stats_part part)
{
  struct auto_report o = { .fp = fp, .part = part, .sep = "" };

  if (part == STATS_JSON)
    fputc ('[', fp);
  each (report_one, &o);
  if (part == STATS_JSON)
    fprintf (fp, "%s]", o.n ? "\n  " : "");
}
