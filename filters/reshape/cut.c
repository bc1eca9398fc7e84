/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * reshape-size=auto: where a request is cut.  A request is sent whole
 * (up to the plugin's maximum) until cutting is measured to be faster.
 *
 * What to try: once the export's cost is learnt (learn.c), the model
 * L + s/B, run on the lanes the large requests in flight leave it
 * (lanes), proposes the best cut of every request larger than 2 G; if
 * it promises to be at least 25% faster, it is tried.  Before that,
 * a request large enough for every lane to get a piece of at least
 * PIECE_MIN is tried cut into one piece per lane: the measurement
 * alone decides.  Writes from UNLEARNT_WRITE_MIN are cut so, in
 * pieces of WRITE_PIECE_MIN or more, once the fastest of the first
 * MIN_SAMPLES, sent whole, took more than SLOW_WRITE_NS_PER_BYTE (a
 * client that only writes teaches the model nothing); whole is then
 * what is tried.  Reads are tried cut from UNLEARNT_MIN (a read's
 * stream teaches the model soon enough).  Nothing is tried over a
 * plugin that serializes requests (one lane) or one learnt to have no
 * latency.
 *
 * How: every 4th request of a size class (every 2nd read if the model
 * promises twice as fast: a client may send only a few such requests)
 * is cut there until both options have a few samples; then every 16th
 * tries the option not in use, and the option measured faster (by
 * 15%, end to end) is kept.  An option measured 30% worse, even once,
 * is tried less and less often (down to every 256th request), and
 * more often again (up to every 16th) once it measures no worse.  So
 * the choice follows the plugin if it changes.
 */

#include <config.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>

#include <nbdkit-filter.h>

#include "common.h"
#include "cut.h"
#include "params.h"
#include "stats.h"
#include "tunables.h"
#include "tune.h"


/* Cut or whole, for one direction and size class of requests. */
struct bandit {
  bool used;
  bool cut;                             /* the current choice */
  double ns_per_byte[2];                /* EWMA, [0] whole, [1] cut */
  unsigned samples[2];
  bool judge_first;                     /* writes, no model: see start */
  double fastest_whole;                 /* ... of the first few */
  bool on_prior;                        /* cut by judging, not measured */
  unsigned since;                       /* requests since exploring */
  unsigned every;                       /* explore every so many */
};

struct cut {
  pthread_mutex_t lock;
  unsigned inflight;                    /* requests timed, atomic */
  struct bandit bandits[LEARN_DIRS][SIZE_CLASSES];
};

struct cut *
cut_new (void)
{
  struct cut *choices = calloc (1, sizeof *choices);

  if (choices)
    pthread_mutex_init (&choices->lock, NULL);
  return choices;
}

void
cut_free (struct cut *choices)
{
  pthread_mutex_destroy (&choices->lock);
  free (choices);
}

static const char *
dir_name (enum learn_dir d)
{
  return d == LEARN_READ ? "reads" : "writes";
}

/* Lanes: the pieces of one request that run at once.  The plugin's
 * parallelism (reshape-parallel, like nbdkit's threads) is shared by
 * the large requests in flight, whole or cut: a client that keeps
 * eight in flight gives the plugin eight streams already, and a
 * request cut to run wider than its share only slows the others,
 * while its own time, all that the measuring sees, looks faster.
 */
static unsigned
lanes (struct cut *choices)
{
  unsigned n = __atomic_load_n (&choices->inflight, __ATOMIC_RELAXED);

  if (!reshape_cfg.parallel_ok)
    return 1;
  return MAX (reshape_cfg.parallel / MAX (n, 1), 1);
}

/* The model's best cut of count bytes and its gain over whole. */
static uint64_t
best_cut (unsigned l, const struct cut_model *m, uint64_t count,
          uint32_t max, double *gain)
{
  const double whole = model_ns (m, MIN (count, max)) *
    ((count + max - 1) / max);
  uint64_t s, best = count;
  double best_ns = whole;

  for (s = MAX (m->grain, 4096); s <= count / 2 && s <= max; s *= 2) {
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

/* The cut worth trying for count bytes, and what it promises (0:
 * nothing known, only a measurement will tell); count if none.
 */
static uint64_t
proposal (struct cut *choices, struct tune *t, enum learn_dir d,
          uint64_t count, uint32_t max, double *gain)
{
  const unsigned l = lanes (choices);
  struct cut_model m;
  uint64_t piece;

  *gain = 1;
  switch (tune_model (t, &m)) {
  case 1:
    if (count < 2 * m.grain)
      return count;
    return best_cut (l, &m, count, max, gain);
  case 0:                               /* not learnt: try one lane each */
    if (l <= 1 ||
        count < (d == LEARN_WRITE ? UNLEARNT_WRITE_MIN : UNLEARNT_MIN))
      return count;
    piece = MAX (pow2_floor (count / l),
                 d == LEARN_WRITE ? WRITE_PIECE_MIN : PIECE_MIN);
    *gain = 0;
    return piece < count ? MIN (piece, max) : count;
  default:                              /* no latency: nothing pays */
    return count;
  }
}

uint64_t
cut_own (struct cut *choices, struct tune *t, uint64_t count, uint32_t max)
{
  struct cut_model m;
  uint64_t cut;
  double gain;

  /* Only the model's: nothing measures how the filter's own reads
   * fare cut.  Before there is one, a read larger than two grains goes
   * in pieces of GUESS_PREFERRED (2M), which the helpers run at once:
   * a window is read only from a plugin measured slow, and its client
   * waits for all of it, while no piece of an aligned fill splits a
   * cluster (a qcow2's are at most 2M).
   */
  switch (tune_model (t, &m)) {
  case 0:
    if (lanes (choices) > 1 && count > 2 * GUESS_PREFERRED)
      return MIN (GUESS_PREFERRED, max);
    return MIN (count, max);
  case -1:
    return MIN (count, max);
  }
  if (count < 2 * m.grain)
    return MIN (count, max);
  cut = best_cut (lanes (choices), &m, count, max, &gain);
  return gain >= CUT_GAIN ? cut : MIN (count, max);
}

/* A new bandit: eager to try cutting if the model promises much.
 * Writes with no model are judged by the fastest of the first few,
 * sent whole (the first pays for cold caches): a client that only
 * writes (qemu-img convert to an export, one 2M write at a time)
 * teaches the model nothing, and over a plugin with latency cut in
 * parallel is the faster way, while over one without (memory, a local
 * file) the pieces only cost.
 */
static void
bandit_start (struct bandit *b, enum learn_dir d, double gain,
              uint64_t count, uint64_t cut)
{
  *b = (struct bandit) { .used = true, .cut = false,
                         .judge_first = d == LEARN_WRITE && gain == 0,
                         .every = d == LEARN_READ && gain >= BIG_GAIN ?
                                  EXPLORE_EAGER : EXPLORE_FIRST };
  if (reshape_debug_tune)
    nbdkit_debug ("reshape: tune: %s of %" PRIu64 "K: %s (cut at %"
                  PRIu64 "K to be measured; the model: %.2fx)",
                  dir_name (d), count / 1024,
                  b->judge_first ? "whole, then judged" : "whole",
                  cut / 1024, gain);
}

uint32_t
cut_begin (struct cut *choices, struct tune *t, enum learn_dir d,
           uint64_t count, uint32_t max, struct cut_choice *c)
{
  struct bandit *b;
  double gain;
  const uint64_t cut = proposal (choices, t, d, count, max, &gain);
  bool explore;

  c->cls = -1;
  if (cut >= count)
    return MIN (count, max);
  __atomic_add_fetch (&choices->inflight, 1, __ATOMIC_RELAXED);
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&choices->lock);
  b = &choices->bandits[d][size_class (count)];
  if (!b->used)
    bandit_start (b, d, gain, count, cut);
  /* Try the other option now and then: cutting only where the model
   * promises a gain, or where there is no model to ask.
   */
  explore = ++b->since >= b->every &&
    (b->cut || gain == 0 || gain >= CUT_GAIN);
  if (explore)
    b->since = 0;
  c->cls = size_class (count);
  c->cut = b->cut != explore;
  c->count = count;
  c->start_ns = now_ns ();
  return c->cut ? cut : MIN (count, max);
}

/* After a request of the option o: an exploration measured worse backs
 * off at once (each try costs the client); a switch needs a few.  Lock
 * held.
 */
static void
bandit_learn (struct bandit *b, enum learn_dir d, unsigned cls, int o,
              double npb)
{
  b->ns_per_byte[o] = b->samples[o] ?
    (1 - COST_WEIGHT) * b->ns_per_byte[o] + COST_WEIGHT * npb : npb;
  b->samples[o]++;
  if (b->judge_first && o == 0) {       /* see bandit_start */
    b->fastest_whole = b->samples[0] == 1 ? npb :
      MIN (b->fastest_whole, npb);
    if (b->samples[0] < MIN_SAMPLES)
      return;
    b->judge_first = false;
    b->cut = b->on_prior = b->fastest_whole > SLOW_WRITE_NS_PER_BYTE;
    return;
  }
  if (o == b->cut || b->samples[!o] < MIN_SAMPLES)
    return;
  /* A cut chosen by judging, not measured, yields to whole as soon as
   * whole measures no slower: cutting must not cost the client.
   */
  if (b->samples[o] >= MIN_SAMPLES &&
      b->ns_per_byte[o] < (b->on_prior ? 1.0 : SWITCH) *
                          b->ns_per_byte[!o]) {
    b->cut = o;
    b->on_prior = false;
    b->every = EXPLORE_EVERY;
    stats_add (C_CUT_SWITCHES, 1);
    if (reshape_debug_tune)
      nbdkit_debug ("reshape: tune: %s of %" PRIu64 "K+: now %s "
                    "(measured %.2f against %.2f ns per byte)",
                    dir_name (d), size_class_bytes (cls) / 1024,
                    o ? "cut" : "whole", b->ns_per_byte[o],
                    b->ns_per_byte[!o]);
  }
  else if (b->ns_per_byte[o] > WORSE * b->ns_per_byte[!o])
    b->every = MIN (MAX (b->every, EXPLORE_EVERY) * 2,
                    EXPLORE_RARELY);
  else if (b->samples[o] >= MIN_SAMPLES)   /* not worse: try sooner */
    b->every = MAX (b->every / 2, EXPLORE_EVERY);
}

void
cut_end (struct cut *choices, enum learn_dir d,
         const struct cut_choice *c, bool ok)
{
  const double npb = (double) (now_ns () - c->start_ns) / c->count;

  if (c->cls < 0)
    return;
  __atomic_sub_fetch (&choices->inflight, 1, __ATOMIC_RELAXED);
  if (!ok)                      /* a failure's time tells nothing */
    return;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&choices->lock);
  bandit_learn (&choices->bandits[d][c->cls], d, c->cls, c->cut, npb);
}
