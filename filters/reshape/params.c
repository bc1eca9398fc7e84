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

static int
params_stats (const char *key, const char *value)
{
  free (reshape_cfg.stats_file);
  reshape_cfg.stats_file = nbdkit_absolute_path (value);
  return reshape_cfg.stats_file ? 0 : -1;
}

int
params_key (const char *key, const char *value)
{
  uint64_t v;

  if (strcmp (key, "reshape-size") == 0) {
    if (parse_size (key, value, 4 * KiB, 32 * MiB,
                    "a power of 2 from 4K to 32M", true, &v) == -1)
      return -1;
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
    if (nbdkit_parse_unsigned (key, value, &n) == -1 || n < 1 ||
        n > PARALLEL_MAX) {
      nbdkit_error ("reshape-parallel: '%s' is out of range; "
                    "accepted: a number from 1 to %d", value, PARALLEL_MAX);
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
    return params_stats (key, value) == -1 ? -1 : 1;
  else if (strncmp (key, "reshape-", 8) == 0) {
    /* A typo must not silently reach the plugin as its own parameter. */
    nbdkit_error ("unknown parameter '%s'; the reshape filter takes "
                  "reshape-size, reshape-min, reshape-max, reshape-pool, "
                  "reshape-parallel, reshape-readahead, reshape-merge, "
                  "reshape-writeback, reshape-sndbuf and reshape-stats", key);
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
   * params_geometry); the user's two values can be checked now.
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
  reshape_cfg.stats_file = NULL;
}

/* NBD's smallest preferred block size, and the largest that clients
 * take: nbdcopy aborts when a server prefers more than 32M.
 */
#define NBD_PREFERRED_MIN 512
#define NBD_PREFERRED_MAX (32 * 1024 * 1024)

/* What clients are told to prefer: a power of 2, as NBD requires, no
 * larger than the size the filter cuts at.  When that size is only the
 * filter's guess (neither the plugin nor reshape-size named one), the
 * hint stays at 4K or the plugin's minimum: clients such as nbdcopy
 * raise any smaller request size to the hint and size their buffers by
 * it, and a client that chose small requests for a fast plugin should
 * keep them.  The filter still cuts large requests at its guess.
 */
static uint32_t
preferred (const struct geometry *geo, bool guessed)
{
  uint32_t p = NBD_PREFERRED_MIN;

  while (p * 2 <= geo->size && p < NBD_PREFERRED_MAX)
    p *= 2;
  if (guessed)
    while (p > 4 * KiB && p / 2 >= geo->min)
      p /= 2;
  return p;
}

/* Settle min, size and max for one connection. */
int
params_geometry (nbdkit_next *next, struct geometry *geo,
                 uint32_t *preferred_out)
{
  uint32_t pmin = 0, ppref = 0, pmax = 0;
  bool guessed;
  int64_t exportsize = next->get_size (next);

  if (exportsize == -1)
    return -1;
  if (next->block_size (next, &pmin, &ppref, &pmax) == -1)
    return -1;

  geo->exportsize = exportsize;
  geo->min = pmin ? pmin : 1;
  if (reshape_cfg.min > geo->min)
    geo->min = reshape_cfg.min;

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

  guessed = reshape_cfg.size == 0 && ppref <= 4 * KiB;
  if (reshape_cfg.size)
    geo->size = reshape_cfg.size;
  else
    geo->size = guessed ? DEFAULT_SIZE : ppref;
  if (geo->size < geo->min)
    geo->size = geo->min;
  geo->size = min_u64 (geo->size, geo->max);   /* the cap wins */
  *preferred_out = preferred (geo, guessed);

  nbdkit_debug ("reshape: plugin advertises minimum %" PRIu32
                " preferred %" PRIu32 " maximum %" PRIu32
                "; requests to it: aligned to %" PRIu32
                ", cut at %" PRIu32 ", at most %" PRIu32
                "; clients are told to prefer %" PRIu32,
                pmin, ppref, pmax, geo->min, geo->size, geo->max,
                *preferred_out);
  return 0;
}
