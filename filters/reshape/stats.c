/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * The report shows at a glance how request sizes were reshaped: client
 * and plugin requests side by side, by size class.
 */

#include <config.h>

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nbdkit-filter.h>

#include "stats.h"

enum {
  BUCKETS = 33,                         /* log2 of 0 .. 4G */
  BAR = 24,                             /* widest histogram bar */
};

struct opstats {
  uint64_t count, bytes;
  uint64_t hist[BUCKETS];
};

static struct opstats client[OP_COUNT], plugin[OP_COUNT];
static uint64_t counters[C_COUNTERS];

static const char *const op_names[OP_COUNT] = {
  "pread", "pwrite", "zero", "trim", "cache", "extents", "flush",
};

static const char *const counter_names[C_COUNTERS] = {
  [C_SPLITS] = "requests split",
  [C_PARALLEL_READS] = "split reads run in parallel",
  [C_PARALLEL_WRITES] = "split writes run in parallel",
  [C_RMW_READS] = "partial blocks read",
  [C_RMW_WRITES] = "read-modify-writes",
  [C_LOCK_WAITS] = "range lock waits",
  [C_FUA_FLUSHES] = "flushes standing in for FUA",
  [C_RA_HITS] = "readahead hits",
  [C_RA_MISSES] = "readahead fills",
  [C_RA_FILLED] = "bytes read ahead",
  [C_RA_WINDOW] = "readahead window high-water (bytes)",
  [C_RA_GRAINS] = "grains fetched for streams (auto)",
  [C_RA_AHEAD] = "grains fetched ahead of pipelined streams",
  [C_RA_LOST] = "readahead fills not kept",
  [C_RA_UNREAD] = "bytes read ahead that no client read",
  [C_RA_REFUSED] = "readahead fills over budget (not made)",
  [C_RA_CACHED] = "bytes cached for cache requests",
  [C_CUT_SWITCHES] = "cut-or-whole choices changed (auto)",
  [C_WB_STAGED] = "bytes staged (write-back)",
  [C_WB_WRITTEN] = "staged bytes written back",
  [C_WB_FAILED] = "write-backs failed (kept staged)",
  [C_WB_LOST] = "staged bytes lost at close",
  [C_POOL_ALLOCS] = "pool buffers allocated",
  [C_POOL_REUSES] = "pool buffers reused",
  [C_POOL_WAITS] = "pool waits at the cap",
  [C_POOL_HIGH] = "pool high-water (bytes)",
  [C_SOCK_RAISED] = "client sockets raised",
  [C_SOCK_OBTAINED] = "socket send buffer obtained (bytes)",
};

static unsigned
bucket (uint64_t bytes)
{
  unsigned b = 0;

  while (b + 1 < BUCKETS && (bytes >> (b + 1)) != 0)
    b++;
  return b;
}

static void
account (struct opstats *s, uint64_t bytes)
{
  __atomic_fetch_add (&s->count, 1, __ATOMIC_RELAXED);
  __atomic_fetch_add (&s->bytes, bytes, __ATOMIC_RELAXED);
  __atomic_fetch_add (&s->hist[bucket (bytes)], 1, __ATOMIC_RELAXED);
}

void
stats_client (enum stats_op op, uint64_t bytes)
{
  account (&client[op], bytes);
}

void
stats_plugin (enum stats_op op, uint64_t bytes)
{
  account (&plugin[op], bytes);
}

void
stats_add (enum stats_counter c, uint64_t n)
{
  __atomic_fetch_add (&counters[c], n, __ATOMIC_RELAXED);
}

void
stats_max (enum stats_counter c, uint64_t v)
{
  uint64_t old = __atomic_load_n (&counters[c], __ATOMIC_RELAXED);

  while (v > old &&
         !__atomic_compare_exchange_n (&counters[c], &old, v, false,
                                       __ATOMIC_RELAXED, __ATOMIC_RELAXED))
    ;
}

/* 4096 -> "4K", 1536 -> "1.5K". */
static const char *
human (uint64_t v, char *buf, size_t len)
{
  static const char units[] = "KMGT";
  double d = v;
  int u = -1;

  while (d >= 1024 && u < 3) {
    d /= 1024;
    u++;
  }
  if (u < 0)
    snprintf (buf, len, "%" PRIu64, v);
  else if (d == (uint64_t) d)
    snprintf (buf, len, "%" PRIu64 "%c", (uint64_t) d, units[u]);
  else
    snprintf (buf, len, "%.1f%c", d, units[u]);
  return buf;
}

static void
bar (FILE *fp, uint64_t n, uint64_t scale)
{
  unsigned w = scale ? (unsigned) ((n * BAR + scale - 1) / scale) : 0;

  fprintf (fp, "%-*.*s", BAR, w, "########################################");
}

/* Side by side, one line per size class either side used. */
static void
histogram (FILE *fp, enum stats_op op)
{
  const struct opstats *c = &client[op], *p = &plugin[op];
  uint64_t scale = 0;
  char b[32];
  unsigned i;

  for (i = 0; i < BUCKETS; i++) {
    if (c->hist[i] > scale) scale = c->hist[i];
    if (p->hist[i] > scale) scale = p->hist[i];
  }
  fprintf (fp, "\n%s sizes     %-*s  %-*s\n", op_names[op],
           BAR + 10, "client requests", BAR + 10, "plugin requests");
  for (i = 0; i < BUCKETS; i++) {
    if (c->hist[i] == 0 && p->hist[i] == 0)
      continue;
    fprintf (fp, "  %6s+  ", human ((uint64_t) 1 << i, b, sizeof b));
    bar (fp, c->hist[i], scale);
    fprintf (fp, " %9" PRIu64 "  ", c->hist[i]);
    bar (fp, p->hist[i], scale);
    fprintf (fp, " %9" PRIu64 "\n", p->hist[i]);
  }
}

static void
write_report (FILE *fp)
{
  char b1[32], b2[32];
  unsigned op, i;

  fprintf (fp, "nbdkit-reshape-filter statistics\n\n");
  fprintf (fp, "%-8s %16s %10s %16s %10s\n",
           "op", "client requests", "bytes", "plugin requests", "bytes");
  for (op = 0; op < OP_COUNT; op++)
    fprintf (fp, "%-8s %16" PRIu64 " %10s %16" PRIu64 " %10s\n",
             op_names[op], client[op].count,
             human (client[op].bytes, b1, sizeof b1),
             plugin[op].count, human (plugin[op].bytes, b2, sizeof b2));
  for (op = 0; op < OP_COUNT; op++)
    if (op != OP_FLUSH && (client[op].count || plugin[op].count))
      histogram (fp, op);
  fprintf (fp, "\n");
  for (i = 0; i < C_COUNTERS; i++)
    fprintf (fp, "%-38s %" PRIu64 "\n", counter_names[i], counters[i]);
}

void
stats_report (const char *file, void (*more) (FILE *fp))
{
  char *text = NULL, *line, *save = NULL;
  size_t len = 0;
  FILE *fp = open_memstream (&text, &len);

  if (fp == NULL)
    return;
  write_report (fp);
  if (more)
    more (fp);
  fclose (fp);
  if (file) {
    FILE *out = fopen (file, "w");
    if (out == NULL)
      nbdkit_error ("reshape-stats: %s: %m", file);
    else {
      bool ok = fputs (text, out) != EOF;
      if (fclose (out) == EOF || !ok)
        nbdkit_error ("reshape-stats: %s: %m", file);
    }
  }
  for (line = strtok_r (text, "\n", &save); line;
       line = strtok_r (NULL, "\n", &save))
    nbdkit_debug ("reshape: %s", line);
  free (text);
}
