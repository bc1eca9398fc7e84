/* nbdkit-reshape-filter: the learning's decisions (learn.c), driven by
 * a simulated plugin.
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Each cell is a plugin (latency, bandwidth, compressed clusters
 * decoded whole, parallel or serializing requests, a noisy machine, a
 * slow start) and a client's stream of small reads (its size, how
 * many misses pass before a sample's time comes back).  The stream's
 * misses go through learn_fetch exactly as stream.c
 * send them: a sample's plugin call is timed by the model, every call
 * is recorded (learn_record), and the sample's time is handed back
 * (learn_sample) some misses later.  No clock, no thread: the same
 * seed gives the same run.
 *
 * What must hold in every cell, once its stream has gone on long
 * enough (the knee is tried again after RECHECK_AFTER misses):
 *   - it is learnt, within a bounded number of misses;
 *   - a plugin without latency is learnt to be fast;
 *   - the grain G is flat and 2G is not (by the model's own costs,
 *     with the learning's line: KNEE, or per byte over a plugin that
 *     serializes requests), give or take the noise; or G is the
 *     largest block tried;
 *   - after a slow start (the first 30 calls ten times slower): the
 *     same, but a grain past the knee is counted, not failed (the
 *     learning leans to flat by design: a pair whose base read was
 *     slowed and whose block was not looks flat, and only a knee is
 *     tried again), and so is a parallel plugin judged busy, every
 *     rung flat up to the largest block (once grains serve the
 *     stream, no read of its own size is timed again to tell
 *     otherwise);
 *   - the preferred size is a power of 2, at least G, at most
 *     PREFERRED_CAP, and within a factor of 2 of L B / 2 (2 L B when
 *     serialized) from the model's own latency and bandwidth (with
 *     its decoding, per byte, as part of the bandwidth).
 *
 *   unit-learn [-v] [SEED]
 */

#include <config.h>

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "learn.h"

/* A plugin's cost of one call, in ns. */
struct plugin {
  double lat_ns;                /* per call */
  double bw;                    /* bytes per second per call */
  uint64_t cluster;             /* 0: none; else decoded whole */
  double decode_ns;             /* per cluster touched */
  bool serialize;
  double noise;                 /* each call's time times 1 +- this */
  unsigned slow_calls;          /* the first calls move bytes 10x slower */
};

struct cell {
  struct plugin p;
  uint32_t read;                /* the client's read size */
  unsigned lag;                 /* misses before a sample comes back */
};

static unsigned long long rng;

static double
uniform (void)
{
  rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
  return (rng >> 11) * (1.0 / 9007199254740992.0);
}

/* The model's cost of a call of s bytes at offset off, without noise. */
static double
cost (const struct plugin *p, uint64_t off, uint64_t s)
{
  double ns = p->lat_ns + s * 1e9 / p->bw;

  if (p->cluster) {
    const uint64_t first = off / p->cluster;
    const uint64_t last = (off + s - 1) / p->cluster;
    ns += (last - first + 1) * p->decode_ns;
  }
  return ns;
}

static unsigned calls;

static uint64_t
call (const struct plugin *p, uint64_t off, uint64_t s)
{
  double ns = cost (p, off, s);

  if (calls++ < p->slow_calls)
    ns += 9 * s * 1e9 / p->bw;
  ns *= 1 + p->noise * (2 * uniform () - 1);
  return ns < 1 ? 1 : (uint64_t) ns;
}

/* A sample handed out, and when its time comes back. */
struct pending {
  struct learn_fetch f;
  uint64_t ns;
  unsigned due;
};

struct run {
  unsigned misses;              /* until learnt, the last time */
};

/* The stream: n misses of c->read bytes.  The reads a fetched block
 * holds are hits, so the next miss is past the block.
 */
static void
stream (struct learn *l, const struct cell *c, unsigned n, struct run *r)
{
  struct pending q[64];
  unsigned nq = 0, i, j;
  uint64_t off = 0;

  memset (r, 0, sizeof *r);
  for (i = 0; i < n; i++) {
    struct learn_fetch f;
    uint64_t size, at, ns;

    learn_fetch (l, c->read, c->lag + 1, 64 << 20, &f);
    size = f.size ? f.size : c->read;
    at = f.size ? off / f.size * f.size : off;
    ns = call (&c->p, at, size);
    learn_record (l, LEARN_READ, size, ns);
    off = at + size;
    if (f.rung && nq < 64)
      q[nq++] = (struct pending) { .f = f, .ns = ns, .due = i + c->lag };
    /* Samples whose time is back, in the order they finish. */
    for (j = 0; j < nq;)
      if (q[j].due <= i) {
        if (learn_sample (l, &q[j].f, q[j].ns))
          r->misses = i + 1;
        q[j] = q[--nq];
      }
      else
        j++;
  }
}

static double
line (const struct plugin *p, uint64_t block, uint32_t read)
{
  double per_byte = PER_BYTE_KNEE * block / read;

  if (!p->serialize)
    return KNEE;
  return per_byte > KNEE ? per_byte : KNEE;
}

/* The ratio of a block's cost to the read's, as the pairs see it: the
 * block aligned on itself, the read inside it.
 */
static double
ratio (const struct plugin *p, uint64_t block, uint32_t read)
{
  return cost (p, 0, block) / cost (p, 0, read);
}

static int verbose;
static unsigned failures, gaps;
static bool slow_start;         /* the cell's first calls are slow */

static void
failed (const char *name, const struct learn *l, const char *what)
{
  failures++;
  printf ("FAIL %s: %s (learnt: %s)\n", name, what, l->why);
}

static void
check (const char *name, const struct cell *c)
{
  struct learn l = { .min = 4096, .parallel = !c->p.serialize };
  struct run r;
  const double tol = 1 + 3 * c->p.noise + 0.05;
  uint64_t want;

  learn_forget (&l);
  calls = 0;
  stream (&l, c, 600, &r);
  if (verbose)
    printf ("%-44s misses %3u: %s\n", name, r.misses, l.why);
  if (!learn_known (&l)) {
    failed (name, &l, "nothing learnt in 600 misses");
    return;
  }
  if (r.misses > 2 * WARMUP + 8 * 2 * PAIRS + RECHECK_AFTER + 2 * PAIRS * 3)
    failed (name, &l, "learnt too late");
  if (cost (&c->p, 0, c->read) < PLUGIN_SLOW_NS / 2) {
    if (!l.learnt.fast)
      failed (name, &l, "a plugin without latency not learnt fast");
    return;
  }
  if (l.learnt.fast) {
    if (cost (&c->p, 0, c->read) > 2 * PLUGIN_SLOW_NS)
      failed (name, &l, "a plugin with latency learnt fast");
    return;
  }
  if (slow_start && l.learnt.queued && !c->p.serialize) {
    gaps++;
    if (verbose)
      printf ("GAP %s: judged busy after its slow start\n", name);
    return;
  }
  {
    const uint32_t grain = l.sizes.grain;
    const double rg = ratio (&c->p, grain, c->read);
    const double r2 = ratio (&c->p, 2 * (uint64_t) grain, c->read);

    if (grain > c->read && rg >= line (&c->p, grain, c->read) * tol) {
      if (slow_start) {
        gaps++;
        if (verbose)
          printf ("GAP %s: the grain past the knee\n", name);
      }
      else
        failed (name, &l, "the grain is past the knee");
    }
    if (2 * (uint64_t) grain <= LADDER_MAX &&
        r2 < line (&c->p, 2 * (uint64_t) grain, c->read) / tol)
      failed (name, &l, "twice the grain is flat too");
    if (l.sizes.preferred < grain || l.sizes.preferred > PREFERRED_CAP ||
        (l.sizes.preferred & (l.sizes.preferred - 1)))
      failed (name, &l, "preferred size out of bounds");
    /* L B / 2 (2 L B serialized) from the model, where the learning
     * measured a slope.
     */
    if (l.learnt.ns_per_byte > 0) {
      double per_byte = 1 / c->p.bw;
      if (c->p.cluster)
        per_byte += c->p.decode_ns * 1e-9 / c->p.cluster;
      want = c->p.lat_ns * 1e-9 / per_byte * (c->p.serialize ? 2 : 0.5);
      if (want < grain)
        want = grain;
      if (want > PREFERRED_CAP)
        want = PREFERRED_CAP;
      if (l.sizes.preferred > 2 * want * tol ||
          l.sizes.preferred * 2 * tol < want)
        failed (name, &l, "preferred size far from L B");
    }
  }
}

/* Once learnt, over a parallel plugin that is not busy: grains for a
 * stream whose reads in flight overlap the latency less than two
 * grains would, the reads as they are otherwise.
 */
static void
check_grains (void)
{
  static const struct {
    double lat_ns, bw;
    uint32_t read;
    unsigned in_flight;
    bool grains;
  } cases[] = {
    { 1e6, 400e6, 4096, 16, true },     /* 64 MB/s against 580 MB/s */
    { 1e6, 400e6, 4096, 1, true },
    { 1e6, 400e6, 256 << 10, 16, false },
    { 1e6, 400e6, 256 << 10, 1, true },
    { 20e6, 100e6, 256 << 10, 16, false },
    { 20e6, 100e6, 4096, 16, true },
    { 20e6, 100e6, 64 << 10, 16, false },   /* 51 against 70 MB/s */
    { 20e6, 100e6, 64 << 10, 4, true },
  };
  unsigned i, j;

  for (i = 0; i < sizeof cases / sizeof *cases; i++) {
    const struct plugin p = { .lat_ns = cases[i].lat_ns, .bw = cases[i].bw };
    struct learn l = { .min = 4096, .parallel = true };
    const uint32_t grain = 1 << 20;
    struct learn_fetch f;

    learn_forget (&l);
    learn_teach (&l, &(struct learnt) {
        .grain = grain, .flat_ns = cost (&p, 0, grain),
        .lat_ns = p.lat_ns, .ns_per_byte = 1e9 / p.bw });
    for (j = 0; j < 8; j++)
      learn_record (&l, LEARN_READ, cases[i].read,
                    cost (&p, 0, cases[i].read));
    learn_fetch (&l, cases[i].read, cases[i].in_flight, 64 << 20, &f);
    if ((f.size != 0) != cases[i].grains) {
      failures++;
      printf ("FAIL grains: %.0f us + %.0f MB/s, %" PRIu32 "K reads, %u "
              "in flight: %s\n", p.lat_ns / 1e3, p.bw / 1e6,
              cases[i].read >> 10, cases[i].in_flight,
              f.size ? "grains" : "as they are");
    }
  }
}

int
main (int argc, char *argv[])
{
  static const double lats[] = { 20e3, 100e3, 1e6, 5e6, 20e6 };
  static const double bws[] = { 100e6, 400e6, 2e9 };
  static const struct { uint64_t size; double decode; } clusters[] = {
    { 0, 0 }, { 64 << 10, 300e3 }, { 2 << 20, 8e6 },
  };
  static const uint32_t reads[] = { 4096, 64 << 10, 256 << 10 };
  unsigned long long seed = 1;
  unsigned a, b, k, s, rd, cells = 0;
  char name[128];

  for (a = 1; a < (unsigned) argc; a++) {
    if (strcmp (argv[a], "-v") == 0)
      verbose = 1;
    else
      seed = strtoull (argv[a], NULL, 0);
  }
  printf ("seed %llu\n", seed);
  rng = seed;
  for (a = 0; a < sizeof lats / sizeof *lats; a++)
  for (b = 0; b < sizeof bws / sizeof *bws; b++)
  for (k = 0; k < sizeof clusters / sizeof *clusters; k++)
  for (s = 0; s < 2; s++)
  for (rd = 0; rd < sizeof reads / sizeof *reads; rd++) {
    struct cell c = {
      .p = { .lat_ns = lats[a], .bw = bws[b],
             .cluster = clusters[k].size, .decode_ns = clusters[k].decode,
             .serialize = s, .noise = 0.05 },
      .read = reads[rd],
      .lag = s ? 0 : 3,
    };
    if (c.p.cluster && c.read > c.p.cluster)
      continue;
    snprintf (name, sizeof name, "lat %.0fus bw %.0fM cl %" PRIu64
              "K%s read %" PRIu32 "K", lats[a] / 1e3, bws[b] / 1e6,
              clusters[k].size >> 10, s ? " serial" : "", reads[rd] >> 10);
    check (name, &c);
    cells++;
    /* The same plugin, on a machine short of CPU at the start. */
    c.p.slow_calls = 30;
    strcat (name, " slow start");
    slow_start = true;
    check (name, &c);
    slow_start = false;
    cells++;
  }
  check_grains ();
  printf ("%u cells, %u failed, %u slow starts judged busy or flat past "
          "the knee (known gaps)\n", cells, failures, gaps);
  return failures ? 1 : 0;
}
