/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * reshape-size=auto (see auto.h).  It has no phase of its own and
 * never asks for a read: nothing at the handshake, nothing for a
 * client that reads nothing or reads alone.
 *
 * The table: every plugin call is timed into its size class, in
 * buckets by age (AGE calls of the export each).  A class tells what
 * its calls of the last two ages cost, its mean and its fastest call
 * of PLUGIN_SLOW_NS or more (faster ones come from a cache below);
 * older calls are forgotten, so a plugin that turns slow or fast is
 * followed.  What a rule rests on and no call times any more (a read
 * size that grains now serve) is timed again by one probe an age.
 *
 * The grain, for a stream of small reads that misses the cache: a
 * read of a size not timed lately goes as it is (one-shot commands
 * read only what they ask for).  Reads whose mean is under
 * PLUGIN_SLOW_NS (a share answered from a cache does not make the
 * plugin fast): nothing is fetched or cut.  Slower: the stream is
 * served from aligned grains of GUESS_PREFERRED (a grain larger than
 * the plugin's best costs at most its transfer) until GUESS_CALLS are
 * timed; then the line through the read's cost and the large size
 * cheapest per byte beyond it (their fastest calls, or their means
 * where the reads queue) gives the cost per call and per byte,
 * and the grain: GUESS_PREFERRED where it costs less than KNEE reads
 * (clusters decoded whole, or latency that dwarfs the transfer), else
 * the power of 2 nearest what moves in twice a read's time; at most
 * what the plugin, the pool and the export take.
 *
 * The cut: where the line through the recent calls of a direction
 * says pieces on the lanes left free beat one call by CUT_GAIN, unless
 * those calls queue at the plugin.  Without such a line (one size
 * timed), one request an age times the size next to the one in use
 * (first whole, then halves), so that there is one.
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
age (const struct auto_core *a)
{
  return a->off & ABLATE_FORGET ? 0 : a->calls / AGE;
}

static void
merge (struct auto_bucket *b, const struct auto_bucket *o)
{
  if (o->min_ns && (b->min_ns == 0 || o->min_ns < b->min_ns))
    b->min_ns = o->min_ns;
  b->n += o->n;
  b->sum_ns += o->sum_ns;
}

/* The calls of class k in the last two ages. */
static struct auto_bucket
recent (const struct auto_core *a, const struct auto_class *k)
{
  const uint64_t now = age (a);
  struct auto_bucket b = { 0 };

  if (k->age == now) {
    b = k->cur;
    merge (&b, &k->prev);
  }
  else if (k->age + 1 == now)
    b = k->cur;
  return b;
}

static void
add (struct auto_core *a, struct auto_class *k, const struct auto_bucket *b)
{
  const uint64_t now = age (a);

  if (k->age != now) {
    k->prev = k->age + 1 == now ? k->cur : (struct auto_bucket) { 0 };
    k->cur = (struct auto_bucket) { 0 };
    k->age = now;
  }
  merge (&k->cur, b);
}

/* The line from a call of read bytes costing r_ns to the class from
 * from up whose fastest recent call (or mean) is cheapest per byte
 * beyond it (a size timed only while the machine was slow hides no
 * other); its size in m->grain.  Returns the calls of those classes
 * (0: no line).
 */
static uint64_t
line (const struct auto_core *a, enum auto_dir d, double read, double r_ns,
      unsigned from, bool mean, struct auto_model *m)
{
  uint64_t calls = 0;
  double best = 0;
  unsigned c;

  for (c = from; c < SIZE_CLASSES; c++) {
    const struct auto_bucket b = recent (a, &a->table[d][c]);
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
update (struct auto_core *a)
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
  r = recent (a, &a->table[AUTO_READ][a->base]);
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
  else if ((calls = line (a, AUTO_READ, read, r_ns,
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
  add (a, k, &(struct auto_bucket) { .n = calls, .sum_ns = sum_ns,
                                     .min_ns = min_ns });
  a->calls += calls;
  if (d == AUTO_READ && a->base < SIZE_CLASSES &&
      c >= a->base)
    return update (a);
  return false;
}

uint32_t
auto_grain (struct auto_core *a, uint32_t count, uint64_t cap)
{
  const unsigned c = size_class (count);
  const struct auto_bucket r = recent (a, &a->table[AUTO_READ][c]);
  uint64_t g, top;

  if (count >= GUESS_PREFERRED / 2 || cap == 0 || a->off & ABLATE_GRAINS)
    return 0;
  a->cap = pow2_floor (cap);
  top = MIN (GUESS_PREFERRED, a->cap);
  if (r.n && c != a->base) {
    a->base = c;
    update (a);
  }
  /* What the line rests on forgotten: one read an age goes as it is,
   * or one grain of the top size, to time it again.
   */
  if (c == a->base && r.n == 0 &&
      a->probed[AUTO_READ] != age (a) + 1) {
    a->probed[AUTO_READ] = age (a) + 1;
    return 0;
  }
  if (c == a->base && a->state == AUTO_KNOWN && top > count &&
      a->grain_probed != age (a) + 1 &&
      !line (a, AUTO_READ, 0, 0, size_class (top), false,
             &(struct auto_model) { 0 })) {
    a->grain_probed = age (a) + 1;
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
fit (const struct auto_core *a, enum auto_dir d, struct auto_model *m)
{
  struct auto_bucket b = { 0 };
  unsigned c;

  for (c = size_class (PIECE_MIN); c < SIZE_CLASSES && b.n == 0; c++)
    b = recent (a, &a->table[d][c]);
  if (b.n == 0 ||
      line (a, d, MAX (size_class_bytes (c - 1), a->min),
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
queued (const struct auto_core *a, uint64_t count)
{
  const struct auto_bucket b =
    recent (a, &a->table[AUTO_READ][size_class (count)]);

  return b.n < GUESS_CALLS || b.sum_ns > KNEE * b.min_ns * b.n;
}

uint64_t
auto_cut (struct auto_core *a, enum auto_dir d, uint64_t count,
          uint32_t max, unsigned parallel, unsigned inflight, bool own)
{
  const uint64_t whole = MIN (count, max);
  const uint64_t now = age (a) + 1;
  struct auto_model m;
  unsigned lanes;
  double gain;
  uint64_t cut;

  /* The plugin's parallelism shared by the requests in flight, as
   * many as were lately (a client that keeps eight in flight gives the
   * plugin eight streams already, even while it has fewer, and a
   * request cut wider than its share only slows the others).
   */
  if (a->depth_age + 1 < now || inflight > a->depth) {
    a->depth = inflight;
    a->depth_age = now;
  }
  lanes = MAX (parallel / MAX (a->depth, 1), 1);
  if (a->state == AUTO_FAST || lanes <= 1 || a->off & ABLATE_CUTS)
    return whole;
  if (d == AUTO_READ && a->state == AUTO_KNOWN)
    m = a->line;
  else if (own)
    /* A run's client waits for all of it: 2M pieces at once, none
     * splitting a cluster (a qcow2's are at most 2M).
     */
    return count > 2 * GUESS_PREFERRED ? MIN (GUESS_PREFERRED, max) : whole;
  else if (!fit (a, d, &m)) {
    /* One size timed lately: as last decided, but for one request an
     * age that times the size next to it (first whole, then halves).
     */
    const uint64_t last = a->step[d] && a->step[d] < whole ?
      a->step[d] : whole;
    if (count < 2 * PIECE_MIN || a->probed[d] == now ||
        (a->step[d] == 0 &&
         recent (a, &a->table[d][size_class (whole)]).n == 0))
      return last;
    a->probed[d] = now;
    return last < whole ? MIN (2 * last, whole) : pow2_floor (count / 2);
  }
  if (count < 2 * m.grain ||
      (!own && d == AUTO_READ && queued (a, whole)))
    return whole;
  cut = best_cut (lanes, &m, count, max, &gain);
  a->step[d] = gain >= CUT_GAIN ? cut : whole;
  return a->step[d];
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
publish (struct auto_export *e, bool changed)
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
  publish (e, false);
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
  publish (e, changed);
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
  publish (e, was != e->core.grain);
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
  unsigned n;

  if (count < 2 * PIECE_MIN)
    return count;
  n = __atomic_add_fetch (&e->inflight, 1, __ATOMIC_RELAXED);
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&e->lock);
  return auto_cut (&e->core, d, count, max, parallel, n, own);
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

static void
summary_one (struct auto_export *e, void *fpv)
{
  FILE *fp = fpv;
  char b1[32];
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&e->lock);

  fputs ("size: auto, export ", fp);
  stats_text_name (fp, e->name);
  fprintf (fp, ": %s", state_names[e->core.state]);
  if (e->core.grain)
    fprintf (fp, ", grain %s", stats_human (e->core.grain, b1, sizeof b1));
  fputc ('\n', fp);
}

static void
tables_one (struct auto_export *e, void *fpv)
{
  FILE *fp = fpv;
  static const char *const dirs[AUTO_DIRS] = { "reads", "writes" };
  char b1[32], b2[32];
  unsigned d, c;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&e->lock);

  fputs ("\nreshape-size=auto, export ", fp);
  stats_text_name (fp, e->name);
  if (e->core.state == AUTO_GUESS)
    fprintf (fp, ": reads are slow; %s grains until a few are timed\n",
             stats_human (GUESS_PREFERRED, b1, sizeof b1));
  else
    fprintf (fp, ": %s\n", e->core.state == AUTO_NONE ?
             "no client read a stream of small reads" : e->core.why);
  fprintf (fp, "  %-8s %8s %10s %10s %10s\n", "", "size", "calls",
           "mean ms", "per s");
  for (d = 0; d < AUTO_DIRS; d++)
    for (c = 0; c < SIZE_CLASSES; c++) {
      const struct auto_class *k = &e->core.table[d][c];
      if (k->calls == 0)
        continue;
      fprintf (fp, "  %-8s %8s %10" PRIu64 " %10.3f %8s/s\n", dirs[d],
               stats_human (size_class_bytes (c), b1, sizeof b1), k->calls,
               (double) k->ns / k->calls / 1e6,
               stats_human (k->ns ? (uint64_t) (k->bytes * 1e9 / k->ns) : 0,
                            b2, sizeof b2));
    }
}

struct json_out {
  FILE *fp;
  unsigned n;                           /* exports written */
};

static void
json_one (struct auto_export *e, void *opaque)
{
  struct json_out *o = opaque;
  FILE *fp = o->fp;
  static const char *const dirs[AUTO_DIRS] = { "read", "write" };
  const struct auto_core *a = &e->core;
  const char *sep = "";
  unsigned d, c;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&e->lock);

  fprintf (fp, "%s\n    {\"name\": ", o->n++ ? "," : "");
  if (!stats_json_string (fp, e->name)) {
    fputs (", \"name_hex\": ", fp);     /* the name is not UTF-8 */
    stats_json_hex (fp, e->name);
  }
  fprintf (fp, ", \"state\": \"%s\", \"why\": ", state_names[a->state]);
  stats_json_string (fp, a->state == AUTO_FAST || a->state == AUTO_KNOWN ?
                     a->why : "");
  fprintf (fp, ",\n     \"grain\": %" PRIu32 ", \"trying\": %" PRIu32
           ",\n     \"calls\": [", a->grain,
           a->state == AUTO_GUESS ? GUESS_PREFERRED : 0);
  for (d = 0; d < AUTO_DIRS; d++)
    for (c = 0; c < SIZE_CLASSES; c++) {
      const struct auto_class *k = &a->table[d][c];
      if (k->calls == 0)
        continue;
      fprintf (fp, "%s\n       {\"dir\": \"%s\", \"size\": %" PRIu64
               ", \"calls\": %" PRIu64 ", \"bytes\": %" PRIu64
               ", \"ns\": %" PRIu64 "}", sep, dirs[d], size_class_bytes (c),
               k->calls, k->bytes, k->ns);
      sep = ",";
    }
  fputs ("]}", fp);
}

void
auto_summary (auto_walk *each, FILE *fp)
{
  each (summary_one, fp);
}

void
auto_tables (auto_walk *each, FILE *fp)
{
  each (tables_one, fp);
}

void
auto_json (auto_walk *each, FILE *fp)
{
  struct json_out o = { .fp = fp };

  fputc ('[', fp);
  each (json_one, &o);
  fprintf (fp, "%s]", o.n ? "\n  " : "");
}
