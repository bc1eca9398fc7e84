/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * The report answers first whether the filter helped: a summary of
 * what clients asked for against what the plugin was sent, then the
 * size histograms side by side, then the counters that moved.  A file
 * named *.json gets the same as JSON, for scripts.
 */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>

#include <nbdkit-filter.h>

#include "common.h"
#include "files.h"
#include "stats.h"

enum {
  BUCKETS = 33,                         /* log2 of 0 .. 4G */
  BAR = 24,                             /* widest histogram bar */
  LABEL = 36,                           /* width of a counter's label */
};

struct opstats {
  uint64_t count, bytes;
  uint64_t hist[BUCKETS];
};

static struct opstats client[OP_COUNT], plugin[OP_COUNT];
static uint64_t counters[C_COUNTERS];
/* CLOCK_MONOTONIC ns: the server's start, the first and last client
 * requests (0: none yet).
 */
static uint64_t started_ns, first_ns, last_ns;

static const char *const op_names[OP_COUNT] = {
  "pread", "pwrite", "zero", "trim", "cache", "extents", "flush",
};

/* Each counter's label in the text, its key in JSON, and whether it
 * counts bytes (shown as a size).
 */
static const struct {
  const char *label, *key;
  bool bytes;
} counter_info[C_COUNTERS] = {
  [C_SPLITS] = { "requests split", "requests_split" },
  [C_PARALLEL_READS] = { "split reads run in parallel",
                         "split_reads_parallel" },
  [C_PARALLEL_WRITES] = { "split writes run in parallel",
                          "split_writes_parallel" },
  [C_RMW_READS] = { "partial blocks read", "partial_blocks_read" },
  [C_RMW_WRITES] = { "read-modify-writes", "read_modify_writes" },
  [C_PAD_BYTES] = { "partial block padding read", "padding_bytes", true },
  [C_LOCK_WAITS] = { "range lock waits", "range_lock_waits" },
  [C_FUA_FLUSHES] = { "flushes standing in for FUA", "fua_flushes" },
  [C_RA_HITS] = { "readahead hits", "readahead_hits" },
  [C_RA_MISSES] = { "readahead fills", "readahead_fills" },
  [C_RA_FILLED] = { "read ahead", "readahead_bytes", true },
  [C_RA_AHEAD] = { "readahead fills made ahead",
                   "readahead_fills_ahead" },
  [C_RA_LOST] = { "readahead fills not kept", "readahead_fills_lost" },
  [C_RA_UNREAD] = { "read ahead, never read", "readahead_unread_bytes",
                    true },
  [C_RA_REFUSED] = { "readahead fills over budget",
                     "readahead_fills_refused" },
  [C_RA_CACHED] = { "cached for cache requests", "cached_bytes", true },
  [C_WB_STAGED] = { "staged (write-back)", "staged_bytes", true },
  [C_WB_WRITTEN] = { "staged, written back", "written_back_bytes", true },
  [C_WB_FAILED] = { "write-backs failed (kept staged)",
                    "write_backs_failed" },
  [C_WB_LOST] = { "staged, lost at a last close", "staged_lost_bytes",
                  true },
  [C_POOL_ALLOCS] = { "pool buffers allocated", "pool_allocs" },
  [C_POOL_REUSES] = { "pool buffers reused", "pool_reuses" },
  [C_POOL_WAITS] = { "pool waits at the cap", "pool_waits" },
  [C_POOL_HIGH] = { "pool high-water", "pool_high_bytes", true },
  [C_SOCK_RAISED] = { "client sockets raised", "sockets_raised" },
  [C_SOCK_OBTAINED] = { "socket send buffer obtained",
                        "socket_sndbuf_bytes", true },
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
stats_start (void)
{
  started_ns = now_ns ();
}

/* *p = the least (or most) of *p and v; 0 in *p: none yet. */
static void
atomic_min (uint64_t *p, uint64_t v)
{
  uint64_t old = __atomic_load_n (p, __ATOMIC_RELAXED);

  while ((old == 0 || v < old) &&
         !__atomic_compare_exchange_n (p, &old, v, false,
                                       __ATOMIC_RELAXED, __ATOMIC_RELAXED))
    ;
}

static void
atomic_max (uint64_t *p, uint64_t v)
{
  uint64_t old = __atomic_load_n (p, __ATOMIC_RELAXED);

  while (v > old &&
         !__atomic_compare_exchange_n (p, &old, v, false,
                                       __ATOMIC_RELAXED, __ATOMIC_RELAXED))
    ;
}

void
stats_client (enum stats_op op, uint64_t bytes)
{
  const uint64_t t = now_ns ();

  account (&client[op], bytes);
  atomic_min (&first_ns, t);
  atomic_max (&last_ns, t);
}

uint64_t
stats_client_read (void)
{
  return __atomic_load_n (&client[OP_PREAD].bytes, __ATOMIC_RELAXED);
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
  atomic_max (&counters[c], v);
}

/* 100 -> "100", 4096 -> "4K", 1536 -> "1.5K". */
const char *
stats_human (uint64_t v, char *buf, size_t len)
{
  static const char units[] = "KMGTPE";
  double d = v;
  int u = -1;

  while (d >= 1024 && u < 5) {
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

/* The length of the valid UTF-8 sequence at s, 0 if none: no
 * overlong forms, no surrogates (U+D800-DFFF), nothing past U+10FFFF
 * (RFC 3629), so that a JSON parser takes what is written.
 */
static size_t
utf8_len (const unsigned char *s)
{
  unsigned char lo = 0x80, hi = 0xbf;   /* the second byte's range */
  size_t n, i;

  if (s[0] < 0x80)
    return 1;
  if (s[0] >= 0xc2 && s[0] <= 0xdf)
    n = 2;
  else if (s[0] >= 0xe0 && s[0] <= 0xef) {
    n = 3;
    if (s[0] == 0xe0)
      lo = 0xa0;
    else if (s[0] == 0xed)
      hi = 0x9f;
  }
  else if (s[0] >= 0xf0 && s[0] <= 0xf4) {
    n = 4;
    if (s[0] == 0xf0)
      lo = 0x90;
    else if (s[0] == 0xf4)
      hi = 0x8f;
  }
  else
    return 0;
  if (s[1] < lo || s[1] > hi)
    return 0;
  for (i = 2; i < n; i++)
    if ((s[i] & 0xc0) != 0x80)
      return 0;
  return n;
}

/* A client's export name need not be UTF-8, and JSON must be: a byte
 * that is not part of a valid sequence is written as U+FFFD.  False
 * if one was (then the caller writes the bytes too, stats_json_hex).
 */
bool
stats_json_string (FILE *fp, const char *str)
{
  const unsigned char *s = (const unsigned char *) str;
  bool exact = true;
  size_t n;

  fputc ('"', fp);
  while (*s) {
    if (*s == '"' || *s == '\\')
      fprintf (fp, "\\%c", *s);
    else if (*s < 0x20 || *s == 0x7f)
      fprintf (fp, "\\u%04x", *s);
    else if ((n = utf8_len (s)) == 0) {
      fputs ("\\ufffd", fp);
      exact = false;
    }
    else {
      fwrite (s, 1, n, fp);
      s += n;
      continue;
    }
    s++;
  }
  fputc ('"', fp);
  return exact;
}

/* The bytes of str, in hex, as a JSON string. */
void
stats_json_hex (FILE *fp, const char *str)
{
  const unsigned char *s = (const unsigned char *) str;

  fputc ('"', fp);
  for (; *s; s++)
    fprintf (fp, "%02x", *s);
  fputc ('"', fp);
}

/* A client's export name in the text report, quoted: bytes that are
 * not printable UTF-8, the quote and the backslash as \xNN, so that a
 * name cannot add a line of its own.
 */
void
stats_text_name (FILE *fp, const char *str)
{
  const unsigned char *s = (const unsigned char *) str;
  size_t n;

  fputc ('\'', fp);
  while (*s) {
    if (*s < 0x20 || *s == 0x7f || *s == '\'' || *s == '\\' ||
        (n = utf8_len (s)) == 0 ||
        (s[0] == 0xc2 && s[1] < 0xa0))  /* C1 controls: NEL etc. */
      fprintf (fp, "\\x%02x", *s++);
    else {
      fwrite (s, 1, n, fp);
      s += n;
    }
  }
  fputc ('\'', fp);
}

char *
stats_log_name (const char *name)
{
  char *buf = NULL;
  size_t len;
  FILE *fp = open_memstream (&buf, &len);

  if (fp == NULL)
    return NULL;
  stats_text_name (fp, name);
  if (fclose (fp) != 0) {
    free (buf);
    return NULL;
  }
  return buf;
}

/* Seconds from the first to the last client request. */
static double
active_s (void)
{
  return first_ns ? (last_ns - first_ns) / 1e9 : 0;
}

static double
up_s (void)
{
  return started_ns ? (now_ns () - started_ns) / 1e9 : 0;
}

/* One side of an op's summary row: "16384     64M  19.9M/s". */
static void
side (FILE *fp, enum stats_op op, const struct opstats *s)
{
  char b1[32], b2[32];
  double secs = active_s ();

  if (op == OP_FLUSH) {
    fprintf (fp, " %7" PRIu64 " %6s %8s", s->count, "", "");
    return;
  }
  if (secs >= 0.001)
    snprintf (b2, sizeof b2, "%s/s",
              stats_human ((uint64_t) (s->bytes / secs), b1, sizeof b1));
  else
    snprintf (b2, sizeof b2, "-");
  fprintf (fp, " %7" PRIu64 " %6s %8s", s->count,
           stats_human (s->bytes, b1, sizeof b1), b2);
}

/* "pread  16384  64M  19.9M/s    223  65M  20.2M/s   73.5:1" */
static void
summary_op (FILE *fp, enum stats_op op)
{
  const struct opstats *c = &client[op], *p = &plugin[op];
  char ratio[32];

  fprintf (fp, "  %-7s", op_names[op]);
  side (fp, op, c);
  fprintf (fp, " ");
  side (fp, op, p);
  if (p->count && c->count >= p->count)
    snprintf (ratio, sizeof ratio, "%.1f:1", (double) c->count / p->count);
  else if (c->count)
    snprintf (ratio, sizeof ratio, "1:%.1f", (double) p->count / c->count);
  else
    snprintf (ratio, sizeof ratio, "-");
  fprintf (fp, " %13s\n", ratio);
}

/* Bytes the plugin was asked to read that no client asked for: what
 * the filter counts (padding, fills never read), or, if more, what the
 * plugin read beyond the clients' reads and cache requests.
 */
static uint64_t
unasked_bytes (void)
{
  const uint64_t counted = counters[C_PAD_BYTES] + counters[C_RA_UNREAD];
  const uint64_t asked = client[OP_PREAD].bytes + client[OP_CACHE].bytes;
  const uint64_t read = plugin[OP_PREAD].bytes;

  return read > asked && read - asked > counted ? read - asked : counted;
}

static void
write_summary (FILE *fp, uint32_t fixed_size,
               const struct stats_learning *learning)
{
  char b1[32], b2[32];
  uint64_t asked = client[OP_PREAD].bytes;
  unsigned op;

  fprintf (fp, "nbdkit-reshape-filter statistics\n\n");
  fprintf (fp, "%.2f s from the first client request to the last "
           "(server up %.2f s)\n", active_s (), up_s ());
  fprintf (fp, "%9s%-24s %-24s %13s\n", "", "     client requests",
           "     plugin requests", "client:plugin");
  for (op = 0; op < OP_COUNT; op++)
    if (client[op].count || plugin[op].count)
      summary_op (fp, op);
  fprintf (fp, "unasked: %s read that no client asked for",
           stats_human (unasked_bytes (), b1, sizeof b1));
  if (asked)
    fprintf (fp, ", %.1f%% of the %s that clients read", 100.0 *
             unasked_bytes () / asked, stats_human (asked, b2, sizeof b2));
  fprintf (fp, "\n");
  if (learning)
    learning->summary (fp);
  else
    fprintf (fp, "size: fixed %s (reshape-size)\n",
             stats_human (fixed_size, b1, sizeof b1));
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
  fprintf (fp, "\n%s sizes     %-*s  %s\n", op_names[op],
           BAR + 10, "client requests", "plugin requests");
  for (i = 0; i < BUCKETS; i++) {
    if (c->hist[i] == 0 && p->hist[i] == 0)
      continue;
    fprintf (fp, "  %6s+  ", stats_human ((uint64_t) 1 << i, b, sizeof b));
    bar (fp, c->hist[i], scale);
    fprintf (fp, " %9" PRIu64 "  ", c->hist[i]);
    bar (fp, p->hist[i], scale);
    fprintf (fp, " %9" PRIu64 "\n", p->hist[i]);
  }
}

static void
write_text (FILE *fp, uint32_t fixed_size,
            const struct stats_learning *learning)
{
  char b[32];
  bool any = false;
  unsigned op, i;

  write_summary (fp, fixed_size, learning);
  for (op = 0; op < OP_COUNT; op++)
    if (op != OP_FLUSH && (client[op].count || plugin[op].count))
      histogram (fp, op);
  for (i = 0; i < C_COUNTERS; i++) {
    if (counters[i] == 0)
      continue;
    if (!any)
      fprintf (fp, "\ncounters (those not zero)\n");
    any = true;
    if (counter_info[i].bytes)
      stats_human (counters[i], b, sizeof b);
    else
      snprintf (b, sizeof b, "%" PRIu64, counters[i]);
    fprintf (fp, "  %-*s %10s\n", LABEL, counter_info[i].label, b);
  }
  if (learning)
    learning->tables (fp);
}

static void
json_side (FILE *fp, const struct opstats *s)
{
  const char *sep = "";
  unsigned i;

  fprintf (fp, "{\"requests\": %" PRIu64 ", \"bytes\": %" PRIu64
           ", \"sizes\": {", s->count, s->bytes);
  for (i = 0; i < BUCKETS; i++)
    if (s->hist[i]) {
      fprintf (fp, "%s\"%" PRIu64 "\": %" PRIu64, sep, (uint64_t) 1 << i,
               s->hist[i]);
      sep = ", ";
    }
  fprintf (fp, "}}");
}

static void
write_json (FILE *fp, uint32_t fixed_size,
            const struct stats_learning *learning)
{
  unsigned op, i;

  fprintf (fp, "{\n  \"schema\": 1,\n");
  fprintf (fp, "  \"elapsed_s\": %.3f,\n  \"up_s\": %.3f,\n",
           active_s (), up_s ());
  fprintf (fp, "  \"ops\": {");
  for (op = 0; op < OP_COUNT; op++) {
    fprintf (fp, "%s\n    \"%s\": {\"client\": ", op ? "," : "",
             op_names[op]);
    json_side (fp, &client[op]);
    fprintf (fp, ", \"plugin\": ");
    json_side (fp, &plugin[op]);
    fprintf (fp, "}");
  }
  fprintf (fp, "\n  },\n  \"unasked_bytes\": %" PRIu64 ",\n",
           unasked_bytes ());
  fprintf (fp, "  \"counters\": {");
  for (i = 0; i < C_COUNTERS; i++)
    fprintf (fp, "%s\n    \"%s\": %" PRIu64, i ? "," : "",
             counter_info[i].key, counters[i]);
  fprintf (fp, "\n  },\n");
  if (learning) {
    fprintf (fp, "  \"size\": \"auto\",\n  \"exports\": ");
    learning->json (fp);
  }
  else
    fprintf (fp, "  \"size\": %" PRIu32 ",\n  \"exports\": []", fixed_size);
  fprintf (fp, "\n}\n");
}

static bool
is_json (const char *file)
{
  size_t n = file ? strlen (file) : 0;

  return n >= 5 && strcmp (file + n - 5, ".json") == 0;
}

/* Replaced whole (files.c): a reader never sees half a report. */
static void
save (const char *file, const char *text)
{
  char *tmp;
  FILE *out = replace_open (file, &tmp);
  bool ok;

  if (out == NULL) {
    nbdkit_error ("reshape-stats: %s: %m", file);
    return;
  }
  ok = fputs (text, out) != EOF;
  if (replace_commit (out, tmp, file) == -1 || !ok)
    nbdkit_error ("reshape-stats: %s: %m", file);
}

/* Nothing is opened before the exit's report, so a server that fails
 * to start leaves the file as it was.  A symlink is refused: the report
 * replaces the name it is given, and would replace the link, not what
 * it points to, which the user more likely meant.
 */
int
stats_check (const char *file)
{
  struct stat st;

  if (lstat (file, &st) == 0) {
    if (S_ISLNK (st.st_mode)) {
      nbdkit_error ("reshape-stats: %s is a symbolic link; accepted: a "
                    "regular file or a new name", file);
      return -1;
    }
    if (!S_ISREG (st.st_mode)) {
      nbdkit_error ("reshape-stats: %s is not a regular file; accepted: "
                    "a regular file or a new name", file);
      return -1;
    }
  }
  else if (errno != ENOENT) {
    nbdkit_error ("reshape-stats: %s: %m", file);
    return -1;
  }
  if (dir_writable (file) == -1) {
    nbdkit_error ("reshape-stats: cannot write '%s' (its directory: %m)",
                  file);
    return -1;
  }
  return 0;
}

void
stats_report (const char *file, uint32_t fixed_size,
              const struct stats_learning *learning)
{
  char *text = NULL, *line, *save_ptr = NULL;
  size_t len = 0;
  FILE *fp = open_memstream (&text, &len);

  if (fp == NULL)
    return;
  if (is_json (file)) {
    write_json (fp, fixed_size, learning);
    fclose (fp);
    save (file, text);
    free (text);
    text = NULL;
    fp = open_memstream (&text, &len);
    if (fp == NULL)
      return;
    file = NULL;
  }
  write_text (fp, fixed_size, learning);
  fclose (fp);
  if (file)
    save (file, text);
  /* The text goes to the debug log too (-v). */
  for (line = strtok_r (text, "\n", &save_ptr); line;
       line = strtok_r (NULL, "\n", &save_ptr))
    nbdkit_debug ("reshape: %s", line);
  free (text);
}
