/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * reshape-size=auto: the learning's decisions, with no lock, clock or
 * plugin call (see learn.h).  Per export it learns what a plugin read
 * costs by its size, from the reads clients ask for and the grains
 * fetched to serve them, and picks its sizes from that.  It never asks
 * for a read of its own: no read at the handshake, none for a client
 * that reads nothing or reads alone.
 *
 * Every plugin call is timed into a table of size classes (learn_
 * record): for each, the fastest call and a moving average of the
 * recent ones.  A client's stream of small reads is where the learning
 * happens (LEARN_LADDER): the stream's misses are taken in pairs, one
 * sent as it is (the base sample, the client's own read size), the
 * other fetching the aligned grain of the rung being tried that holds
 * it (one plugin call, whose other bytes the stream reads from the
 * cache), base first in one pair and grain first in the next, a pair
 * or two at a time and not among the stream's first reads (which pile
 * up at the plugin together).  So both meet the same load: a client
 * that keeps many reads in flight keeps the plugin busy while the
 * learning goes on, and a machine's speed drifts (on a VM, by 3x within
 * seconds): the ratio of a pair's times sees neither.  A rung whose
 * lower median ratio stays under the knee is flat.  (Waits in a busy
 * plugin's queue add the same to both, which makes a knee look flatter:
 * grains then come out larger, never smaller than the cost's real
 * grain.)  The rungs are tried halfway (in powers of 2) between the
 * largest grain found flat and the smallest found not, from the read's
 * size and the largest grain (LADDER_MAX, or what the pool lends): the
 * grain is found in two or three rungs.  From the knee (LEARN_KNOWN):
 *
 *   - grain G, the last flat rung: small reads in a stream are
 *     fetched as the aligned grain of G bytes that holds them where grains pay,
 *     and no request is cut below G;
 *   - per-call cost L and bandwidth B of one stream, from the line
 *     through the knee's grain and its base reads;
 *   - preferred P, told to the connections made from then on and used
 *     as the unit of staging: the power of 2 nearest L B / 2, where a
 *     call's transfer takes half its fixed cost (2 L B if the plugin
 *     serializes requests: nothing overlaps), at least G, at most
 *     PREFERRED_CAP.  A plugin whose base reads take under
 *     PLUGIN_SLOW_NS is "fast": told FAST_PREFERRED, nothing fetched
 *     or cut for it.
 *
 * The knee is tried once more later (LEARN_RECHECK): one seen by a
 * machine short of CPU for a moment would keep clusters decoded many
 * times over for as long as the server runs.
 */

#include <config.h>

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "learn.h"

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

void
learn_forget (struct learn *l)
{
  /* Samples in flight no longer count. */
  const unsigned tries = l->ladder.tries + 1;

  memset (l->table, 0, sizeof l->table);
  memset (&l->ladder, 0, sizeof l->ladder);
  l->ladder.tries = tries;
  l->state = LEARN_NONE;
  l->learnt = (struct learnt) { .fast = false };
  l->sizes = (struct learn_sizes) { 0 };
  l->why[0] = '\0';
}

/* The sizes that follow from what was learnt. */
static void
choose_sizes (struct learn *l)
{
  const struct learnt *lt = &l->learnt;
  uint64_t p;

  if (lt->fast) {
    l->sizes = (struct learn_sizes) { .preferred = FAST_PREFERRED };
    snprintf (l->why, sizeof l->why, "reads of the stream's size took "
              "%.0f us: no latency; clients told %uK, nothing fetched "
              "or cut", lt->flat_ns / 1000, FAST_PREFERRED / 1024);
    return;
  }
  /* Clients keep many requests in flight and nbdkit's threads overlap
   * the latency: beyond L B / 2, larger requests only cost buffers
   * and caches.  Nothing overlaps over a plugin that serializes
   * requests: there a call should carry twice its fixed cost.
   */
  if (lt->ns_per_byte > 0)
    p = pow2_nearest (lt->grain, lt->lat_ns / lt->ns_per_byte *
                      (l->parallel ? 0.5 : 2), PREFERRED_CAP);
  else
    p = PREFERRED_CAP;
  p = MIN (MAX (p, lt->grain), PREFERRED_CAP);
  l->sizes = (struct learn_sizes) {
    .preferred = p, .unit = p, .grain = lt->grain,
  };
  if (lt->ns_per_byte > 0)
    snprintf (l->why, sizeof l->why,
              "cost flat up to %" PRIu32 "K (%.2f ms), then %.2f ms + "
              "%.0f MB/s per stream%s: clients told %" PRIu64 "K",
              lt->grain / 1024, lt->flat_ns / 1e6, lt->lat_ns / 1e6,
              1e3 / lt->ns_per_byte, lt->queued ? ", busy" : "", p / 1024);
  else
    snprintf (l->why, sizeof l->why,
              "cost flat up to %" PRIu32 "K (%.2f ms), the largest grain "
              "tried%s: clients told %" PRIu64 "K", lt->grain / 1024,
              lt->flat_ns / 1e6, lt->queued ? ", busy" : "", p / 1024);
}

/* Learnt: from now on, connections are told l->sizes. */
static void
adopt (struct learn *l, const struct learnt *lt)
{
  l->learnt = *lt;
  l->state = LEARN_KNOWN;
  choose_sizes (l);
}

bool
learn_teach (struct learn *l, const struct learnt *lt)
{
  if (learn_known (l))
    return false;
  adopt (l, lt);
  return true;
}

int
learn_model (const struct learn *l, struct cut_model *m)
{
  const struct learnt *lt = &l->learnt;

  if (!learn_known (l))
    return 0;
  if (lt->fast || lt->grain == 0)
    return -1;
  *m = (struct cut_model) {
    .grain = lt->grain, .flat_ns = lt->flat_ns, .lat_ns = lt->lat_ns,
    .ns_per_byte = lt->ns_per_byte,
  };
  return 1;
}

void
learn_record (struct learn *l, enum learn_dir d, uint64_t bytes, uint64_t ns)
{
  struct samples *s = &l->table[d][size_class (bytes)];

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
  double base, grain;                   /* the medians of their reads */
  double ratio, lo, hi;                 /* of their ratios: the lower
                                           median, the least, the most */
};

/* Lock held. */
static void
pairs_back (const struct ladder *ladder, struct pairs *p)
{
  float b[PAIRS], r[PAIRS], q[PAIRS];
  unsigned i;

  *p = (struct pairs) { .n = 0 };
  for (i = 0; i < (ladder->sent + 1) / 2; i++) {
    if (ladder->lost[i])
      continue;
    if (ladder->base_ns[i] == 0 || ladder->block_ns[i] == 0) {
      p->pending++;
      continue;
    }
    b[p->n] = ladder->base_ns[i];
    r[p->n] = ladder->block_ns[i];
    q[p->n] = ladder->block_ns[i] / ladder->base_ns[i];
    p->n++;
  }
  if (p->n) {
    p->base = median (b, p->n);
    p->grain = median (r, p->n);
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

static void fresh_pairs (struct ladder *ladder);

/* Try the next rung: halfway (in powers of 2) between the largest
 * grain found flat and the smallest found not (or the cap), rounded
 * up.
 */
static void
next_rung (struct ladder *ladder)
{
  const unsigned lo = __builtin_ctzll (ladder->flat);
  const unsigned hi =
    __builtin_ctzll (ladder->knee ? ladder->knee : pow2_floor (ladder->cap));

  ladder->rung = UINT32_C (1) << ((lo + hi + 1) / 2);
  fresh_pairs (ladder);
}

/* The rung's pairs start afresh (those in flight no longer count).
 */
static void
fresh_pairs (struct ladder *ladder)
{
  ladder->tries++;
  ladder->sent = 0;
  memset (ladder->base_ns, 0, sizeof ladder->base_ns);
  memset (ladder->block_ns, 0, sizeof ladder->block_ns);
  memset (ladder->lost, 0, sizeof ladder->lost);
}

/* Do the plugin's calls wait for each other?  The reads of the
 * stream's size take QUEUED times, on average lately, the fastest of
 * them ever seen (a stream's first reads find the plugin idle), and
 * long enough to matter.
 */
static bool
queued (const struct learn *l)
{
  const struct samples *s = &l->table[LEARN_READ][l->ladder.base];

  return s->fastest && s->recent >= PLUGIN_SLOW_NS &&
    s->recent >= QUEUED * s->fastest;
}

/* Is the ladder over?  Then what it found is learnt: flat up to the
 * largest flat grain, then lat + s * npb from the knee.
 */
static bool
ladder_done (struct learn *l, double base)
{
  struct ladder *ladder = &l->ladder;
  struct learnt lt;

  if (ladder->knee ? ladder->knee > 2 * ladder->flat
                   : 2 * (uint64_t) ladder->flat <= ladder->cap)
    return false;
  /* A knee is tried once more, later (RECHECK_AFTER): one found too
   * low, by a machine short of CPU for a moment, would keep clusters
   * decoded many times over for as long as the server runs.
   */
  ladder->rung = 0;
  ladder->recheck_in = ladder->knee && ladder->knee != ladder->confirmed ?
                       RECHECK_AFTER : 0;
  lt = (struct learnt) {
    .queued = queued (l),
    .grain = ladder->flat,
    /* A flat block never timed (the plugin's minimum block): the
     * base's time.
     */
    .flat_ns = ladder->flat > size_class_bytes (ladder->base) &&
               ladder->flat_ns > 0 ? ladder->flat_ns : base,
  };
  lt.lat_ns = lt.flat_ns;
  /* The line through the knee's two points, its grain and its base
   * read (whose own bytes cost time too: a line through zero bytes
   * would take a read's transfer for latency).
   */
  if (ladder->knee && ladder->knee_ns > ladder->knee_base_ns) {
    /* The base read as the plugin got it: at least a minimum block. */
    const double read = MAX (size_class_bytes (ladder->base), l->min);
    lt.ns_per_byte = (ladder->knee_ns - ladder->knee_base_ns) /
                     (ladder->knee - read);
    lt.lat_ns = ladder->knee_base_ns - read * lt.ns_per_byte;
    if (lt.lat_ns < 0)
      lt.lat_ns = 0;
  }
  else if (ladder->knee)
    lt.lat_ns = ladder->knee_base_ns;
  adopt (l, &lt);
  return true;
}

/* A rung is flat below this ratio.  Over a plugin that serializes
 * requests, or one kept busy (its calls wait for each other), nothing
 * overlaps and throughput is what a byte costs: a grain is worth it
 * while it costs at most three quarters of the reads it stands for
 * (qcow2dec decoding a 2M cluster in 3 ms, then copying it out, costs
 * more for a larger read, but far less than the 256K reads it saves).
 */
static double
knee (const struct learn *l)
{
  const struct ladder *ladder = &l->ladder;
  double per_byte;

  if (l->parallel && !queued (l))
    return KNEE;
  per_byte = PER_BYTE_KNEE * ladder->rung / size_class_bytes (ladder->base);
  return per_byte > KNEE ? per_byte : KNEE;
}

/* Once enough pairs are back: a plugin without latency, or the rung is
 * flat or the knee.  A rung is called early if every pair says it is
 * clearly flat, or clearly the knee (CLEAR_KNEE: a grain costing twice
 * what the knee does, as one past several clusters does; one pair
 * that waited behind a grain of the stream's says the opposite), else
 * on the median of all its pairs: a
 * knee found too low, below a cluster that every read decodes whole,
 * would have each cluster decoded many times over, where one found
 * too high only makes grains larger.  For the same reason a knee
 * seen on the first rung while the plugin's queue was long is tried
 * once more, and a rung whose pairs were mostly lost starts again.
 */
static bool
judge_rung (struct learn *l)
{
  struct ladder *ladder = &l->ladder;
  struct pairs p;
  double fastest, line;
  bool all_back, again;

  pairs_back (ladder, &p);
  all_back = ladder->sent >= 2 * PAIRS && p.pending == 0;
  if (p.n < PAIRS_FLAT) {
    if (all_back)                       /* mostly lost: again */
      next_rung (ladder);
    return false;
  }
  /* The fastest read of the stream's size ever seen: under load a
   * plugin without latency slows down too (its copies share the CPUs).
   * (None was recorded if they all went through bounce buffers: then
   * the pairs' own.)
   */
  fastest = l->table[LEARN_READ][ladder->base].fastest;
  if (fastest == 0)
    fastest = p.base;
  if (fastest < PLUGIN_SLOW_NS) {
    adopt (l, &(struct learnt) { .fast = true, .flat_ns = fastest });
    return true;
  }
  line = knee (l);
  if (!all_back &&
      p.hi >= line * CLEAR_FLAT / KNEE && p.lo <= line * CLEAR_KNEE / KNEE)
    return false;
  /* The first rung's knee, while the plugin's queue was long: its
   * pairs meet the reads a stream's start piles up (nbdcopy sends 256
   * at once), whose order in the queue weighed more than the pairs'
   * sizes (qcow2dec: 1M grains 3x 256K reads, then 1.0x).  Once more,
   * later.
   */
  again = p.ratio >= line && !ladder->judged && !ladder->retried &&
          p.base >= QUEUED * fastest;
  snprintf (l->note, sizeof l->note, "%" PRIu32 "K grains %.3f ms "
            "against %" PRIu64 "K reads %.3f ms (%.2fx, %u pairs): %s%s",
            ladder->rung / 1024, p.grain / 1e6,
            size_class_bytes (ladder->base) / 1024,
            p.base / 1e6, p.ratio, p.n, p.ratio < line ? "flat" : "the knee",
            again ? ", queued: again" : "");
  if (again) {
    ladder->retried = true;
    fresh_pairs (ladder);
    return false;
  }
  ladder->judged = true;
  if (p.ratio < line) {
    ladder->flat = ladder->rung;
    ladder->flat_ns = p.grain;
  }
  else {
    if (l->state == LEARN_RECHECK)
      ladder->confirmed = ladder->rung;
    ladder->knee = ladder->rung;
    ladder->knee_ns = p.grain;
    ladder->knee_base_ns = p.base;
  }
  /* A knee tried again and found flat: what lies above is unknown. */
  if (l->state == LEARN_RECHECK && ladder->flat == ladder->rung &&
      ladder->knee == ladder->rung)
    ladder->knee = 0;
  if (ladder_done (l, p.base))
    return true;
  next_rung (ladder);
  return false;
}

/* Over a plugin that takes requests in parallel and is not busy, the
 * stream's reads in flight overlap its latency as they are: grains pay
 * only if GRAIN_CALLS of them at once move GRAIN_GAIN times as much as
 * those reads do (4K reads, 16 in flight, over 1 ms: 64 MB/s as they
 * are, against two 1M grains in 3.6 ms, 580 MB/s), each at what the
 * plugin was measured to take for it lately (the learnt flat cost, if
 * nothing was: over a busy plugin the ladder can call a grain flat
 * that costs twice the read).
 */
static double
recent_ns (const struct learn *l, uint64_t bytes)
{
  const struct samples *s = &l->table[LEARN_READ][size_class (bytes)];

  return s->calls ? s->recent : l->learnt.flat_ns;
}

static bool
grains_outrun (const struct learn *l, uint32_t count, unsigned in_flight)
{
  const double read_ns = recent_ns (l, count);
  const double grain_ns = recent_ns (l, l->sizes.grain);

  return read_ns > 0 && grain_ns > 0 &&
    (double) GRAIN_CALLS * l->sizes.grain / grain_ns >=
    GRAIN_GAIN * in_flight * count / read_ns;
}

/* Once learnt: do grains pay for reads of count bytes, in_flight of
 * them at once?  Only where they save the plugin work: a busy plugin
 * whose cost is flat up to a grain larger than the read, one that
 * serializes requests (a client's reads in flight then overlap
 * nothing), or one whose latency the reads in flight overlap less
 * than grains would.
 */
static bool
grains_pay (const struct learn *l, uint32_t count, unsigned in_flight)
{
  return !l->learnt.fast && l->sizes.grain > count &&
    (l->learnt.queued || !l->parallel ||
     grains_outrun (l, count, in_flight));
}

/* Start the ladder from reads of count bytes, within cap: false if
 * there is no room to learn in.  Reads of BASE_MAX or more are large
 * already (qemu-img convert reads 2M): what the learning could find
 * beyond them would not pay for its grains.  The first rung is at
 * least twice the minimum block (grains are whole minimum blocks).
 */
static bool
start_ladder (struct learn *l, uint32_t count, uint64_t cap)
{
  struct ladder *ladder = &l->ladder;
  const uint64_t flat = MAX (size_class_bytes (size_class (count)),
                             MAX (l->min, 1));

  if (count >= BASE_MAX || 2 * flat > cap)
    return false;
  *ladder = (struct ladder) { .base = size_class (count), .cap = cap,
                              .flat = flat, .tries = ladder->tries };
  if (!learn_known (l))
    l->state = LEARN_LADDER;
  next_rung (ladder);
  return true;
}

/* Learnt: is it time to try the knee again, with a stream of the
 * ladder's reads?  Then the ladder goes on from there.
 */
static bool
recheck (struct learn *l, uint32_t count)
{
  struct ladder *ladder = &l->ladder;

  if (size_class (count) != ladder->base)
    return false;
  if (l->state == LEARN_RECHECK)
    return true;
  if (ladder->recheck_in == 0 || --ladder->recheck_in > 0)
    return false;
  l->state = LEARN_RECHECK;
  ladder->rung = ladder->knee;
  fresh_pairs (ladder);
  return true;
}

void
learn_fetch (struct learn *l, uint32_t count, unsigned in_flight,
             uint64_t cap, struct learn_fetch *f)
{
  struct ladder *ladder = &l->ladder;
  struct pairs p;

  *f = (struct learn_fetch) { .size = 0 };
  if (learn_known (l) && !recheck (l, count)) {
    if (grains_pay (l, count, in_flight))
      f->size = l->sizes.grain;
    return;
  }
  cap = MIN (cap, LADDER_MAX);
  /* Another size's stream: the ladder's reads may have been a few at
   * connect time (partition probing); a stream that keeps missing
   * while they do not starts the ladder afresh from its own size.
   */
  if (ladder->rung && size_class (count) != ladder->base &&
      ++ladder->others >= 2 * WARMUP) {
    ladder->rung = 0;
    ladder->tries++;                    /* samples in flight: stale */
    if (!learn_known (l))
      l->state = LEARN_NONE;
  }
  if (ladder->rung == 0 && !start_ladder (l, count, cap))
    return;
  if (size_class (count) != ladder->base || ladder->rung > cap)
    return;
  ladder->others = 0;
  f->alone = true;
  /* Not at the stream's start, when its reads pile up at the plugin,
   * nor too many at once: those sent together meet different queues.
   * Meanwhile, if the plugin is busy (its reads cost it work), grains
   * that cost no more than the reads they stand for: of the rung tried
   * once its pairs so far say it is flat, else the largest found flat.
   */
  pairs_back (ladder, &p);
  if (ladder->warmup < WARMUP || ladder->sent >= 2 * PAIRS ||
      (ladder->sent % 2 == 0 && p.pending >= PAIRS_AT_ONCE)) {
    ladder->warmup++;
    if (learn_known (l)) {              /* trying again: as learnt */
      f->alone = false;
      if (grains_pay (l, count, in_flight))
        f->size = l->sizes.grain;
      return;
    }
    if (queued (l))
      f->size = p.n && p.ratio < knee (l) ? ladder->rung : ladder->flat;
    if (f->size <= count)
      f->size = 0;
    return;
  }
  /* Base or grain first, in turn: whichever is sent first may meet a
   * shorter queue.
   */
  f->rung = ladder->rung;
  f->try = ladder->tries;
  f->pair = ladder->sent / 2;
  f->grain = (ladder->sent % 2) ^ (ladder->sent / 2 % 2);
  f->size = f->grain ? ladder->rung : 0;
  ladder->sent++;
}

bool
learn_sample (struct learn *l, const struct learn_fetch *f, uint64_t ns)
{
  struct ladder *ladder = &l->ladder;

  l->note[0] = '\0';
  if (f->rung == 0 || f->try != ladder->tries || f->rung != ladder->rung ||
      l->state == LEARN_KNOWN)
    return false;                       /* a rung since judged */
  if (ns == 0)
    ladder->lost[f->pair] = true;
  else if (f->grain)
    ladder->block_ns[f->pair] = ns;
  else
    ladder->base_ns[f->pair] = ns;
  return judge_rung (l);
}
