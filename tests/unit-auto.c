/* nbdkit-reshape-filter: reshape-size=auto's decisions (auto.c's core),
 * driven by a simulated plugin.
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Each cell is a plugin (latency, bandwidth, compressed clusters
 * decoded whole, parallel or serializing requests, a noisy machine, a
 * slow start) and a client's stream of small reads.  The stream's
 * misses go through auto_grain exactly as readahead.c sends them, and
 * every plugin call is timed by the model and recorded (auto_record).
 * No clock, no thread: the same seed gives the same run.
 *
 * What must hold in every cell:
 *   - the stream's first miss goes as it is (nothing fetched before a
 *     read is timed), and it is known once GUESS_CALLS grains have
 *     been timed;
 *   - a plugin without latency is known to be fast, and gets no grain;
 *   - the grain G is GUESS_PREFERRED where that costs under KNEE reads
 *     (by the model's own costs, give or take the noise), else the
 *     power of 2 nearest the size whose transfer takes twice a read's
 *     time (within a factor of 2);
 *   - after a slow start (the first 30 calls ten times slower): the
 *     same once the table has forgotten them (3 AGE calls on);
 *   - a plugin that changes is followed: fast then slow gets grains,
 *     slow then fast is known fast, and one that answers a share of
 *     calls from a cache is not taken for fast, each within 3 AGE
 *     calls; under a cap smaller than GUESS_PREFERRED grains are
 *     capped and still known;
 *   - cuts: a client that only writes, over a plugin with latency
 *     and parallel calls, is cut within a few requests; never over a
 *     plugin whose calls cost the same whatever their size, a
 *     serializing one, or clusters decoded whole.
 *
 *   unit-auto [-v] [SEED]
 */

#include <config.h>

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auto.h"

/* A plugin's cost of one call, in ns. */
struct plugin {
  double lat_ns;                /* per call */
  double bw;                    /* bytes per second per call */
  uint64_t cluster;             /* 0: none; else decoded whole */
  double decode_ns;             /* per cluster touched */
  bool serialize;
  double noise;                 /* each call's time times 1 +- this */
  unsigned slow_calls;          /* the first calls move bytes 10x slower */
  unsigned fast_calls;          /* the first calls take 10 us */
  unsigned turn_fast;           /* from this call on, 10 us (0: never) */
  double cached;                /* a share of calls take 10 us */
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

  if (calls < p->fast_calls || (p->turn_fast && calls >= p->turn_fast) ||
      uniform () < p->cached)
    ns = 10e3;
  if (calls++ < p->slow_calls)
    ns += 9 * s * 1e9 / p->bw;
  ns *= 1 + p->noise * (2 * uniform () - 1);
  return ns < 1 ? 1 : (uint64_t) ns;
}

/* One call of bytes took ns, told as the filter tells a batch. */
static void
record (struct auto_core *a, enum auto_dir d, uint64_t bytes, uint64_t ns)
{
  auto_record (a, d, bytes, 1, ns, ns >= PLUGIN_SLOW_NS ? ns : 0);
}

static int verbose;
static unsigned failures;

static void
failed (const char *name, const struct auto_core *a, const char *what)
{
  failures++;
  printf ("FAIL %s: %s (known: %s)\n", name, what, a->why);
}

static bool
known (const struct auto_core *a)
{
  return a->state == AUTO_KNOWN || a->state == AUTO_FAST;
}

/* The stream: n misses of c->read bytes under cap.  The reads a
 * fetched grain holds are hits, so the next miss is past the grain.
 * Returns the misses until known (n + 1: never); *first: the first
 * miss's grain.
 */
static unsigned
stream (struct auto_core *a, const struct cell *c, unsigned n, uint64_t cap,
        uint32_t *first)
{
  unsigned i, at_known = n + 1;
  uint64_t off = 0;

  for (i = 0; i < n; i++) {
    const uint32_t g = auto_grain (a, c->read, cap);
    const uint64_t size = g ? g : c->read;
    const uint64_t at = g ? off / g * g : off;

    if (i == 0 && first)
      *first = g;
    record (a, AUTO_READ, size, call (&c->p, at, size));
    off = (at + size) % (UINT64_C (1) << 40);
    if (at_known > n && known (a))
      at_known = i + 1;
  }
  return at_known;
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
  while (w * 1.41421356 < 2 * r / npb && w < GUESS_PREFERRED)
    w *= 2;
  return w;
}

static void
check_grain (const char *name, const struct cell *c,
             const struct auto_core *a)
{
  const double tol = 1 + 3 * c->p.noise + 0.05;
  const double r = cost (&c->p, 0, c->read);
  const double g2 = cost (&c->p, 0, GUESS_PREFERRED);
  const uint64_t want = want_grain (&c->p, c->read);

  /* Near the knee, either side is the rule within the noise. */
  if ((g2 > KNEE * r * tol || g2 * tol < KNEE * r) &&
      (a->grain > 2 * want || 2 * (uint64_t) a->grain < want))
    failed (name, a, "the grain is off the rule");
}

static void
start (struct auto_core *a, const struct cell *c)
{
  memset (a, 0, sizeof *a);
  a->min = 4096;
  a->parallel = !c->p.serialize;
  auto_forget (a);
  calls = 0;
}

static void
check (const char *name, const struct cell *c)
{
  struct auto_core a;
  const bool fast = cost (&c->p, 0, c->read) < PLUGIN_SLOW_NS;
  const bool slow_start = c->p.slow_calls > 0;
  uint32_t first;
  unsigned at;

  start (&a, c);
  at = stream (&a, c, slow_start ? 3 * AGE : 100, 64 << 20, &first);
  if (verbose)
    printf ("%-44s known at %3u: %s\n", name, at, a.why);
  if (first)
    failed (name, &a, "the first miss fetched a grain");
  if (!slow_start && at > GUESS_CALLS + 2) {
    failed (name, &a, "not known once GUESS_CALLS grains were timed");
    return;
  }
  if (fast != (a.state == AUTO_FAST) &&
      fabs (cost (&c->p, 0, c->read) - PLUGIN_SLOW_NS) >
      (c->p.noise + 0.05) * PLUGIN_SLOW_NS)
    failed (name, &a, fast ? "a plugin without latency not known fast"
                           : "a plugin with latency known fast");
  if (a.state == AUTO_FAST) {
    if (auto_grain (&a, c->read, 64 << 20))
      failed (name, &a, "grains for a fast plugin");
    return;
  }
  check_grain (name, c, &a);
}

/* A plugin that changes, followed within 3 AGE calls. */
static void
check_changes (void)
{
  const struct plugin slow = { .lat_ns = 5e6, .bw = 200e6, .noise = 0.05 };
  struct cell c = { .p = slow, .read = 4096 };
  struct auto_core a;

  c.p.fast_calls = 500;                 /* fast, then slow */
  start (&a, &c);
  stream (&a, &c, 500, 64 << 20, NULL);
  if (a.state != AUTO_FAST)
    failed ("fast then slow", &a, "not fast while fast");
  stream (&a, &c, 3 * AGE, 64 << 20, NULL);
  if (a.state != AUTO_KNOWN || a.grain <= 4096)
    failed ("fast then slow", &a, "no grains once slow");
  c.p = slow;                           /* slow, then fast */
  c.p.turn_fast = 100;
  start (&a, &c);
  stream (&a, &c, 100, 64 << 20, NULL);
  if (a.state != AUTO_KNOWN)
    failed ("slow then fast", &a, "not known while slow");
  stream (&a, &c, 3 * AGE, 64 << 20, NULL);
  if (a.state != AUTO_FAST)
    failed ("slow then fast", &a, "not fast once fast");
  c.p = slow;                           /* a third from a cache */
  c.p.cached = 0.3;
  start (&a, &c);
  stream (&a, &c, 3 * AGE, 64 << 20, NULL);
  if (a.state == AUTO_FAST || auto_grain (&a, 4096, 64 << 20) < 1 << 20)
    failed ("a third cached", &a, "taken for fast");
  c.p = slow;                           /* the cap under 2M */
  start (&a, &c);
  stream (&a, &c, 100, 512 << 10, NULL);
  if (a.state != AUTO_KNOWN || auto_grain (&a, 4096, 512 << 10) != 512 << 10)
    failed ("a 512K cap", &a, "no grains of the cap");
}

/* n requests of count bytes of direction d, cut as auto_cut says, each
 * piece's call timed; the pieces of the last one.
 */
static uint64_t
requests (struct auto_core *a, const struct plugin *p, enum auto_dir d,
          unsigned n, uint64_t count)
{
  uint64_t step = count;
  unsigned i, j;

  for (i = 0; i < n; i++) {
    step = auto_cut (a, d, count, 32 << 20, 8, 1, false);
    for (j = 0; j < count / step; j++)
      record (a, d, step, call (p, i * count + j * step, step));
  }
  return count / step;
}

static void
check_cuts (void)
{
  static const struct { const char *name; struct plugin p; bool cut; } t[] = {
    { "writes, 1 ms + 400 MB/s", { .lat_ns = 1e6, .bw = 400e6 }, true },
    { "writes, 20 ms + 100 MB/s", { .lat_ns = 20e6, .bw = 100e6 }, true },
    { "writes, 5 ms whatever their size", { .lat_ns = 5e6, .bw = 1e15 },
      false },
    { "reads, 2M clusters", { .lat_ns = 100e3, .bw = 1e12,
                              .cluster = 2 << 20, .decode_ns = 8e6 }, false },
  };
  struct auto_core a;
  unsigned i;

  for (i = 0; i < sizeof t / sizeof *t; i++) {
    const struct cell c = { .p = t[i].p };
    const enum auto_dir d = t[i].p.cluster ? AUTO_READ : AUTO_WRITE;
    start (&a, &c);
    if ((requests (&a, &t[i].p, d, 4, 2 << 20) > 1) != t[i].cut)
      failed (t[i].name, &a, t[i].cut ? "not cut" : "cut");
    a.parallel = false;
    if (auto_cut (&a, d, 2 << 20, 32 << 20, 1, 1, false) != 2 << 20)
      failed (t[i].name, &a, "cut with one lane");
  }
}

/* Reads of half GUESS_PREFERRED or more get no grain. */
static void
check_edges (void)
{
  struct auto_core a;
  const struct cell c = { .p = { .lat_ns = 5e6, .bw = 100e6 } };

  start (&a, &c);
  record (&a, AUTO_READ, GUESS_PREFERRED / 2, 10e6);
  if (auto_grain (&a, GUESS_PREFERRED / 2, 64 << 20) != 0)
    failed ("edges", &a, "a grain for reads of a 1M");
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
    check (name, &c);
    cells++;
  }
  check_changes ();
  check_cuts ();
  check_edges ();
  printf ("%u cells and 12 cases, %u failed\n", cells, failures);
  return failures ? 1 : 0;
}
