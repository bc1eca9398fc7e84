/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * reshape-size=auto.  Per export, the filter learns the cost of a
 * plugin call by its size, and picks its sizes from that:
 *
 *   tune.c     what is learnt, and the sizes picked from it;
 *   probe.c    how: reads of growing size, timed, at the first
 *              connection to the export;
 *   cut.c      where requests are cut, weighed by what was learnt and
 *              measured while serving;
 *   profile.c  what was learnt, kept across restarts.
 *
 * The probe finds a grain G (the cost of a call is flat up to G), a
 * per-call cost L and the bandwidth B of one stream.
 * From them:
 *
 *   - grain G: no request is cut into pieces smaller than G (each
 *     piece would cost a whole grain), and small sequential reads are
 *     fetched as the aligned G block that holds them (it costs no more
 *     than the small read);
 *   - preferred P, told to clients and used as the unit of staging and
 *     readahead: the power of 2 nearest L B / 2, where a call's
 *     transfer takes half its fixed cost (2 L B if the plugin
 *     serializes requests: nothing overlaps), at least G, at most 8M
 *     (clients size their buffers by it and keep many requests in
 *     flight, which overlap the latency: beyond that, larger requests
 *     only cost buffers and caches).  A plugin
 *     without latency is told 64K: below that, the server's and the
 *     client's cost per request dominates whatever the plugin does.
 *
 * Everything learnt is kept per export name until the filter is
 * unloaded, and shown in the statistics report.
 */

#include <config.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nbdkit-filter.h>

#include "common.h"
#include "params.h"
#include "tune.h"

/* -D reshape.tune=1: the probe and every decision that changes. */
NBDKIT_DLL_PUBLIC int reshape_debug_tune;

#define PREFERRED_CAP (8 * 1024 * 1024)
#define FAST_PREFERRED (64 * 1024)

static struct {
  pthread_mutex_t lock;
  struct tune *list;
} all = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* The filter's calls to the plugin in flight, every export's (exports
 * may share what the plugin serves from), atomic; the probe's own are
 * not counted.  Only reshape-size=auto probes: a fixed size skips the
 * counting (the setting never changes while calls are in flight, so
 * begin and end agree).
 */
static unsigned plugin_in_flight;

void
tune_plugin_begin (void)
{
  if (reshape_cfg.size == 0)
    __atomic_add_fetch (&plugin_in_flight, 1, __ATOMIC_RELAXED);
}

void
tune_plugin_end (void)
{
  if (reshape_cfg.size == 0)
    __atomic_sub_fetch (&plugin_in_flight, 1, __ATOMIC_RELAXED);
}

bool
tune_plugin_busy (void)
{
  return __atomic_load_n (&plugin_in_flight, __ATOMIC_RELAXED) > 0;
}

struct tune *
tune_get (const char *exportname)
{
  struct tune *t;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&all.lock);

  for (t = all.list; t; t = t->next)
    if (strcmp (t->name, exportname) == 0)
      return t;
  t = calloc (1, sizeof *t);
  if (t == NULL || (t->name = strdup (exportname)) == NULL) {
    free (t);
    nbdkit_error ("reshape: tune: %m");
    return NULL;
  }
  pthread_mutex_init (&t->lock, NULL);
  /* Waited for with a time limit (probe.c): on the monotonic clock,
   * which a clock set back cannot stretch.
   */
  {
    pthread_condattr_t ca;
    pthread_condattr_init (&ca);
    pthread_condattr_setclock (&ca, CLOCK_MONOTONIC);
    pthread_cond_init (&t->known, &ca);
    pthread_condattr_destroy (&ca);
  }
  t->next = all.list;
  all.list = t;
  return t;
}

void
tune_free_all (void)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&all.lock);

  while (all.list) {
    struct tune *t = all.list;
    all.list = t->next;
    pthread_cond_destroy (&t->known);
    pthread_mutex_destroy (&t->lock);
    free (t->name);
    free (t);
  }
}

void
tune_each (void (*fn) (struct tune *t, void *opaque), void *opaque)
{
  struct tune *t;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&all.lock);

  for (t = all.list; t; t = t->next)
    fn (t, opaque);
}

void
tune_choose_sizes (struct tune *t)
{
  const struct cut_model m = probed (t);
  uint64_t p;

  if (t->fast) {
    t->sizes = (struct tune_sizes) { .preferred = FAST_PREFERRED };
    snprintf (t->why, sizeof t->why,
              "smallest read in %.0f us: no latency; clients told %uK, "
              "requests not cut", t->lat_ns / 1000,
              FAST_PREFERRED / 1024);
    return;
  }
  /* Where a call's transfer takes half its fixed cost, s = L B / 2:
   * clients keep many requests in flight, nbdkit's threads overlap
   * the latency, and beyond that larger requests only cost the client
   * buffers and the caches (measured with nbdcopy: over 20 ms +
   * 100 MB/s, fastest at 1M, L B = 2M; over 1 ms + 400 MB/s, at
   * 256K-512K, L B = 400K).  A plugin that serializes requests
   * overlaps nothing within a connection: there a call should carry
   * twice its fixed cost in transfer, s = 2 L B (measured over a
   * serialized 1 ms + 400 MB/s: 1M-2M fastest for nbdcopy and
   * qemu-img, 256K a third slower).  The power of 2 nearest, at least
   * G, at most PREFERRED_CAP.
   */
  if (t->ns_per_byte > 0)
    p = pow2_nearest (t->grain, t->lat_ns / t->ns_per_byte *
                      (reshape_cfg.parallel_ok ? 0.5 : 2), PREFERRED_CAP);
  else
    p = max_u64 (t->grain, PREFERRED_CAP);
  p = min_u64 (p, PREFERRED_CAP);
  t->sizes = (struct tune_sizes) {
    .preferred = p, .unit = p, .grain = t->grain,
  };
  snprintf (t->why, sizeof t->why,
            "cost flat up to %" PRIu32 "K (%.2f ms), then %.2f ms + "
            "%.0f MB/s per stream: clients told %" PRIu64 "K",
            t->grain / 1024, model_ns (&m, t->grain) / 1e6, t->lat_ns / 1e6,
            t->ns_per_byte > 0 ? 1e3 / t->ns_per_byte : 0.0, p / 1024);
}

/* Is t's model there to use?  Its fields are written, under the lock,
 * before measured is set (publish), and never change afterwards while
 * connections use them, so a reader that saw measured under the lock
 * reads them whole without it.  (The lock rather than an atomic flag:
 * a probe beside the connections publishes while they run, and
 * helgrind sees only locks.)
 */
static bool
model_ready (struct tune *t)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);
  return t->measured;
}

/* The sizes are set once, before measured (model_ready). */
void
tune_sizes (struct tune *t, struct tune_sizes *s)
{
  if (model_ready (t))
    *s = t->sizes;
  else
    *s = (struct tune_sizes) { 0 };
}

/* While a probe goes on beside the connections: beside_hint's. */
void
tune_start_sizes (struct tune *t, struct tune_sizes *s)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);

  if (t->measured)
    *s = t->sizes;
  else if (t->beside)
    *s = (struct tune_sizes) { .preferred = t->hint };
  else
    *s = (struct tune_sizes) { 0 };
}

void
tune_record (struct tune *t, enum tune_dir d, uint64_t bytes, uint64_t ns)
{
  struct cost *c = &t->table[d][class_of (bytes)];

  __atomic_fetch_add (&c->calls, 1, __ATOMIC_RELAXED);
  __atomic_fetch_add (&c->bytes, bytes, __ATOMIC_RELAXED);
  __atomic_fetch_add (&c->ns, ns, __ATOMIC_RELAXED);
}

static void
report_one (struct tune *t, void *fpv)
{
  FILE *fp = fpv;
  static const char *const dirs[TUNE_DIRS] = { "reads", "writes" };
  unsigned d, c;

  fprintf (fp, "\nreshape-size=auto, export '%s': %s\n", t->name, t->why);
  if (t->sizes.preferred)
    fprintf (fp, "  preferred %" PRIu32 "K, unit %" PRIu32 "K, "
             "grain %" PRIu32 "K\n", t->sizes.preferred / 1024,
             t->sizes.unit / 1024, t->sizes.grain / 1024);
  if (t->probe_reads)
    fprintf (fp, "  probe: %u reads\n", t->probe_reads);
  fprintf (fp, "  %-8s %8s %10s %10s %10s %10s\n", "", "size", "probe ms",
           "calls", "mean ms", "MB/s");
  for (d = 0; d < TUNE_DIRS; d++)
    for (c = 0; c < NCLASSES; c++) {
      const struct cost *k = &t->table[d][c];
      if (k->calls == 0 && (d != TUNE_READ || t->probe_ns[c] == 0))
        continue;
      fprintf (fp, "  %-8s %7" PRIu64 "K %10.3f %10" PRIu64 " %10.3f "
               "%10.1f\n", dirs[d], class_bytes (c) / 1024,
               d == TUNE_READ ? t->probe_ns[c] / 1e6 : 0.0, k->calls,
               k->calls ? (double) k->ns / k->calls / 1e6 : 0.0,
               k->ns ? (double) k->bytes / k->ns * 1e3 : 0.0);
    }
  for (d = 0; d < TUNE_DIRS; d++)
    for (c = 0; c < NCLASSES; c++) {
      const struct bandit *b = &t->bandits[d][c];
      if (!b->used)
        continue;
      fprintf (fp, "  %s of %" PRIu64 "K+: %s (whole %.3f, cut %.3f ns "
               "per byte, %u/%u samples, %u switches)\n", dirs[d],
               class_bytes (c) / 1024, b->cut ? "cut" : "whole",
               b->ns_per_byte[0], b->ns_per_byte[1], b->samples[0],
               b->samples[1], b->switches);
    }
}

void
tune_report (FILE *fp)
{
  tune_each (report_one, fp);
}
