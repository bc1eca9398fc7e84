/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Parameters, and the geometry each connection settles from them and
 * from what its plugin advertises.  Parameters compose rather than
 * conflict: the stricter alignment and the smaller cap win, and a cap
 * below the optimal size lowers the size.
 */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <nbdkit-filter.h>

#include "common.h"
#include "params.h"

/* Used when the plugin prefers nothing larger than 4K: the request
 * size that did best in sweeps of nbdcopy --request-size from 32K to
 * 32M over nbdkit's sparse-random plugin, and nbdcopy's own default.
 */
#define DEFAULT_SIZE (256 * KiB)

/* The defaults:
 * - pool 64M: eight of the largest readahead windows, or 256 staged
 *   blocks of the default size, a small part of what nbdkit itself
 *   may hold (16 threads per connection, each with a buffer of up to
 *   64M for the requests it serves);
 * - parallel 16, nbdkit's own default thread count per connection:
 *   the pieces of one request reach the plugin as the requests of a
 *   client with 16 in flight would.  Measured on 32M reads at 200 MB/s
 *   per request, 8 left the plugin's streams a third short;
 * - readahead 8M: windows double from the request size, so a stream
 *   reaches 8M after five fills; beyond that a 1 ms plugin spends
 *   more time moving data than waiting (measured: bench/accel.sh,
 *   naive reader).
 */
struct params reshape_cfg = {
  .pool = 64 * MiB, .parallel = 16, .readahead = 8 * MiB,
};

/* Parse a size and check its range; the error names the parameter. */
static int
parse_size (const char *key, const char *value,
            uint64_t lo, uint64_t hi, const char *range,
            bool power_of_2, uint64_t *out)
{
  int64_t r = nbdkit_parse_size (value);

  if (r == -1) {
    nbdkit_error ("%s: cannot parse '%s'; accepted: %s", key, value, range);
    return -1;
  }
  if ((uint64_t) r < lo || (uint64_t) r > hi ||
      (power_of_2 && !is_power_of_2 (r))) {
    nbdkit_error ("%s: '%s' is out of range; accepted: %s",
                  key, value, range);
    return -1;
  }
  *out = r;
  return 0;
}

static int
parse_bool (const char *key, const char *value, bool *out)
{
  int b = nbdkit_parse_bool (value);

  if (b == -1) {
    nbdkit_error ("%s: '%s' is not a boolean; accepted: true or false",
                  key, value);
    return -1;
  }
  *out = b;
  return 0;
}

static int
params_sndbuf (const char *key, const char *value)
{
  uint64_t v;

  reshape_cfg.sndbuf_set = true;
  if (strcasecmp (value, "off") == 0 || strcmp (value, "0") == 0) {
    reshape_cfg.sndbuf = 0;
    return 0;
  }
  if (parse_size (key, value, 4 * KiB, 256 * MiB,
                  "'off' or a size from 4K to 256M", false, &v) == -1)
    return -1;
  reshape_cfg.sndbuf = v;
  return 0;
}

/* A file parameter, as an absolute path (nbdkit may change directory). */
static int
params_file (char **out, const char *value)
{
  free (*out);
  *out = nbdkit_absolute_path (value);
  return *out ? 0 : -1;
}

int
params_key (const char *key, const char *value)
{
  uint64_t v;

  if (strcmp (key, "reshape-size") == 0) {
    if (strcasecmp (value, "auto") == 0)
      reshape_cfg.size = 0;
    else if (parse_size (key, value, 4 * KiB, 32 * MiB,
                         "'auto' or a power of 2 from 4K to 32M", true,
                         &v) == -1)
      return -1;
    else
      reshape_cfg.size = v;
  }
  else if (strcmp (key, "reshape-min") == 0) {
    if (parse_size (key, value, 1, 64 * KiB,
                    "a power of 2 from 1 to 64K", true, &v) == -1)
      return -1;
    reshape_cfg.min = v;
  }
  else if (strcmp (key, "reshape-max") == 0) {
    if (parse_size (key, value, 512, 4 * GiB - 1,
                    "a size from 512 to 4G-1", false, &v) == -1)
      return -1;
    reshape_cfg.max = v;
  }
  else if (strcmp (key, "reshape-pool") == 0) {
    if (parse_size (key, value, 64 * KiB, 1024 * GiB,
                    "a size from 64K to 1T", false, &v) == -1)
      return -1;
    reshape_cfg.pool = v;
  }
  else if (strcmp (key, "reshape-parallel") == 0) {
    unsigned n;
    const bool parsed = nbdkit_parse_unsigned (key, value, &n) == 0;
    if (!parsed || n < 1 || n > PARALLEL_MAX) {
      nbdkit_error ("reshape-parallel: '%s' is %s; accepted: a number "
                    "from 1 to %d", value,
                    parsed ? "out of range" : "not a number", PARALLEL_MAX);
      return -1;
    }
    reshape_cfg.parallel = n;
  }
  else if (strcmp (key, "reshape-readahead") == 0) {
    if (strcasecmp (value, "off") == 0 || strcmp (value, "0") == 0)
      reshape_cfg.readahead = 0;
    else if (parse_size (key, value, 64 * KiB, 64 * MiB,
                         "'off' or a size from 64K to 64M", false, &v) == -1)
      return -1;
    else
      reshape_cfg.readahead = v;
  }
  else if (strcmp (key, "reshape-merge") == 0)
    return parse_bool (key, value, &reshape_cfg.merge) == -1 ? -1 : 1;
  else if (strcmp (key, "reshape-writeback") == 0)
    return parse_bool (key, value, &reshape_cfg.writeback) == -1 ? -1 : 1;
  else if (strcmp (key, "reshape-sndbuf") == 0)
    return params_sndbuf (key, value) == -1 ? -1 : 1;
  else if (strcmp (key, "reshape-stats") == 0)
    return params_file (&reshape_cfg.stats_file, value) == -1 ? -1 : 1;
  else if (strcmp (key, "reshape-profile") == 0)
    return params_file (&reshape_cfg.profile_file, value) == -1 ? -1 : 1;
  else if (strncmp (key, "reshape-", 8) == 0) {
    /* A typo must not silently reach the plugin as its own parameter. */
    nbdkit_error ("unknown parameter '%s'; the reshape filter takes "
                  "reshape-size, reshape-min, reshape-max, reshape-pool, "
                  "reshape-parallel, reshape-readahead, reshape-merge, "
                  "reshape-writeback, reshape-sndbuf, reshape-stats and "
                  "reshape-profile", key);
    return -1;
  }
  else
    return 0;
  return 1;
}

int
params_complete (void)
{
  /* The plugin's own minimum is known only per connection (see
   * params_limits); the user's two values can be checked now.
   */
  if (reshape_cfg.min && reshape_cfg.max &&
      reshape_cfg.max < reshape_cfg.min) {
    nbdkit_error ("reshape-max: %" PRIu32 " is below reshape-min (%" PRIu32
                  "); accepted: a cap of at least the minimum block size",
                  reshape_cfg.max, reshape_cfg.min);
    return -1;
  }
  /* Fail now, not at exit, if the report cannot be written. */
  if (reshape_cfg.stats_file) {
    FILE *fp = fopen (reshape_cfg.stats_file, "w");
    if (fp == NULL) {
      nbdkit_error ("reshape-stats: cannot write '%s': %m",
                    reshape_cfg.stats_file);
      return -1;
    }
    fclose (fp);
  }
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
  free (reshape_cfg.stats_file);
  free (reshape_cfg.profile_file);
  reshape_cfg.stats_file = reshape_cfg.profile_file = NULL;
}

/* NBD's smallest preferred block size, and the largest that clients
 * take: nbdcopy aborts when a server prefers more than 32M.
 */
#define NBD_PREFERRED_MIN 512
#define NBD_PREFERRED_MAX (32 * 1024 * 1024)

/* The largest power of 2 not above v, within NBD's preferred sizes. */
static uint32_t
preferred_pow2 (uint64_t v)
{
  return min_u64 (max_u64 (pow2_floor (max_u64 (v, 1)), NBD_PREFERRED_MIN),
                  NBD_PREFERRED_MAX);
}

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
  geo->exportsize = round_down (exportsize, geo->min);

  geo->max = pmax ? pmax : UINT32_MAX;
  if (reshape_cfg.max)
    geo->max = min_u64 (geo->max, reshape_cfg.max);
  geo->max -= geo->max % geo->min;
  if (geo->max == 0) {
    nbdkit_error ("reshape-max: the cap (%" PRIu32 ") is below the "
                  "plugin's minimum block size (%" PRIu32 ")",
                  reshape_cfg.max ? reshape_cfg.max : pmax, geo->min);
    return -1;
  }
  geo->size = geo->max;           /* until params_sizes */
  return 0;
}

/* The request size and what clients are told to prefer, for every
 * way the size can be known:
 *
 *   - reshape-size=SIZE: both;
 *   - reshape-size=auto, once learnt (tune.c): the learnt unit and
 *     preferred size, or the plugin's preferred size if larger (the
 *     plugin may know what timing cannot see, a RAID stripe say);
 *   - otherwise the plugin's preferred size if above 4K, else the
 *     static DEFAULT_SIZE, which is only a guess and so is not told
 *     to clients: they hear 4K (or the plugin's minimum).  Clients
 *     such as nbdcopy raise any smaller request size to the hint and
 *     size their buffers by it, and a client that chose small
 *     requests for a fast plugin should keep them.
 *
 * Then the geometry's bounds: at least the minimum block, at most the
 * maximum (the cap wins), and the preferred size a power of 2 no
 * larger than the request size or the export.
 */
void
params_sizes (struct geometry *geo, uint32_t ppref, uint32_t learnt_unit,
              uint32_t learnt_preferred, uint32_t *preferred)
{
  uint64_t size, pref;

  if (reshape_cfg.size)
    size = pref = reshape_cfg.size;
  else if (learnt_preferred) {
    pref = max_u64 (learnt_preferred, ppref);
    size = max_u64 (learnt_unit ? learnt_unit : DEFAULT_SIZE, pref);
  }
  else if (ppref > 4 * KiB)
    size = pref = ppref;
  else {
    size = DEFAULT_SIZE;
    pref = max_u64 (4 * KiB, geo->min);
  }
  size = max_u64 (size, geo->min);
  geo->size = round_down (min_u64 (size, geo->max), geo->min);
  /* Never above the export: a client sizes its buffers by it. */
  *preferred = preferred_pow2 (min_u64 (min_u64 (max_u64 (pref, geo->min),
                                                 geo->size),
                                        max_u64 (geo->exportsize, 1)));

  nbdkit_debug ("reshape: plugin advertises preferred %" PRIu32
                "; requests to it: aligned to %" PRIu32
                ", cut at %" PRIu32 ", at most %" PRIu32
                "; clients are told to prefer %" PRIu32,
                ppref, geo->min, geo->size, geo->max, *preferred);
}
