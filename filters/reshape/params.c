/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Parameters, and the geometry each connection settles from them and
 * from what its plugin advertises.  Parameters compose rather than
 * conflict: the stricter alignment and the smaller cap win, and a cap
 * below the optimal size lowers the size.
 *
 * Values are parsed here, silently, so that a bad one gets exactly one
 * error line, which names the parameter, the value and what is
 * accepted (nbdkit's own parsers print a line of their own that names
 * no parameter).
 */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <sys/stat.h>

#include <nbdkit-filter.h>

#include "common.h"
#include "params.h"
#include "tunables.h"
#include "warn.h"

/* PARAMS_HELP states these defaults in words. */
_Static_assert (DEFAULT_POOL == 64 * MiB, "PARAMS_HELP: reshape-pool");
_Static_assert (DEFAULT_PARALLEL == 16, "PARAMS_HELP: reshape-parallel");
_Static_assert (DEFAULT_READAHEAD == 8 * MiB,
                "PARAMS_HELP: reshape-readahead");
_Static_assert (DEFAULT_SNDBUF == 0 || DEFAULT_SNDBUF == 2 * MiB,
                "PARAMS_HELP: reshape-sndbuf");

struct params reshape_cfg = {
  .pool = DEFAULT_POOL, .parallel = DEFAULT_PARALLEL,
  .readahead = DEFAULT_READAHEAD,
};

/* A number with an optional scale suffix (nbdkit's own: b, k, m, g,
 * t, p, e in either case, s for 512-byte sectors), no more than max;
 * a leading + as nbdkit_parse_size takes it.
 */
static bool
silent_size (const char *s, uint64_t max, uint64_t *out)
{
  static const char suffixes[] = "bkmgtpe";
  uint64_t v = 0, scale = 1;
  const char *p;

  if (*s == '+')
    s++;
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

/* nbdkit's booleans, the same words. */
static int
silent_bool (const char *s)
{
  static const char *const yes[] = { "1", "true", "t", "yes", "y", "on" };
  static const char *const no[] = { "0", "false", "f", "no", "n", "off" };
  size_t i;

  for (i = 0; i < sizeof yes / sizeof *yes; i++) {
    if (strcasecmp (s, yes[i]) == 0)
      return 1;
    if (strcasecmp (s, no[i]) == 0)
      return 0;
  }
  return -1;
}

static const char bools[] =
  "true or false (also yes/no, on/off, 1/0, t/f, y/n)";

/* The parameters that take a value of a form: a size (with nbdkit's
 * suffixes) or a count in [lo, hi], a power of 2 if pow2, or word
 * (meaning 0, as does a size of 0); or a boolean (hi 0).  accepted:
 * what the error says.
 */
enum param_id {
  P_SIZE, P_MIN, P_MAX, P_MAXDATA, P_MAXLEN, P_POOL, P_PARALLEL,
  P_READAHEAD, P_WRITEBACK, P_SNDBUF, P_NUMERIC
};
static const struct form {
  const char *key;
  const char *word;
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
  [P_WRITEBACK] = { "reshape-writeback", NULL, 0, 0, false, false, bools },
  [P_SNDBUF] = { "reshape-sndbuf", "off", 4 * KiB, 256 * MiB, false, false,
                 "'off' or a size from 4K to 256M" },
};

/* value in form f; -1 with the one error line if it is not. */
static int
parse_form (const struct form *f, const char *value, uint64_t *out)
{
  int b;

  if (f->hi == 0) {                     /* a boolean */
    if ((b = silent_bool (value)) == -1)
      goto bad;
    *out = b;
    return 0;
  }
  if (f->word && strcasecmp (value, f->word) == 0) {
    *out = 0;
    return 0;
  }
  if (f->count ? strspn (value, "0123456789") != strlen (value) : false)
    goto bad;
  if (!silent_size (value, f->hi, out))
    goto bad;
  /* For a parameter that takes a word (auto, off), any size of 0
   * ("0", "0K") means the word: no fill is no readahead.
   */
  if (*out == 0 && f->word)
    return 0;
  if (*out < f->lo || (f->pow2 && !is_power_of_2 (*out)))
    goto bad;
  return 0;
 bad:
  nbdkit_error ("%s: '%s' is not accepted; accepted: %s", f->key, value,
                f->accepted);
  return -1;
}

/* The values as the user wrote them ("64K", not 65536), for the
 * errors that weigh one parameter against another; and which
 * parameter set each cap (P_NUMERIC: none did).
 */
static char *raw[P_NUMERIC];
static enum param_id maxdata_id = P_NUMERIC, maxlen_id = P_NUMERIC;

/* Set the parameter id to v (parsed). */
static void
set_numeric (enum param_id id, uint64_t v)
{
  switch (id) {
  case P_SIZE: reshape_cfg.size = v; break;
  case P_MIN: reshape_cfg.min = v; break;
  case P_MAX:
    reshape_cfg.maxdata = reshape_cfg.maxlen = v;
    maxdata_id = maxlen_id = id;
    break;
  case P_MAXDATA:
    reshape_cfg.maxdata = v;
    maxdata_id = id;
    break;
  case P_MAXLEN:
    reshape_cfg.maxlen = v;
    maxlen_id = id;
    break;
  case P_POOL: reshape_cfg.pool = v; break;
  case P_PARALLEL: reshape_cfg.parallel = v; break;
  case P_READAHEAD: reshape_cfg.readahead = v; break;
  case P_WRITEBACK: reshape_cfg.writeback = v; break;
  case P_SNDBUF:
    reshape_cfg.sndbuf_set = true;
    reshape_cfg.sndbuf = v;
    break;
  case P_NUMERIC: abort ();
  }
}

/* A file parameter, as an absolute path (nbdkit may change directory). */
static int
params_file (char **out, const char *key, const char *value)
{
  if (*value == '\0') {
    nbdkit_error ("%s: '' is not accepted; accepted: the path of a "
                  "file to write", key);
    return -1;
  }
  free (*out);
  *out = nbdkit_absolute_path (value);
  return *out ? 1 : -1;
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
      raw[id] = strdup (value);
      if (raw[id] == NULL) {
        nbdkit_error ("strdup: %m");
        return -1;
      }
      set_numeric (id, v);
      return 1;
    }
  if (strcmp (key, "reshape-stats") == 0)
    return params_file (&reshape_cfg.stats_file, key, value);
  if (strcmp (key, "reshape-profile") == 0) {
    /* Taken so that scripts that pass it keep working. */
    reshape_warning ("reshape-profile is ignored: reshape-size=auto "
                     "measures each plugin from the first request");
    return 1;
  }
  if (strncmp (key, "reshape-", 8) == 0) {
    /* A typo must not silently reach the plugin as its own parameter. */
    nbdkit_error ("unknown parameter '%s'; the reshape filter takes "
                  "reshape-size, -min, -max, -maxdata, -maxlen, -pool, "
                  "-parallel, -readahead, -writeback, -sndbuf, "
                  "-stats", key);
    return -1;
  }
  return 0;
}

/* A cap below reshape-min: -1 with the error, which quotes both as
 * the user wrote them.
 */
static int
check_cap (enum param_id id, uint32_t cap)
{
  if (cap == 0 || reshape_cfg.min == 0 || cap >= reshape_cfg.min)
    return 0;
  nbdkit_error ("%s=%s is below reshape-min=%s; accepted: a cap of at "
                "least reshape-min", forms[id].key, raw[id], raw[P_MIN]);
  return -1;
}

/* Files that other layers' parameters name (file=disk.img): the
 * report is written by rename, and must not replace one of them.
 */
enum { OTHERS_MAX = 8 };
static struct { dev_t dev; ino_t ino; char key[32]; } others[OTHERS_MAX];
static unsigned n_others;

void
params_other (const char *key, const char *value)
{
  struct stat st;

  if (n_others < OTHERS_MAX && stat (value, &st) == 0 &&
      S_ISREG (st.st_mode)) {
    others[n_others].dev = st.st_dev;
    others[n_others].ino = st.st_ino;
    snprintf (others[n_others++].key, sizeof others[0].key, "%s", key);
  }
}

static int
check_stats_file (void)
{
  struct stat st;
  unsigned i;

  if (reshape_cfg.stats_file == NULL ||
      stat (reshape_cfg.stats_file, &st) == -1)
    return 0;
  for (i = 0; i < n_others; i++)
    if (others[i].dev == st.st_dev && others[i].ino == st.st_ino) {
      nbdkit_error ("reshape-stats: '%s' is the file that %s= names; "
                    "accepted: the path of another file (the report "
                    "would replace it)", reshape_cfg.stats_file,
                    others[i].key);
      return -1;
    }
  return 0;
}

int
params_complete (void)
{
  /* The plugin's own minimum is known only per connection (see
   * params_limits); the user's values can be checked now.
   */
  if (check_cap (maxdata_id, reshape_cfg.maxdata) == -1 ||
      check_cap (maxlen_id, reshape_cfg.maxlen) == -1 ||
      check_stats_file () == -1)
    return -1;
  /* They compose (the smaller cap wins), but one of them is moot. */
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

/* The largest power of 2 not above v, within NBD's preferred sizes. */
static uint32_t
preferred_pow2 (uint64_t v)
{
  return MIN (MAX (pow2_floor (MAX (v, 1)), NBD_PREFERRED_MIN),
              NBD_PREFERRED_MAX);
}

enum { MSG_MAX = 384 };                 /* a refusal's message */

/* A connection refused for what the plugin advertises: the error once
 * per distinct message (a client asks twice, NBD_OPT_INFO then _GO,
 * and each connection after the first would repeat it word for word),
 * later refusals as debug lines.  EINVAL: the parameter is wrong for
 * this plugin.  (nbdkit 1.32 answers the client NBD_REP_ERR_UNKNOWN
 * whatever the cause.)
 */
static void
refuse (const char *msg)
{
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  static char last[MSG_MAX];
  bool again;

  pthread_mutex_lock (&lock);
  again = strcmp (last, msg) == 0;
  if (!again)
    snprintf (last, sizeof last, "%s", msg);
  pthread_mutex_unlock (&lock);
  if (again)
    nbdkit_debug ("reshape: refused again: %s", msg);
  else
    nbdkit_error ("%s", msg);
  errno = EINVAL;
}

/* The smaller of the plugin's maximum and the parameter's (0: none),
 * in whole minimum blocks.  If that leaves no block, the error names
 * what set each side: a parameter as the user wrote it, or the
 * plugin with its number.
 */
static int
cap (uint32_t pmax, uint32_t given, enum param_id id, uint32_t pmin,
     uint32_t min, uint32_t *out)
{
  uint64_t c = pmax ? pmax : UINT32_MAX;
  char capby[128], minby[128], msg[MSG_MAX];

  if (given)
    c = MIN (c, given);
  *out = ROUND_DOWN (c, min);
  if (*out)
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
  refuse (msg);
  return -1;
}

/* An export rounded down to nothing: said once. */
static bool told_empty;

int
params_limits (nbdkit_next *next, struct geometry *geo, uint32_t *ppref)
{
  uint32_t pmin = 0, pmax = 0;
  int64_t exportsize = next->get_size (next);

  *ppref = 0;
  if (exportsize == -1)
    return -1;
  if (next->block_size (next, &pmin, ppref, &pmax) == -1)
    return -1;

  geo->min = pmin ? pmin : 1;
  if (reshape_cfg.min > geo->min)
    geo->min = reshape_cfg.min;
  /* A tail shorter than the minimum block is a request the plugin may
   * refuse whatever the filter does: clients see the export rounded
   * down to whole blocks, as with nbdkit's blocksize filter.
   */
  geo->exportsize = ROUND_DOWN (exportsize, geo->min);
  if (exportsize > 0 && geo->exportsize == 0 &&
      !__atomic_exchange_n (&told_empty, true, __ATOMIC_RELAXED))
    reshape_warning ("the export's %" PRId64 " bytes are less than one "
                     "block of %" PRIu32 " (reshape-min or the plugin's "
                     "minimum): clients see an empty export", exportsize,
                     geo->min);

  if (cap (pmax, reshape_cfg.maxdata, maxdata_id, pmin, geo->min,
           &geo->max) == -1 ||
      cap (pmax, reshape_cfg.maxlen, maxlen_id, pmin, geo->min,
           &geo->maxlen) == -1)
    return -1;
  geo->size = geo->max;           /* until params_sizes */
  return 0;
}

/* The request size and what clients are told to prefer:
 *
 *   - reshape-size=SIZE: both;
 *   - reshape-size=auto: the plugin's preferred size if above
 *     HINT_SIZE, else the static DEFAULT_SIZE, a guess for where to
 *     cut, while clients are told GUESS_PREFERRED: nbdcopy and qemu-img
 *     size their requests by it, and a large request costs nothing when
 *     the guess is wrong, since auto.c cuts what the plugin serves
 *     faster in pieces (a size told from what was measured bought
 *     nothing: docs/design.md).
 *
 * Then the geometry's bounds: at least the minimum block, at most the
 * maximum (the cap wins), and the preferred size a power of 2 no
 * larger than the export, nor than the request size but for the
 * guess.
 */
void
params_sizes (struct geometry *geo, uint32_t ppref, uint32_t *preferred)
{
  uint64_t size, pref, told_cap;
  bool guess = false;

  if (reshape_cfg.size)
    size = pref = reshape_cfg.size;
  else if (ppref > HINT_SIZE)
    size = pref = ppref;
  else {
    size = DEFAULT_SIZE;
    pref = GUESS_PREFERRED;
    guess = true;
  }
  size = MAX (size, geo->min);
  geo->size = ROUND_DOWN (MIN (size, geo->max), geo->min);
  told_cap = guess ? geo->max : geo->size;
  /* Never above the export: a client sizes its buffers by it. */
  *preferred = preferred_pow2 (MIN (MIN (MAX (pref, geo->min), told_cap),
                                    MAX (geo->exportsize, 1)));

  nbdkit_debug ("reshape: plugin advertises preferred %" PRIu32
                "; requests to it: aligned to %" PRIu32
                ", cut at %" PRIu32 ", at most %" PRIu32 " with data, %"
                PRIu32 " without; clients are told to prefer %" PRIu32,
                ppref, geo->min, geo->size, geo->max, geo->maxlen,
                *preferred);
}
