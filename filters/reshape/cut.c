/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * reshape-size=auto: where a request is cut.  A request is sent whole
 * (up to the plugin's maximum) until cutting is measured to be faster.
 * For every request larger than 2 G, the model L + s/B (tune.c), run
 * on the lanes the large requests in flight leave it (lanes), proposes
 * the best cut; if it promises to be at least 25% faster, every 4th
 * request of that size class (every 2nd read if it promises twice as
 * fast: a client may send only a few such requests) is cut there until
 * both options have a few samples, then every 16th tries the option not
 * in use, and the option measured faster (by 15%, end to end) is kept.
 * So a request is never cut below its own size unless the plugin's
 * maximum demands it or cutting was measured to be faster, and the
 * choice follows the plugin if it changes.  An option measured 30%
 * worse, even once, is tried less and less often (down to every 256th
 * request), and more often again (up to every 16th) once it measures
 * no worse.
 */

#include <config.h>

#include <inttypes.h>
#include <stdlib.h>

#include <nbdkit-filter.h>

#include "common.h"
#include "cut.h"
#include "params.h"
#include "tune.h"

#define FLAT 1.25                       /* "as cheap" */
#define EXPLORE_FIRST 4                 /* until both are measured */
#define EXPLORE_EAGER 2                 /* ... if the model promises */
#define BIG_GAIN 2.0                    /* ... twice as fast */
#define EXPLORE_EVERY 16
#define EXPLORE_RARELY 256
#define SWITCH 0.87                     /* the other option wins by 15% */
#define WORSE 1.3                       /* an exploration that lost */
#define MIN_SAMPLES 3

/* Lanes: the pieces of one request that run at once.  The plugin's
 * parallelism (reshape-parallel, like nbdkit's threads) is shared by
 * the large requests in flight, whole or cut: a client that keeps
 * eight in flight gives the plugin eight streams already, and a
 * request cut to run wider than its share only slows the others,
 * while its own time, all that the measuring sees, looks faster.
 */
static unsigned
lanes (struct tune *t)
{
  unsigned n = __atomic_load_n (&t->inflight, __ATOMIC_RELAXED);

  if (!reshape_cfg.parallel_ok)
    return 1;
  return max_u64 (reshape_cfg.parallel / max_u64 (n, 1), 1);
}

/* What a request of count bytes is cut by, if anything may cut it:
 * the probe's model; while the probe goes on beside the connections,
 * if early, the handshake's (beside_hint); neither for a plugin
 * without latency or a request too small to cut in two grains.  Lock
 * held.
 */
static bool
model_for (const struct tune *t, uint64_t count, bool early,
           struct cut_model *m)
{
  if (t->measured && !t->fast)
    *m = probed (t);
  else if (early && t->beside && t->early.grain)
    *m = t->early;
  else
    return false;
  return count >= 2 * m->grain;
}

/* The model's best cut of count bytes and its gain over whole. */
static uint64_t
best_cut (struct tune *t, const struct cut_model *m, uint64_t count,
          uint32_t max, double *gain)
{
  const unsigned l = lanes (t);
  const double whole = model_ns (m, min_u64 (count, max)) *
    ((count + max - 1) / max);
  uint64_t s, best = count;
  double best_ns = whole;

  for (s = max_u64 (m->grain, 4096); s <= count / 2 && s <= max; s *= 2) {
    uint64_t pieces = (count + s - 1) / s;
    double ns = ((pieces + l - 1) / l) * model_ns (m, s);
    if (ns < best_ns) {
      best_ns = ns;
      best = s;
    }
  }
  *gain = whole / best_ns;
  return best;
}

uint64_t
cut_own (struct tune *t, uint64_t count, uint32_t max)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);
  struct cut_model m;
  uint64_t cut;
  double gain;

  /* Only the probe's: nothing measures how the filter's own reads
   * fare cut.
   */
  if (!model_for (t, count, false, &m))
    return min_u64 (count, max);
  cut = best_cut (t, &m, count, max, &gain);
  return gain >= FLAT ? cut : min_u64 (count, max);
}

uint32_t
cut_begin (struct tune *t, enum tune_dir d, uint64_t count, uint32_t max,
           struct cut_choice *c)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);
  struct cut_model m;
  struct bandit *b;
  uint64_t cut;
  double gain;
  bool explore;

  c->cls = -1;
  if (!model_for (t, count, true, &m))
    return min_u64 (count, max);
  __atomic_add_fetch (&t->inflight, 1, __ATOMIC_RELAXED);
  cut = best_cut (t, &m, count, max, &gain);
  b = &t->bandits[d][class_of (count)];
  if (!b->used) {
    /* The model comes from reads: for writes its promise is no more
     * than a guess (a decoder's clusters cost reads, not writes).
     */
    *b = (struct bandit) { .used = true, .cut = false,
                           .every = d == TUNE_READ && gain >= BIG_GAIN ?
                                    EXPLORE_EAGER : EXPLORE_FIRST };
    if (reshape_debug_tune)
      nbdkit_debug ("reshape: tune: '%s' %s of %" PRIu64 "K: %s (the "
                    "model: %.2fx faster cut at %" PRIu64 "K, to be "
                    "measured)", t->name,
                    d == TUNE_READ ? "reads" : "writes", count / 1024,
                    "whole", gain, cut / 1024);
  }
  /* Try the other option now and then, if the model sees one. */
  explore = ++b->since >= b->every && cut < count &&
    (b->cut || gain >= FLAT);
  if (explore)
    b->since = 0;
  c->cls = class_of (count);
  c->cut = b->cut != explore && cut < count;
  c->count = count;
  c->start_ns = now_ns ();
  return c->cut ? cut : min_u64 (count, max);
}

void
cut_end (struct tune *t, enum tune_dir d, const struct cut_choice *c,
         bool ok)
{
  const double npb = (double) (now_ns () - c->start_ns) / c->count;
  struct bandit *b;
  const int o = c->cut;

  if (c->cls < 0)
    return;
  __atomic_sub_fetch (&t->inflight, 1, __ATOMIC_RELAXED);
  if (!ok)                      /* a failure's time tells nothing */
    return;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);
  b = &t->bandits[d][c->cls];
  b->ns_per_byte[o] = b->samples[o] ? 0.75 * b->ns_per_byte[o] + 0.25 * npb
                                    : npb;
  b->samples[o]++;
  /* An exploration measured worse backs off at once (the model was
   * wrong, and each try costs the client); a switch needs a few.
   */
  if (o != b->cut && b->samples[!o] >= MIN_SAMPLES) {
    if (b->samples[o] >= MIN_SAMPLES &&
        b->ns_per_byte[o] < SWITCH * b->ns_per_byte[!o]) {
      b->cut = o;
      b->every = EXPLORE_EVERY;
      b->switches++;
      if (reshape_debug_tune)
        nbdkit_debug ("reshape: tune: '%s' %s of %" PRIu64 "K: now %s "
                      "(measured %.2f against %.2f ns per byte)", t->name,
                      d == TUNE_READ ? "reads" : "writes",
                      class_bytes (c->cls) / 1024, o ? "cut" : "whole",
                      b->ns_per_byte[o], b->ns_per_byte[!o]);
    }
    else if (b->ns_per_byte[o] > WORSE * b->ns_per_byte[!o])
      b->every = min_u64 (max_u64 (b->every, EXPLORE_EVERY) * 2,
                          EXPLORE_RARELY);
    else if (b->samples[o] >= MIN_SAMPLES)   /* not worse: try sooner */
      b->every = max_u64 (b->every / 2, EXPLORE_EVERY);
  }
}
