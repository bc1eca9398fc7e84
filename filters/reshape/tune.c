/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * reshape-size=auto.  Per export, the filter learns what a plugin read
 * costs by its size, from the reads clients ask for and the blocks it
 * fetches to serve them, and picks its sizes from that.  It never
 * reads on its own to learn: no read at the handshake, none for a
 * client that reads nothing or reads alone.
 *
 * Every plugin call the filter makes is timed (tune_record) into a
 * table of size classes, keeping the last few times of each.  A
 * client's stream of small reads (readahead.c) is where the learning
 * happens: while the export is being learnt, the stream's misses are
 * taken in pairs: one goes to the plugin as it is (the base sample, the
 * client's own read size), the other fetches the aligned block of the
 * rung being tried that holds it (one plugin call, whose other bytes
 * the stream reads from the cache), base first in one pair and block
 * first in the next, a pair or two at a time and not among the
 * stream's first reads (which pile up at the plugin together).  So
 * both meet the same load: a client that keeps many reads in flight
 * keeps the plugin busy while the learning goes on, and a machine's
 * speed drifts (on a VM, by 3x within seconds): the ratio of a pair's
 * times sees neither.  A rung whose median ratio stays under KNEE is
 * flat.  (Waits in a busy plugin's queue add the same to both, which
 * makes a knee look flatter: grains then come out larger, never
 * smaller than the cost's real grain.)  The
 * rungs are tried halfway (in powers of 2) between the largest block
 * found flat and the smallest found not, from the read's size and the
 * largest block (LADDER_MAX, or what the pool lends): the grain is
 * found in two or three rungs.  From the knee:
 *
 *   - grain G, the last flat rung: small reads in a stream are
 *     fetched as the aligned G block that holds them (it costs no more
 *     than the small read), and no request is cut below G;
 *   - per-call cost L, the fastest base read, and bandwidth B of one
 *     stream, from the knee's excess over L;
 *   - preferred P, told to the connections made from then on and used
 *     as the unit of staging: the power of 2 nearest L B / 2, where a
 *     call's transfer takes half its fixed cost (2 L B if the plugin
 *     serializes requests: nothing overlaps), at least G, at most
 *     PREFERRED_CAP.  A plugin whose base reads take under
 *     PLUGIN_SLOW_NS is "fast": told FAST_PREFERRED, nothing fetched
 *     or cut for it.
 *
 * What was learnt of an export is kept, by export name, for the
 * connections that come later, for at most EXPORTS_MAX exports.
 */

#include <config.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nbdkit-filter.h>

#include "common.h"
#include "params.h"
#include "stats.h"
#include "tunables.h"
#include "tune.h"

NBDKIT_DLL_PUBLIC int reshape_debug_tune;


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
  uint64_t cap;                         /* the largest block it may try */
  unsigned warmup;                      /* misses before the first pair */
  uint32_t flat;                        /* largest block found flat */
  uint32_t knee;                        /* smallest found not, 0: none */
  double flat_ns;                       /* ... their blocks' time */
  double knee_ns, knee_base_ns;         /* ... and the base then */
  uint32_t rung;                        /* block size tried, 0: none */
  unsigned others;                      /* misses of other sizes since
                                           the last of the base's */
  bool judged;                          /* a rung was flat or the knee */
  bool retried;                         /* the first rung tried again */
  uint32_t confirmed;                   /* a knee found twice: final */
  unsigned recheck_in;                  /* misses until the knee is
                                           tried again, 0: none due */
  bool rechecking;                      /* learnt, and trying again */
  unsigned tries;                       /* rungs tried (samples' epoch) */
  unsigned sent;                        /* samples handed out */
  float base_ns[PAIRS], block_ns[PAIRS];
  bool lost[PAIRS];                     /* a pair that cannot count */
};

struct tune {
  char *name;
  unsigned refs;                        /* registry lock */
  struct tune *next;                    /* registry: most recent first */
  pthread_mutex_t lock;                 /* all below */
  struct geometry geo;                  /* learnt on; exportsize 0: none */
  struct samples table[TUNE_DIRS][SIZE_CLASSES];
  struct ladder ladder;
  bool known;
  struct tune_learnt learnt;
  struct tune_sizes sizes;
  char why[200];
};

static struct {
  pthread_mutex_t lock;
  struct tune *list;
  unsigned count;
  unsigned generation;                  /* atomic */
} registry = { .lock = PTHREAD_MUTEX_INITIALIZER };

static void
tune_free (struct tune *t)
{
  pthread_mutex_destroy (&t->lock);
  free (t->name);
  free (t);
}

/* Forget the least recently used export no connection holds, if the
 * registry is full.  Registry lock held.
 */
static void
forget_one (void)
{
  struct tune **pp, **victim = NULL;

  if (registry.count < EXPORTS_MAX)
    return;
  for (pp = &registry.list; *pp; pp = &(*pp)->next)
    if ((*pp)->refs == 0)
      victim = pp;
  if (victim) {
    struct tune *t = *victim;
    *victim = t->next;
    registry.count--;
    tune_free (t);
  }
}

struct tune *
tune_get (const char *exportname)
{
  struct tune **pp, *t;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&registry.lock);

  for (pp = &registry.list; (t = *pp) != NULL; pp = &t->next)
    if (strcmp (t->name, exportname) == 0) {
      *pp = t->next;                    /* to the front */
      break;
    }
  if (t == NULL) {
    forget_one ();
    t = calloc (1, sizeof *t);
    if (t == NULL || (t->name = strdup (exportname)) == NULL) {
      free (t);
      nbdkit_error ("reshape: tune: %m");
      return NULL;
    }
    pthread_mutex_init (&t->lock, NULL);
    registry.count++;
  }
  t->next = registry.list;
  registry.list = t;
  t->refs++;
  return t;
}

void
tune_put (struct tune *t)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&registry.lock);

  t->refs--;
}

void
tune_free_all (void)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&registry.lock);

  while (registry.list) {
    struct tune *t = registry.list;
    registry.list = t->next;
    tune_free (t);
  }
  registry.count = 0;
}

const char *
tune_name (const struct tune *t)
{
  return t->name;
}

void
tune_each (void (*fn) (struct tune *t, void *opaque), void *opaque)
{
  struct tune *t;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&registry.lock);

  for (t = registry.list; t; t = t->next)
    fn (t, opaque);
}

unsigned
tune_generation (void)
{
  return __atomic_load_n (&registry.generation, __ATOMIC_RELAXED);
}

/* Forget what was learnt and measured.  Lock held. */
static void
forget (struct tune *t)
{
  const unsigned tries = t->ladder.tries;  /* samples in flight: stale */

  memset (t->table, 0, sizeof t->table);
  memset (&t->ladder, 0, sizeof t->ladder);
  t->ladder.tries = tries;
  t->known = false;
  t->learnt = (struct tune_learnt) { .fast = false };
  t->sizes = (struct tune_sizes) { 0 };
  t->why[0] = '\0';
}

static bool
same_geometry (const struct geometry *a, const struct geometry *b)
{
  return a->exportsize == b->exportsize && a->min == b->min &&
    a->max == b->max;
}

void
tune_connect (struct tune *t, const struct geometry *geo)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);

  if (t->geo.exportsize && !same_geometry (&t->geo, geo)) {
    if (reshape_debug_tune)
      nbdkit_debug ("reshape: tune: export '%s' changed (size %" PRIu64
                    " now): learnt anew", t->name, geo->exportsize);
    forget (t);
  }
  t->geo = *geo;
}

/* The sizes that follow from what was learnt.  Lock held. */
static void
choose_sizes (struct tune *t)
{
  const struct tune_learnt *l = &t->learnt;
  uint64_t p;

  if (l->fast) {
    t->sizes = (struct tune_sizes) { .preferred = FAST_PREFERRED };
    snprintf (t->why, sizeof t->why, "reads of the stream's size took "
              "%.0f us: no latency; clients told %uK, nothing fetched "
              "or cut", l->flat_ns / 1000, FAST_PREFERRED / 1024);
    return;
  }
  /* Clients keep many requests in flight and nbdkit's threads overlap
   * the latency: beyond L B / 2, larger requests only cost buffers
   * and caches.  Nothing overlaps over a plugin that serializes
   * requests: there a call should carry twice its fixed cost.
   */
  if (l->ns_per_byte > 0)
    p = pow2_nearest (l->grain, l->lat_ns / l->ns_per_byte *
                      (reshape_cfg.parallel_ok ? 0.5 : 2), PREFERRED_CAP);
  else
    p = PREFERRED_CAP;
  p = min_u64 (max_u64 (p, l->grain), PREFERRED_CAP);
  t->sizes = (struct tune_sizes) {
    .preferred = p, .unit = p, .grain = l->grain,
  };
  if (l->ns_per_byte > 0)
    snprintf (t->why, sizeof t->why,
              "cost flat up to %" PRIu32 "K (%.2f ms), then %.2f ms + "
              "%.0f MB/s per stream%s: clients told %" PRIu64 "K",
              l->grain / 1024, l->flat_ns / 1e6, l->lat_ns / 1e6,
              1e3 / l->ns_per_byte, l->queued ? ", busy" : "", p / 1024);
  else
    snprintf (t->why, sizeof t->why,
              "cost flat up to %" PRIu32 "K (%.2f ms), the largest block "
              "tried%s: clients told %" PRIu64 "K", l->grain / 1024,
              l->flat_ns / 1e6, l->queued ? ", busy" : "", p / 1024);
}

/* Learnt: from now on, connections are told t->sizes.  Lock held. */
static void
publish (struct tune *t, const struct tune_learnt *l)
{
  t->learnt = *l;
  t->known = true;
  choose_sizes (t);
  if (reshape_debug_tune)
    nbdkit_debug ("reshape: tune: export '%s': %s", t->name, t->why);
}

bool
tune_learnt (struct tune *t, struct geometry *geo, struct tune_learnt *l)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);

  if (!t->known || t->geo.exportsize == 0)
    return false;
  *geo = t->geo;
  *l = t->learnt;
  return true;
}

void
tune_teach (struct tune *t, const struct tune_learnt *l)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);

  if (!t->known)
    publish (t, l);
}

bool
tune_fast (struct tune *t)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);

  return t->known && t->learnt.fast;
}

void
tune_sizes (struct tune *t, struct tune_sizes *s)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);

  *s = t->sizes;
}

int
tune_model (struct tune *t, struct cut_model *m)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);
  const struct tune_learnt *l = &t->learnt;

  if (!t->known)
    return 0;
  if (l->fast || l->grain == 0)
    return -1;
  *m = (struct cut_model) {
    .grain = l->grain, .flat_ns = l->flat_ns, .lat_ns = l->lat_ns,
    .ns_per_byte = l->ns_per_byte,
  };
  return 1;
}

void
tune_record (struct tune *t, enum tune_dir d, uint64_t bytes, uint64_t ns)
{
  struct samples *s = &t->table[d][size_class (bytes)];
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);

  s->calls++;
  s->bytes += bytes;
  s->ns += ns;
  if (s->fastest == 0 || ns < s->fastest)
    s->fastest = ns;
  s->recent = s->calls == 1 ? ns : s->recent + (ns - s->recent) / RECENT;
}

static void
sort (float *v, unsigned n)
{
  unsigned i, j;

  for (i = 1; i < n; i++) {             /* insertion sort: n <= PAIRS */
    float x = v[i];
    for (j = i; j > 0 && v[j - 1] > x; j--)
      v[j] = v[j - 1];
    v[j] = x;
  }
}

static double
median (float *v, unsigned n)
{
  sort (v, n);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The rung's pairs so far. */
struct pairs {
  unsigned n;                           /* back, both of them */
  unsigned pending;                     /* handed out, not yet back */
  double base, block;                   /* the medians of their reads */
  double ratio, lo, hi;                 /* of their ratios: the lower
                                           median, the least, the most */
};

/* Lock held. */
static void
pairs_back (const struct ladder *k, struct pairs *p)
{
  float b[PAIRS], r[PAIRS], q[PAIRS];
  unsigned i;

  *p = (struct pairs) { .n = 0 };
  for (i = 0; i < (k->sent + 1) / 2; i++) {
    if (k->lost[i])
      continue;
    if (k->base_ns[i] == 0 || k->block_ns[i] == 0) {
      p->pending++;
      continue;
    }
    b[p->n] = k->base_ns[i];
    r[p->n] = k->block_ns[i];
    q[p->n] = k->block_ns[i] / k->base_ns[i];
    p->n++;
  }
  if (p->n) {
    p->base = median (b, p->n);
    p->block = median (r, p->n);
    /* The lower median: a knee only where more than half the pairs
     * say so (one found too low costs far more than one found too
     * high: judge_rung).
     */
    sort (q, p->n);
    p->ratio = q[(p->n - 1) / 2];
    p->lo = q[0];
    p->hi = q[p->n - 1];
  }
}

static void fresh_pairs (struct ladder *k);

/* Try the next rung: halfway (in powers of 2) between the largest
 * block found flat and the smallest found not (or the cap), rounded
 * up.  Lock held.
 */
static void
next_rung (struct ladder *k)
{
  const unsigned lo = __builtin_ctzll (k->flat);
  const unsigned hi = __builtin_ctzll (k->knee ? k->knee
                                               : pow2_floor (k->cap));

  k->rung = UINT32_C (1) << ((lo + hi + 1) / 2);
  fresh_pairs (k);
}

/* The rung's pairs start afresh (those in flight no longer count).
 * Lock held.
 */
static void
fresh_pairs (struct ladder *k)
{
  k->tries++;
  k->sent = 0;
  memset (k->base_ns, 0, sizeof k->base_ns);
  memset (k->block_ns, 0, sizeof k->block_ns);
  memset (k->lost, 0, sizeof k->lost);
}

/* Do the plugin's calls wait for each other?  The reads of the
 * stream's size take QUEUED times, on average lately, the fastest of
 * them ever seen (a stream's first reads find the plugin idle), and
 * long enough to matter.  Lock held.
 */
static bool
queued (const struct tune *t)
{
  const struct samples *s = &t->table[TUNE_READ][t->ladder.base];

  return s->fastest && s->recent >= PLUGIN_SLOW_NS &&
    s->recent >= QUEUED * s->fastest;
}

/* Is the ladder over?  Then what it found is learnt: flat up to the
 * largest flat block, then lat + s * npb from the knee.  Lock held.
 */
static bool
ladder_done (struct tune *t, double base)
{
  struct ladder *k = &t->ladder;

  if (k->knee ? k->knee > 2 * k->flat : 2 * (uint64_t) k->flat <= k->cap)
    return false;
  /* A knee is tried once more, later (RECHECK_AFTER): one found too
   * low, by a machine short of CPU for a moment, would keep clusters
   * decoded many times over for as long as the server runs.
   */
  k->rechecking = false;
  k->rung = 0;
  k->recheck_in = k->knee && k->knee != k->confirmed ? RECHECK_AFTER : 0;
  publish (t, &(struct tune_learnt) {
      .queued = queued (t),
      .grain = k->flat, .flat_ns = k->flat > size_class_bytes (k->base) ?
                                   k->flat_ns : base,
      .lat_ns = k->knee ? k->knee_base_ns : k->flat_ns,
      .ns_per_byte = k->knee && k->knee_ns > k->knee_base_ns ?
                     (k->knee_ns - k->knee_base_ns) / k->knee : 0 });
  __atomic_add_fetch (&registry.generation, 1, __ATOMIC_RELAXED);
  return true;
}

/* A rung is flat below this ratio.  Over a plugin that serializes
 * requests, or one kept busy (its calls wait for each other), nothing
 * overlaps and throughput is what a byte costs: a block is worth it
 * while it costs at most three quarters of the reads it stands for
 * (qcow2dec decoding a 2M cluster in 3 ms, then copying it out, costs
 * more for a larger read, but far less than the 256K reads it saves).
 * Lock held.
 */
static double
knee (const struct tune *t)
{
  const struct ladder *k = &t->ladder;
  double per_byte;

  if (reshape_cfg.parallel_ok && !queued (t))
    return KNEE;
  per_byte = PER_BYTE_KNEE * k->rung / size_class_bytes (k->base);
  return per_byte > KNEE ? per_byte : KNEE;
}

/* Once enough pairs are back: a plugin without latency, or the rung is
 * flat or the knee.  A rung is called early if every pair says it is
 * clearly flat, or clearly the knee (CLEAR_KNEE: a block costing twice
 * what the knee does, as one past several clusters does; one pair
 * that waited behind a block of the stream's says the opposite), else
 * on the median of all its pairs: a
 * knee found too low, below a cluster that every read decodes whole,
 * would have each cluster decoded many times over, where one found
 * too high only makes grains larger.  For the same reason a knee
 * seen on the first rung while the plugin's queue was long is tried
 * once more, and a rung whose pairs were mostly lost starts again.
 * Lock held.
 */
static void
judge_rung (struct tune *t)
{
  struct ladder *k = &t->ladder;
  struct pairs p;
  double fastest, line;
  bool all_back, again;

  pairs_back (k, &p);
  all_back = k->sent >= 2 * PAIRS && p.pending == 0;
  if (p.n < PAIRS_FLAT) {
    if (all_back)                       /* mostly lost: again */
      next_rung (k);
    return;
  }
  /* The fastest read of the stream's size ever seen: under load a
   * plugin without latency slows down too (its copies share the CPUs).
   * (None was recorded if they all went through bounce buffers: then
   * the pairs' own.)
   */
  fastest = t->table[TUNE_READ][k->base].fastest;
  if (fastest == 0)
    fastest = p.base;
  if (fastest < PLUGIN_SLOW_NS) {
    k->rechecking = false;
    publish (t, &(struct tune_learnt) { .fast = true, .flat_ns = fastest });
    __atomic_add_fetch (&registry.generation, 1, __ATOMIC_RELAXED);
    return;
  }
  line = knee (t);
  if (!all_back &&
      p.hi >= line * CLEAR_FLAT / KNEE && p.lo <= line * CLEAR_KNEE / KNEE)
    return;
  /* The first rung's knee, while the plugin's queue was long: its
   * pairs meet the reads a stream's start piles up (nbdcopy sends 256
   * at once), whose order in the queue weighed more than the pairs'
   * sizes (qcow2dec: 1M blocks 3x 256K reads, then 1.0x).  Once more,
   * later.
   */
  again = p.ratio >= line && !k->judged && !k->retried &&
          p.base >= QUEUED * fastest;
  if (reshape_debug_tune)
    nbdkit_debug ("reshape: tune: export '%s': %" PRIu32 "K blocks "
                  "%.3f ms against %" PRIu64 "K reads %.3f ms (%.2fx, %u "
                  "pairs): %s%s", t->name, k->rung / 1024, p.block / 1e6,
                  size_class_bytes (k->base) / 1024, p.base / 1e6, p.ratio,
                  p.n, p.ratio < line ? "flat" : "the knee",
                  again ? ", queued: again" : "");
  if (again) {
    k->retried = true;
    fresh_pairs (k);
    return;
  }
  k->judged = true;
  if (p.ratio < line) {
    k->flat = k->rung;
    k->flat_ns = p.block;
  }
  else {
    if (k->rechecking)
      k->confirmed = k->rung;
    k->knee = k->rung;
    k->knee_ns = p.block;
    k->knee_base_ns = p.base;
  }
  /* A knee tried again and found flat: what lies above is unknown. */
  if (k->rechecking && k->flat == k->rung && k->knee == k->rung)
    k->knee = 0;
  if (!ladder_done (t, p.base))
    next_rung (k);
}

/* Once learnt: do grains pay for reads of count bytes?  Only where
 * they save the plugin work: a busy plugin whose cost is flat up to a
 * grain larger than the read, or one that serializes requests (a
 * client's reads in flight then overlap nothing).  Lock held.
 */
static bool
grains_pay (const struct tune *t, uint32_t count)
{
  return !t->learnt.fast && t->sizes.grain > count &&
    (t->learnt.queued || !reshape_cfg.parallel_ok);
}

/* Start the ladder from reads of count bytes, within cap: false if
 * there is no room to learn in.  Reads of BASE_MAX or more are large
 * already (qemu-img convert reads 2M): what the learning could find
 * beyond them would not pay for its blocks.  The first rung is at
 * least twice the minimum block (blocks are whole blocks).  Lock held.
 */
static bool
start_ladder (struct tune *t, uint32_t count, uint64_t cap)
{
  struct ladder *k = &t->ladder;
  const uint64_t flat = max_u64 (size_class_bytes (size_class (count)),
                                 max_u64 (t->geo.min, 1));

  if (count >= BASE_MAX || 2 * flat > cap)
    return false;
  *k = (struct ladder) { .base = size_class (count), .cap = cap,
                         .flat = flat, .tries = k->tries };
  next_rung (k);
  return true;
}

/* Learnt: is it time to try the knee again, with a stream of the
 * ladder's reads?  Then the ladder goes on from there.  Lock held.
 */
static bool
recheck (struct ladder *k, uint32_t count)
{
  if (size_class (count) != k->base)
    return false;
  if (k->rechecking)
    return true;
  if (k->recheck_in == 0 || --k->recheck_in > 0)
    return false;
  k->rechecking = true;
  k->rung = k->knee;
  fresh_pairs (k);
  return true;
}

void
tune_stream_fetch (struct tune *t, uint32_t count, uint64_t cap,
                   struct tune_fetch *f)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);
  struct ladder *k = &t->ladder;
  struct pairs p;

  *f = (struct tune_fetch) { .size = 0 };
  if (t->known && !recheck (k, count)) {
    if (grains_pay (t, count))
      f->size = t->sizes.grain;
    return;
  }
  cap = min_u64 (cap, LADDER_MAX);
  /* Another size's stream: the ladder's reads may have been a few at
   * connect time (partition probing); a stream that keeps missing
   * while they do not starts the ladder afresh from its own size.
   */
  if (k->rung && size_class (count) != k->base &&
      ++k->others >= 2 * WARMUP)
    k->rung = 0;
  if (k->rung == 0 && !start_ladder (t, count, cap))
    return;
  if (size_class (count) != k->base || k->rung > cap)
    return;
  k->others = 0;
  f->alone = true;
  /* Not at the stream's start, when its reads pile up at the plugin,
   * nor too many at once: those sent together meet different queues.
   * Meanwhile, if the plugin is busy (its reads cost it work), blocks
   * that cost no more than the reads they stand for: of the rung tried
   * once its pairs so far say it is flat, else the largest found flat.
   */
  pairs_back (k, &p);
  if (k->warmup < WARMUP || k->sent >= 2 * PAIRS ||
      (k->sent % 2 == 0 && p.pending >= PAIRS_AT_ONCE)) {
    k->warmup++;
    if (t->known) {                     /* trying again: as learnt */
      f->alone = false;
      if (grains_pay (t, count))
        f->size = t->sizes.grain;
      return;
    }
    if (queued (t))
      f->size = p.n && p.ratio < knee (t) ? k->rung : k->flat;
    if (f->size <= count)
      f->size = 0;
    return;
  }
  /* Base or block first, in turn: whichever is sent first may meet a
   * shorter queue.
   */
  f->rung = k->rung;
  f->try = k->tries;
  f->pair = k->sent / 2;
  f->block = (k->sent % 2) ^ (k->sent / 2 % 2);
  f->size = f->block ? k->rung : 0;
  k->sent++;
}

void
tune_sample_done (struct tune *t, const struct tune_fetch *f, uint64_t ns)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);
  struct ladder *k = &t->ladder;

  if (f->rung == 0 || f->try != k->tries ||
      (t->known && !k->rechecking))
    return;                             /* a rung since judged */
  if (reshape_debug_tune > 1)
    nbdkit_debug ("reshape: tune: export '%s': %" PRIu32 "K pair %u: %s "
                  "%.3f ms", t->name, f->rung / 1024, f->pair,
                  f->block ? "block" : "base", ns / 1e6);
  if (ns == 0)
    k->lost[f->pair] = true;
  else if (f->block)
    k->block_ns[f->pair] = ns;
  else
    k->base_ns[f->pair] = ns;
  judge_rung (t);
}

/* What the export's learning says, in a few words: its state. */
static const char *
state_name (const struct tune *t)
{
  if (t->known)
    return "learnt";
  return t->ladder.rung ? "learning" : "nothing learnt";
}

static void
summary_one (struct tune *t, void *fpv)
{
  FILE *fp = fpv;
  char b1[32], b2[32];
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);

  fprintf (fp, "size: auto, export '%s': %s", t->name, state_name (t));
  if (t->sizes.preferred && t->sizes.grain)
    fprintf (fp, ", grain %s, clients told %s",
             stats_human (t->sizes.grain, b1, sizeof b1),
             stats_human (t->sizes.preferred, b2, sizeof b2));
  else if (t->sizes.preferred)
    fprintf (fp, ", clients told %s",
             stats_human (t->sizes.preferred, b2, sizeof b2));
  fputc ('\n', fp);
}

static void
tables_one (struct tune *t, void *fpv)
{
  FILE *fp = fpv;
  static const char *const dirs[TUNE_DIRS] = { "reads", "writes" };
  char b1[32], b2[32];
  unsigned d, c;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);

  if (t->known)
    fprintf (fp, "\nreshape-size=auto, export '%s': %s\n", t->name,
             t->why);
  else if (t->ladder.rung)
    fprintf (fp, "\nreshape-size=auto, export '%s': still learning "
             "(trying %s blocks for %s reads)\n", t->name,
             stats_human (t->ladder.rung, b1, sizeof b1),
             stats_human (size_class_bytes (t->ladder.base), b2, sizeof b2));
  else
    fprintf (fp, "\nreshape-size=auto, export '%s': nothing learnt "
             "(no client read a stream of small reads)\n", t->name);
  fprintf (fp, "  %-8s %8s %10s %10s %10s\n", "", "size", "calls",
           "mean ms", "per s");
  for (d = 0; d < TUNE_DIRS; d++)
    for (c = 0; c < SIZE_CLASSES; c++) {
      const struct samples *s = &t->table[d][c];
      if (s->calls == 0)
        continue;
      fprintf (fp, "  %-8s %8s %10" PRIu64 " %10.3f %8s/s\n", dirs[d],
               stats_human (size_class_bytes (c), b1, sizeof b1), s->calls,
               (double) s->ns / s->calls / 1e6,
               stats_human (s->ns ? (uint64_t) (s->bytes * 1e9 / s->ns) : 0,
                            b2, sizeof b2));
    }
}

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
  static const char *const dirs[TUNE_DIRS] = { "read", "write" };
  const char *sep = "";
  unsigned d, c;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);

  fprintf (fp, "%s\n    {\"name\": ", o->n++ ? "," : "");
  stats_json_string (fp, t->name);
  fprintf (fp, ", \"state\": \"%s\", \"why\": ", state_name (t));
  stats_json_string (fp, t->known ? t->why : "");
  fprintf (fp, ",\n     \"preferred\": %" PRIu32 ", \"grain\": %" PRIu32
           ", \"unit\": %" PRIu32 ", \"trying\": %" PRIu32
           ",\n     \"calls\": [", t->sizes.preferred, t->sizes.grain,
           t->sizes.unit, t->known ? 0 : t->ladder.rung);
  for (d = 0; d < TUNE_DIRS; d++)
    for (c = 0; c < SIZE_CLASSES; c++) {
      const struct samples *s = &t->table[d][c];
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

static void
tune_summary (FILE *fp)
{
  tune_each (summary_one, fp);
}

static void
tune_tables (FILE *fp)
{
  tune_each (tables_one, fp);
}

static void
tune_json (FILE *fp)
{
  struct json_out o = { .fp = fp };

  fprintf (fp, "[");
  tune_each (json_one, &o);
  fprintf (fp, "%s]", o.n ? "\n  " : "");
}

const struct stats_learning tune_stats = {
  .summary = tune_summary, .tables = tune_tables, .json = tune_json,
};
