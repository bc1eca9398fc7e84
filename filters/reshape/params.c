/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Parameters compose rather than conflict: the stricter alignment and
 * the smaller cap win, and a cap below the size lowers it.  Values are
 * parsed here, silently, so that a bad one gets exactly one error line
 * naming the parameter, the value and what is accepted (nbdkit's own
 * parsers print a line of their own that names no parameter).
 */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include <nbdkit-filter.h>

#include "common.h"
#include "params.h"
#include "tunables.h"
#include "warn.h"

/* PARAMS_HELP states these defaults in words. */
_Static_assert (DEFAULT_POOL == 64 * MiB && DEFAULT_PARALLEL == 16 &&
                DEFAULT_READAHEAD == 8 * MiB &&
                (DEFAULT_SNDBUF == 0 || DEFAULT_SNDBUF == 2 * MiB),
                "PARAMS_HELP's defaults");

struct params reshape_cfg = {
  .pool = DEFAULT_POOL, .parallel = DEFAULT_PARALLEL,
  .readahead = DEFAULT_READAHEAD,
};

/* A number with nbdkit's optional suffix (b, k, m, g, t, p, e in
 * either case, s for 512-byte sectors, a leading +), at most max.
 */
static bool
silent_size (const char *s, uint64_t max, uint64_t *out)
{
  static const char suffixes[] = "bkmgtpe";
  uint64_t v = 0, scale = 1;
  const char *p;

  s += *s == '+';
  if (*s < '0' || *s > '9')
    return false;
  for (; *s >= '0' && *s <= '9'; s++) {
    if (v > (max - (*s - '0')) / 10)
      return false;
    v = v * 10 + (*s - '0');
  }
  if (*s == 's' || *s == 'S')
    scale = 512, s++;
  else if (*s && (p = strchr (suffixes, *s | 0x20)) != NULL) {
    for (; p > suffixes; p--)
      scale *= 1024;
    s++;
  }
  if (*s || (v && scale > max / v))
    return false;
  *out = v * scale;
  return true;
}

/* nbdkit's booleans: 1, 0, or -1. */
static int
silent_bool (const char *s)
{
  static const char *const words[] = { "1", "true", "t", "yes", "y", "on",
                                       "0", "false", "f", "no", "n", "off" };
  size_t i;

  for (i = 0; i < 12; i++)
    if (strcasecmp (s, words[i]) == 0)
      return i < 6;
  return -1;
}

/* Each parameter with a value of a form: a size (a count if count) in
 * [lo, hi], a power of 2 if pow2, or word (meaning 0, as does a size
 * of 0); a boolean if hi is 0.
 */
enum param_id {
  P_SIZE, P_MIN, P_MAX, P_MAXDATA, P_MAXLEN, P_POOL, P_PARALLEL,
  P_READAHEAD, P_WRITEBACK, P_SNDBUF, P_NUMERIC
};
static const struct form {
  const char *key, *word;
  uint64_t lo, hi;
  bool pow2, count;
  const char *accepted;
} forms[P_NUMERIC] = {
  [P_SIZE] = { "reshape-size", "auto", 4 * KiB, 32 * MiB, true, false,
               "'auto' or a power of 2 from 4K to 32M" },
  [P_MIN] = { "reshape-min", NULL, 1, 64 * KiB, true, false,
              "a power of 2 from 1 to 64K" },
  [P_MAX] = { "reshape-max", NULL, 512, 4 * GiB - 1, false, false,
              "a size from 512 to 4G-1" },
  [P_MAXDATA] = { "reshape-maxdata", NULL, 512, 4 * GiB - 1, false, false,
                  "a size from 512 to 4G-1" },
  [P_MAXLEN] = { "reshape-maxlen", NULL, 512, 4 * GiB - 1, false, false,
                 "a size from 512 to 4G-1" },
  [P_POOL] = { "reshape-pool", NULL, 64 * KiB, 1024 * GiB, false, false,
               "a size from 64K to 1T" },
  [P_PARALLEL] = { "reshape-parallel", NULL, 1, PARALLEL_MAX, false, true,
                   "a number from 1 to 64" },
  [P_READAHEAD] = { "reshape-readahead", "off", 64 * KiB, 64 * MiB, false,
                    false, "'off' or a size from 64K to 64M" },
  [P_WRITEBACK] = { "reshape-writeback", NULL, 0, 0, false, false,
                    "true or false (also yes/no, on/off, 1/0, t/f, y/n)" },
  [P_SNDBUF] = { "reshape-sndbuf", "off", 4 * KiB, 256 * MiB, false, false,
                 "'off' or a size from 4K to 256M" },
};

/* The values as written ("64K", not 65536), for errors that weigh one
 * parameter against another; which parameter set each cap.
 */
static char *raw[P_NUMERIC];
static enum param_id maxdata_id = P_NUMERIC, maxlen_id = P_NUMERIC;

static int
parse_form (const struct form *f, const char *value, uint64_t *out)
{
  int b = f->hi ? 0 : silent_bool (value);

  if (f->hi == 0 && b != -1)
    *out = b;
  else if (f->hi && f->word && strcasecmp (value, f->word) == 0)
    *out = 0;
  else if (f->hi && (!f->count || strspn (value, "0123456789") ==
                     strlen (value)) &&
           silent_size (value, f->hi, out) &&
           ((*out == 0 && f->word) ||
            (*out >= f->lo && (!f->pow2 || is_power_of_2 (*out)))))
    ;
  else {
    nbdkit_error ("%s: '%s' is not accepted; accepted: %s", f->key, value,
                  f->accepted);
    return -1;
  }
  return 0;
}

static void
set_numeric (enum param_id id, uint64_t v)
{
  switch (id) {
  case P_SIZE: reshape_cfg.size = v; break;
  case P_MIN: reshape_cfg.min = v; break;
  case P_MAX: reshape_cfg.maxdata = reshape_cfg.maxlen = v;
    maxdata_id = maxlen_id = id; break;
  case P_MAXDATA: reshape_cfg.maxdata = v; maxdata_id = id; break;
  case P_MAXLEN: reshape_cfg.maxlen = v; maxlen_id = id; break;
  case P_POOL: reshape_cfg.pool = v; break;
  case P_PARALLEL: reshape_cfg.parallel = v; break;
  case P_READAHEAD: reshape_cfg.readahead = v; break;
  case P_WRITEBACK: reshape_cfg.writeback = v; break;
  case P_SNDBUF: reshape_cfg.sndbuf_set = true; reshape_cfg.sndbuf = v; break;
  case P_NUMERIC: abort ();
  }
}

int
params_key (const char *key, const char *value)
{
  unsigned id;
  uint64_t v;

  for (id = 0; id < P_NUMERIC; id++)
    if (strcmp (key, forms[id].key) == 0) {
      if (parse_form (&forms[id], value, &v) == -1)
        return -1;
      free (raw[id]);
      if ((raw[id] = strdup (value)) == NULL) {
        nbdkit_error ("strdup: %m");
        return -1;
      }
      set_numeric (id, v);
      return 1;
    }
  if (strcmp (key, "reshape-stats") == 0) {
    /* Absolute: nbdkit may change directory. */
    if (*value == '\0') {
      nbdkit_error ("%s: '' is not accepted; accepted: the path of a "
                    "file to write", key);
      return -1;
    }
    free (reshape_cfg.stats_file);
    reshape_cfg.stats_file = nbdkit_absolute_path (value);
    return reshape_cfg.stats_file ? 1 : -1;
  }
  if (strcmp (key, "reshape-profile") == 0) {
    /* Taken, so that scripts that pass it keep working. */
    reshape_warning ("reshape-profile is ignored: reshape-size=auto "
                     "measures each plugin from the first request");
    return 1;
  }
  if (strncmp (key, "reshape-", 8) == 0) {
    /* A typo must not reach the plugin as a parameter of its own. */
    nbdkit_error ("unknown parameter '%s'; the reshape filter takes "
                  "reshape-size, -min, -max, -maxdata, -maxlen, -pool, "
                  "-parallel, -readahead, -writeback, -sndbuf, "
                  "-stats", key);
    return -1;
  }
  return 0;
}

/* Files that other layers' parameters name (file=disk.img): the
 * report, written by rename, must not replace one.
 */
static struct { dev_t dev; ino_t ino; char key[32]; } others[8];
static unsigned n_others;

void
params_other (const char *key, const char *value)
{
  struct stat st;

  if (n_others < 8 && stat (value, &st) == 0 && S_ISREG (st.st_mode)) {
    others[n_others].dev = st.st_dev;
    others[n_others].ino = st.st_ino;
    snprintf (others[n_others++].key, sizeof others[0].key, "%s", key);
  }
}

/* A cap below reshape-min, quoting both as written. */
static int
check_cap (enum param_id id, uint32_t cap)
{
  if (cap == 0 || reshape_cfg.min == 0 || cap >= reshape_cfg.min)
    return 0;
  nbdkit_error ("%s=%s is below reshape-min=%s; accepted: a cap of at "
                "least reshape-min", forms[id].key, raw[id], raw[P_MIN]);
  return -1;
}

int
params_complete (void)
{
  struct stat st;
  unsigned i;

  /* The plugin's own limits are known per connection (params_limits). */
  if (check_cap (maxdata_id, reshape_cfg.maxdata) == -1 ||
      check_cap (maxlen_id, reshape_cfg.maxlen) == -1)
    return -1;
  if (reshape_cfg.stats_file && stat (reshape_cfg.stats_file, &st) == 0)
    for (i = 0; i < n_others; i++)
      if (others[i].dev == st.st_dev && others[i].ino == st.st_ino) {
        nbdkit_error ("reshape-stats: '%s' is the file that %s= names; "
                      "accepted: the path of another file (the report "
                      "would replace it)", reshape_cfg.stats_file,
                      others[i].key);
        return -1;
      }
  if (reshape_cfg.size && reshape_cfg.maxdata &&
      reshape_cfg.size > reshape_cfg.maxdata)
    reshape_warning ("reshape-size=%s is above %s=%s: requests are cut at "
                     "%s", raw[P_SIZE], forms[maxdata_id].key,
                     raw[maxdata_id], raw[maxdata_id]);
  return 0;
}

void
params_set_thread_model (int thread_model)
{
  reshape_cfg.parallel_ok = thread_model == NBDKIT_THREAD_MODEL_PARALLEL;
}

void
params_free (void)
{
  unsigned id;

  for (id = 0; id < P_NUMERIC; id++) {
    free (raw[id]);
    raw[id] = NULL;
  }
  free (reshape_cfg.stats_file);
  reshape_cfg.stats_file = NULL;
}

/* A connection refused for what the plugin advertises: the error once
 * per message (a client asks twice, NBD_OPT_INFO then _GO, and every
 * connection would repeat it), then as debug lines.
 */
static void
params_refuse (const char *msg)
{
  static uint64_t said;                 /* the last message's hash */
  uint64_t h = UINT64_C (14695981039346656037);
  const char *p;

  for (p = msg; *p; p++)
    h = (h ^ (unsigned char) *p) * UINT64_C (1099511628211);
  if (__atomic_exchange_n (&said, h, __ATOMIC_RELAXED) == h)
    nbdkit_debug ("reshape: refused again: %s", msg);
  else
    nbdkit_error ("%s", msg);
  errno = EINVAL;
}

/* The smaller of the plugin's maximum and the parameter's, in whole
 * blocks; if none is left, the error names what set each side.
 */
static int
params_cap (uint32_t pmax, uint32_t given, enum param_id id, uint32_t pmin,
     uint32_t min, uint32_t *out)
{
  const uint64_t c = MIN (pmax ? pmax : UINT32_MAX, given ? given : UINT32_MAX);
  char capby[128], minby[128], msg[384];

  if ((*out = ROUND_DOWN (c, min)) != 0)
    return 0;
  if (given && given == c)
    snprintf (capby, sizeof capby, "%s=%s", forms[id].key, raw[id]);
  else
    snprintf (capby, sizeof capby, "the plugin's maximum block size "
              "(%" PRIu32 ")", pmax);
  if (reshape_cfg.min == min && min > pmin)
    snprintf (minby, sizeof minby, "reshape-min=%s", raw[P_MIN]);
  else
    snprintf (minby, sizeof minby, "the plugin's minimum block size "
              "(%" PRIu32 ")", min);
  snprintf (msg, sizeof msg, "%s is below %s; accepted: a cap of at "
            "least the minimum block size", capby, minby);
  params_refuse (msg);
  return -1;
}

int
params_limits (nbdkit_next *next, struct geometry *geo, uint32_t *ppref)
{
  static bool told_empty;
  uint32_t pmin = 0, pmax = 0;
  const int64_t exportsize = next->get_size (next);

  *ppref = 0;
  if (exportsize == -1 || next->block_size (next, &pmin, ppref, &pmax) == -1)
    return -1;
  geo->min = MAX (MAX (pmin, 1), reshape_cfg.min);
  /* A tail shorter than a block is a request the plugin may refuse:
   * clients see the export rounded down, as with nbdkit's blocksize
   * filter.
   */
  geo->exportsize = ROUND_DOWN (exportsize, geo->min);
  if (exportsize > 0 && geo->exportsize == 0 &&
      !__atomic_exchange_n (&told_empty, true, __ATOMIC_RELAXED))
    reshape_warning ("the export's %" PRId64 " bytes are less than one "
                     "block of %" PRIu32 " (reshape-min or the plugin's "
                     "minimum): clients see an empty export", exportsize,
                     geo->min);
  if (params_cap (pmax, reshape_cfg.maxdata, maxdata_id, pmin, geo->min,
           &geo->max) == -1 ||
      params_cap (pmax, reshape_cfg.maxlen, maxlen_id, pmin, geo->min,
           &geo->maxlen) == -1)
    return -1;
  geo->size = geo->max;                 /* until params_sizes */
  return 0;
}

/* reshape-size=SIZE is cut at and told.  With auto, the plugin's
 * preferred size above HINT_SIZE is; else clients are told
 * GUESS_PREFERRED (nbdcopy and qemu-img size their requests by it, and
 * auto.c cuts what the plugin serves faster in pieces) and the filter
 * cuts at DEFAULT_SIZE until it learns.  The size told is a power of 2,
 * no larger than the export, nor than the size cut at but for the
 * guess.
 */
void
params_sizes (struct geometry *geo, uint32_t ppref, uint32_t *preferred)
{
  const bool guess = reshape_cfg.size == 0 && ppref <= HINT_SIZE;
  const uint64_t size = reshape_cfg.size ? reshape_cfg.size :
    guess ? DEFAULT_SIZE : ppref;
  const uint64_t pref = guess ? GUESS_PREFERRED : size;

  geo->size = ROUND_DOWN (MIN (MAX (size, geo->min), geo->max), geo->min);
  *preferred = MIN (MIN (MAX (pref, geo->min), guess ? geo->max : geo->size),
                    MAX (geo->exportsize, 1));
  *preferred = MIN (MAX (pow2_floor (*preferred), NBD_PREFERRED_MIN),
                    NBD_PREFERRED_MAX);
  nbdkit_debug ("reshape: plugin advertises preferred %" PRIu32
                "; requests to it: aligned to %" PRIu32 ", cut at %" PRIu32
                ", at most %" PRIu32 " with data, %" PRIu32 " without; "
                "clients are told to prefer %" PRIu32, ppref, geo->min,
                geo->size, geo->max, geo->maxlen, *preferred);
}
