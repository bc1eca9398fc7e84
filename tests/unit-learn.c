/* nbdkit-reshape-filter: the learning's decisions (learn.c), driven by
 * a simulated plugin.
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Each cell is a plugin (latency, bandwidth, compressed clusters
 * decoded whole, parallel or serializing requests, a noisy machine, a
 * slow start) and a client's stream of small reads.  The stream's
 * misses go through learn_grain exactly as stream.c sends them, and
 * every plugin call is timed by the model and recorded (learn_record).
 * No clock, no thread: the same seed gives the same run.
 *
 * What must hold in every cell:
 *   - the stream's first miss goes as it is (nothing fetched before a
 *     read is timed), and it is known once GUESS_CALLS grains have
 *     been timed;
 *   - a plugin without latency is known to be fast, and gets no grain;
 *   - the grain G is GUESS_PREFERRED where that costs under KNEE reads
 *     (by the model's own costs, give or take the noise), else the
 *     largest power of 2 whose transfer takes at most twice a read's
 *     time (within a factor of 2);
 *   - the preferred size is a power of 2, at least G, at most
 *     PREFERRED_CAP, and within a factor of 4 of L B / 2 (2 L B when
 *     serialized) from the model's own latency and bandwidth (with
 *     its decoding, per byte, as part of the bandwidth: clusters
 *     decoded whole bend the line through two sizes);
 *   - after a slow start (the first 30 calls ten times slower): the
 *     same, but a grain, a preferred size or a fast verdict off the
 *     rule is counted, not failed (the read's time, taken while slow,
 *     is not timed again once grains serve the stream).
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

static int verbose;
static unsigned failures, gaps;
static bool slow_start;         /* the cell's first calls are slow */

static void
failed (const char *name, const struct learn *l, const char *what)
{
  failures++;
  printf ("FAIL %s: %s (known: %s)\n", name, what, l->why);
}

/* The stream: n misses of c->read bytes.  The reads a fetched grain
 * holds are hits, so the next miss is past the grain.  Returns the
 * misses until known (n + 1: never); *first: the first miss's grain.
 */
static unsigned
stream (struct learn *l, const struct cell *c, unsigned n, uint32_t *first)
{
  unsigned i, known = n + 1;
  uint64_t off = 0;

  for (i = 0; i < n; i++) {
    const uint32_t g = learn_grain (l, c->read, 64 << 20);
    const uint64_t size = g ? g : c->read;
    const uint64_t at = g ? off / g * g : off;

    if (i == 0)
      *first = g;
    learn_record (l, LEARN_READ, size, call (&c->p, at, size));
    off = at + size;
    if (known > n && learn_known (l))
      known = i + 1;
  }
  return known;
}

/* The grain the rule gives by the model's own costs. */
static uint64_t
want_grain (const struct plugin *p, uint32_t read)
{
  const double r = cost (p, 0, read), g = cost (p, 0, GUESS_PREFERRED);
  const double npb = (g - r) / (GUESS_PREFERRED - read);
  uint64_t w = 4096;

  if (g <= KNEE * r)
    return GUESS_PREFERRED;
  while (2 * w <= 2 * r / npb && w < GUESS_PREFERRED)
    w *= 2;
  return w;
}

/* Off the rule: a slow start's is a gap, any other a failure. */
static void
off_rule (const char *name, const struct learn *l, const char *what)
{
  if (!slow_start) {
    failed (name, l, what);
    return;
  }
  gaps++;
  if (verbose)
    printf ("GAP %s: %s\n", name, what);
}

static void
check_sizes (const char *name, const struct cell *c, const struct learn *l)
{
  const double tol = 1 + 3 * c->p.noise + 0.05;
  const uint32_t grain = l->sizes.grain;
  const double r = cost (&c->p, 0, c->read);
  const double g2 = cost (&c->p, 0, GUESS_PREFERRED);
  const uint64_t want = want_grain (&c->p, c->read);
  double per_byte;
  uint64_t lb;

  /* Near the knee, either side is the rule within the noise. */
  if (g2 > KNEE * r * tol || g2 * tol < KNEE * r) {
    if (grain > 2 * want || 2 * (uint64_t) grain < want)
      off_rule (name, l, "the grain is off the rule");
  }
  if (l->sizes.preferred < grain || l->sizes.preferred > PREFERRED_CAP ||
      (l->sizes.preferred & (l->sizes.preferred - 1)))
    failed (name, l, "preferred size out of bounds");
  if (l->learnt.ns_per_byte == 0)
    return;
  per_byte = 1 / c->p.bw;
  if (c->p.cluster)
    per_byte += c->p.decode_ns * 1e-9 / c->p.cluster;
  lb = c->p.lat_ns * 1e-9 / per_byte * (c->p.serialize ? 2 : 0.5);
  lb = MIN (MAX (lb, grain), PREFERRED_CAP);
  /* Clusters bend the line through two points: a factor of 4. */
  if (l->sizes.preferred > 4 * lb * tol || l->sizes.preferred * 4 * tol < lb)
    off_rule (name, l, "preferred size far from L B");
}

static void
check (const char *name, const struct cell *c)
{
  struct learn l = { .min = 4096, .parallel = !c->p.serialize };
  const bool fast = cost (&c->p, 0, c->read) < PLUGIN_SLOW_NS;
  uint32_t first;
  unsigned known;

  learn_forget (&l);
  calls = 0;
  known = stream (&l, c, 100, &first);
  if (verbose)
    printf ("%-44s known at %3u: %s\n", name, known, l.why);
  if (first)
    failed (name, &l, "the first miss fetched a grain");
  if (known > GUESS_CALLS + 2) {
    failed (name, &l, "not known once GUESS_CALLS grains were timed");
    return;
  }
  if (fast != l.learnt.fast &&
      fabs (cost (&c->p, 0, c->read) - PLUGIN_SLOW_NS) >
      (c->p.noise + 0.05) * PLUGIN_SLOW_NS)
    off_rule (name, &l, fast ? "a plugin without latency not known fast"
                             : "a plugin with latency known fast");
  if (l.learnt.fast) {
    if (learn_grain (&l, c->read, 64 << 20))
      failed (name, &l, "grains for a fast plugin");
    return;
  }
  check_sizes (name, c, &l);
}

/* A profile's sizes stand until the table knows better; a fast read
 * class gets nothing; a read of BASE_MAX or more, or a grain over the
 * cap, nothing.
 */
static void
check_edges (void)
{
  struct learn l = { .min = 4096, .parallel = true };

  learn_forget (&l);
  learn_teach (&l, &(struct learnt) { .grain = 1 << 20, .flat_ns = 5e6,
                                      .lat_ns = 4e6, .ns_per_byte = 1 });
  if (learn_grain (&l, 65536, 64 << 20) != 1 << 20) {
    failures++;
    printf ("FAIL a profile's grain not used\n");
  }
  if (learn_grain (&l, 65536, 512 << 10) != 0) {
    failures++;
    printf ("FAIL a grain over the cap\n");
  }
  learn_forget (&l);
  learn_record (&l, LEARN_READ, BASE_MAX, 10e6);
  if (learn_grain (&l, BASE_MAX, 64 << 20) != 0) {
    failures++;
    printf ("FAIL a grain for reads of BASE_MAX\n");
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
  check_edges ();
  printf ("%u cells, %u failed, %u slow starts off the rule (known "
          "gaps)\n", cells, failures, gaps);
  return failures ? 1 : 0;
}
