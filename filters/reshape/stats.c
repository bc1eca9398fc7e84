/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * The report answers first whether the filter helped: a summary of
 * what clients asked for against what the plugin was sent, then the
 * size histograms side by side, then the counters that moved.  A file
 * named *.json gets the same as JSON, for scripts.  The file is
 * replaced whole, by a temporary beside it renamed over it (made with
 * O_EXCL: a symlink planted there is never followed), so that a reader
 * never sees half a report: at exit, and every REPORT_NS while the
 * server runs.
 */

#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>

#include <nbdkit-filter.h>

#include "common.h"
#include "stats.h"
#include "tunables.h"

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

#define STATS_INFO(name, label, key, bytes) { label, key, bytes },
static const struct {
  const char *label, *key;
  bool bytes;
} counter_info[C_COUNTERS] = { STATS_COUNTERS (STATS_INFO) };

static unsigned
stats_bucket (uint64_t bytes)
{
  unsigned b = 0;

  while (b + 1 < BUCKETS && (bytes >> (b + 1)) != 0)
    b++;
  return b;
}

static void
stats_account (struct opstats *s, uint64_t bytes)
{
  __atomic_fetch_add (&s->count, 1, __ATOMIC_RELAXED);
  __atomic_fetch_add (&s->bytes, bytes, __ATOMIC_RELAXED);
  __atomic_fetch_add (&s->hist[stats_bucket (bytes)], 1, __ATOMIC_RELAXED);
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

  stats_account (&client[op], bytes);
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
  stats_account (&plugin[op], bytes);
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

void
stats_json_string (FILE *fp, const char *str)
{
  const unsigned char *s = (const unsigned char *) str;

  fputc ('"', fp);
  for (; *s; s++)
    if (*s == '"' || *s == '\\')
      fprintf (fp, "\\%c", *s);
    else if (*s < 0x20 || *s >= 0x7f)
      fprintf (fp, "\\u%04x", *s);
    else
      fputc (*s, fp);
  fputc ('"', fp);
}

void
stats_text_name (FILE *fp, const char *str)
{
  const unsigned char *s = (const unsigned char *) str;

  fputc ('\'', fp);
  for (; *s; s++)
    if (*s < 0x20 || *s >= 0x7f || *s == '\'' || *s == '\\')
      fprintf (fp, "\\x%02x", *s);
    else
      fputc (*s, fp);
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
stats_side (FILE *fp, enum stats_op op, const struct opstats *s)
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
  stats_side (fp, op, c);
  fprintf (fp, " ");
  stats_side (fp, op, p);
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
               stats_learning *learning)
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
    learning (fp, STATS_SUMMARY);
  else
    fprintf (fp, "size: fixed %s (reshape-size)\n",
             stats_human (fixed_size, b1, sizeof b1));
}

static void
stats_bar (FILE *fp, uint64_t n, uint64_t scale)
{
  unsigned w = scale ? (unsigned) ((n * BAR + scale - 1) / scale) : 0;

  fprintf (fp, "%-*.*s", BAR, w, "########################################");
}

/* Side by side, one line per size class either side used. */
static void
stats_histogram (FILE *fp, enum stats_op op)
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
    stats_bar (fp, c->hist[i], scale);
    fprintf (fp, " %9" PRIu64 "  ", c->hist[i]);
    stats_bar (fp, p->hist[i], scale);
    fprintf (fp, " %9" PRIu64 "\n", p->hist[i]);
  }
}

static void
write_text (FILE *fp, uint32_t fixed_size,
            stats_learning *learning)
{
  char b[32];
  bool any = false;
  unsigned op, i;

  write_summary (fp, fixed_size, learning);
  for (op = 0; op < OP_COUNT; op++)
    if (op != OP_FLUSH && (client[op].count || plugin[op].count))
      stats_histogram (fp, op);
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
    learning (fp, STATS_TABLES);
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
            stats_learning *learning)
{
  unsigned op, i;

  fprintf (fp, "{\n  \"schema\": 2,\n");
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
    learning (fp, STATS_JSON);
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

/* Replace file whole with text: -1 with errno set. */
static int
stats_save (const char *file, const char *text)
{
  CLEANUP_FREE char *tmp = NULL;
  FILE *fp;
  int fd, err;
  bool ok;

  if (asprintf (&tmp, "%s.tmp.%ld", file, (long) getpid ()) == -1) {
    tmp = NULL;
    return -1;
  }
  unlink (tmp);                 /* a dead process's of the same pid */
  fd = open (tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd == -1)
    return -1;
  if ((fp = fdopen (fd, "w")) == NULL) {
    err = errno;
    close (fd);
    unlink (tmp);
    errno = err;
    return -1;
  }
  ok = fputs (text, fp) != EOF && fflush (fp) == 0 && fsync (fd) == 0;
  err = errno;
  if (fclose (fp) != 0 && ok)
    ok = false, err = errno;
  if (ok && rename (tmp, file) == -1)
    ok = false, err = errno;
  if (!ok)
    unlink (tmp);
  errno = err;
  return ok ? 0 : -1;
}

/* Nothing is opened before the first report, so a server that fails to
 * start leaves the file as it was.  A symlink is refused: the report
 * would replace the link, not what it points to.
 */
int
stats_check (const char *file)
{
  CLEANUP_FREE char *dir = strdup (file);
  struct stat st;

  if (lstat (file, &st) == 0 && !S_ISREG (st.st_mode)) {
    nbdkit_error ("reshape-stats: %s is %s; accepted: a regular file or a "
                  "new name", file, S_ISLNK (st.st_mode) ?
                  "a symbolic link" : "not a regular file");
    return -1;
  }
  else if (lstat (file, &st) == -1 && errno != ENOENT) {
    nbdkit_error ("reshape-stats: %s: %m", file);
    return -1;
  }
  if (dir == NULL || access (dirname (dir), W_OK | X_OK) == -1) {
    nbdkit_error ("reshape-stats: cannot write '%s' (its directory: %m)",
                  file);
    return -1;
  }
  return 0;
}

/* The report as text (or JSON), malloc'd. */
static char *
stats_render (bool json, uint32_t fixed_size,
        stats_learning *learning)
{
  char *text = NULL;
  size_t len = 0;
  FILE *fp = open_memstream (&text, &len);

  if (fp == NULL)
    return NULL;
  if (json)
    write_json (fp, fixed_size, learning);
  else
    write_text (fp, fixed_size, learning);
  if (fclose (fp) != 0) {
    free (text);
    return NULL;
  }
  return text;
}

void
stats_report (const char *file, uint32_t fixed_size,
              stats_learning *learning, bool final)
{
  static bool failed;           /* said once */
  CLEANUP_FREE char *text = NULL, *json = NULL;
  char *line, *save_ptr = NULL;

  text = stats_render (false, fixed_size, learning);
  if (file && is_json (file))
    json = stats_render (true, fixed_size, learning);
  if (file && (json || text) && stats_save (file, json ? json : text) == -1 &&
      !__atomic_exchange_n (&failed, true, __ATOMIC_RELAXED))
    nbdkit_error ("reshape-stats: %s: %m", file);
  if (!final || text == NULL)
    return;
  for (line = strtok_r (text, "\n", &save_ptr); line;
       line = strtok_r (NULL, "\n", &save_ptr))
    nbdkit_debug ("reshape: %s", line);
}

/* The live report: a thread that writes it every REPORT_NS until
 * stop is posted.
 */
static struct {
  sem_t stop;
  pthread_t thread;
  bool running;
  const char *file;
  uint32_t fixed_size;
  stats_learning *learning;
} live;

static void *
live_write (void *arg)
{
  struct timespec at;
  int r;

  for (;;) {
    clock_gettime (CLOCK_REALTIME, &at);
    at.tv_sec += REPORT_NS / 1000000000;
    while ((r = sem_timedwait (&live.stop, &at)) == -1 && errno == EINTR)
      ;
    if (r == 0)                         /* stop was posted */
      return NULL;
    stats_report (live.file, live.fixed_size, live.learning, false);
  }
}

int
stats_live_start (const char *file, uint32_t fixed_size,
                  stats_learning *learning)
{
  int err;

  live.file = file;
  live.fixed_size = fixed_size;
  live.learning = learning;
  sem_init (&live.stop, 0, 0);
  if ((err = pthread_create (&live.thread, NULL, live_write, NULL)) != 0) {
    errno = err;
    nbdkit_error ("reshape-stats: starting its thread: %m");
    return -1;
  }
  live.running = true;
  return 0;
}

void
stats_live_stop (void)
{
  if (!live.running)
    return;
  sem_post (&live.stop);
  pthread_join (live.thread, NULL);
  sem_destroy (&live.stop);
  live.running = false;
}
