/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * The nbdkit callbacks.  This file only wires them to the mechanisms;
 * see reshape.h for which file does what.
 */

#include <config.h>

#include <errno.h>
#include <stdlib.h>

#include <nbdkit-filter.h>

#include "reshape.h"

NBDKIT_DLL_PUBLIC int reshape_debug_split;
NBDKIT_DLL_PUBLIC int reshape_debug_rmw;
NBDKIT_DLL_PUBLIC int reshape_debug_sockbuf;

/* Twice in one stack, the copies would share one set of globals (and
 * the outer one's block locks would block the inner one): refuse.
 */
static unsigned instances;

static void
reshape_load (void)
{
  instances++;
}

static void
reshape_unload (void)
{
  reshape_stats_report (reshape_cfg.stats_file);
  pool_free_all ();
  reshape_config_free ();
}

static int
reshape_config (nbdkit_next_config *next, nbdkit_backend *nxdata,
                const char *key, const char *value)
{
  int r = reshape_config_key (key, value);

  if (r == -1)
    return -1;
  if (r == 1)
    return 0;
  return next (nxdata, key, value);
}

static int
reshape_config_complete_cb (nbdkit_next_config_complete *next,
                            nbdkit_backend *nxdata)
{
  if (instances > 1) {
    nbdkit_error ("the reshape filter can appear only once in a stack");
    return -1;
  }
  if (reshape_config_complete () == -1)
    return -1;
  return next (nxdata);
}

static int
reshape_get_ready (int thread_model)
{
  reshape_parallel_ok = thread_model == NBDKIT_THREAD_MODEL_PARALLEL;
  return 0;
}

/* Threads start after nbdkit forks into the background. */
static int
reshape_after_fork (nbdkit_backend *nxdata)
{
  if (!reshape_parallel_ok || reshape_cfg.parallel <= 1)
    return 0;
  return reshape_workers_start (reshape_cfg.parallel - 1);
}

static void
reshape_cleanup (nbdkit_backend *nxdata)
{
  reshape_workers_stop ();
}

static void *
reshape_open (nbdkit_next_open *next, nbdkit_context *nxdata,
              int readonly, const char *exportname, int is_tls)
{
  struct reshape_handle *h;

  if (next (nxdata, readonly, exportname) == -1)
    return NULL;
  h = calloc (1, sizeof *h);
  if (h == NULL) {
    nbdkit_error ("calloc: %m");
    return NULL;
  }
  h->exp = reshape_export_get (exportname);
  if (h->exp == NULL) {
    free (h);
    return NULL;
  }
  reshape_readahead_init (&h->ra);
  reshape_writeback_open (h);
  reshape_sockbuf_open (h);
  return h;
}

static void
reshape_close (void *handle)
{
  struct reshape_handle *h = handle;

  reshape_readahead_destroy (&h->ra);
  reshape_export_put (h->exp);
  free (h);
}

/* The connection is closing: write back what it staged. */
static int
reshape_finalize (nbdkit_next *next, void *handle)
{
  reshape_writeback_finalize (next, handle);
  return 0;
}

static int
reshape_prepare (nbdkit_next *next, void *handle, int readonly)
{
  struct reshape_handle *h = handle;

  h->multi_conn = next->can_multi_conn (next) == 1;
  return reshape_geometry (next, &h->geo);
}

/* Clients may send any size and alignment (the filter aligns for the
 * plugin), should send the size the filter cuts at, and may send up to
 * what the nbdkit server accepts.
 */
static int
reshape_block_size (nbdkit_next *next, void *handle,
                    uint32_t *minimum, uint32_t *preferred, uint32_t *maximum)
{
  struct reshape_handle *h = handle;

  *minimum = 1;
  *preferred = h->geo.preferred;
  *maximum = RESHAPE_CLIENT_MAX;
  return 0;
}

static int
reshape_pread (nbdkit_next *next, void *handle, void *buf, uint32_t count,
               uint64_t offset, uint32_t flags, int *err)
{
  struct writeback_claim c;
  int r;

  reshape_stats_client (OP_PREAD, count);
  reshape_sockbuf_reply (handle, count);
  /* Staged writes there first; what the plugin would not take is laid
   * over the read (cache hits are never older: staging a write drops
   * what it overlaps from the caches).
   */
  reshape_writeback_begin (next, handle, offset, offset + count, &c);
  r = reshape_readahead_pread (next, handle, buf, count, offset, err);
  reshape_writeback_end_read (&c, buf, count, offset, r == 0);
  return r;
}

static int
reshape_pwrite (nbdkit_next *next, void *handle, const void *buf,
                uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  struct reshape_handle *h = handle;
  int r;

  reshape_stats_client (OP_PWRITE, count);
  r = reshape_writeback_pwrite (next, h, buf, count, offset, flags, err);
  /* Coherence: before the reply, whatever the outcome. */
  reshape_export_invalidate (offset, offset + count);
  return r;
}

/* Zero and trim: staged writes there go first (a zero is copied into
 * those the plugin would not take; a trim leaves them, any contents
 * being right after a trim), and cached data there is dropped before
 * the reply, whatever the outcome.
 */
typedef int (*data_less_fn) (nbdkit_next *next, struct reshape_handle *h,
                             uint32_t count, uint64_t offset,
                             uint32_t flags, int *err);

static int
data_less (enum reshape_op op, data_less_fn fn, nbdkit_next *next,
           struct reshape_handle *h, uint32_t count, uint64_t offset,
           uint32_t flags, int *err)
{
  struct writeback_claim c;
  int r;

  reshape_stats_client (op, count);
  reshape_writeback_begin (next, h, offset, offset + count, &c);
  r = fn (next, h, count, offset, flags, err);
  if (op == OP_ZERO)
    reshape_writeback_end_write (&c, NULL, count, offset, r == 0);
  else
    reshape_writeback_release (&c);
  reshape_export_invalidate (offset, offset + count);
  return r;
}

static int
reshape_zero (nbdkit_next *next, void *handle, uint32_t count,
              uint64_t offset, uint32_t flags, int *err)
{
  return data_less (OP_ZERO, reshape_split_zero, next, handle,
                    count, offset, flags, err);
}

static int
reshape_trim (nbdkit_next *next, void *handle, uint32_t count,
              uint64_t offset, uint32_t flags, int *err)
{
  return data_less (OP_TRIM, reshape_split_trim, next, handle,
                    count, offset, flags, err);
}

static int
reshape_cache (nbdkit_next *next, void *handle, uint32_t count,
               uint64_t offset, uint32_t flags, int *err)
{
  reshape_stats_client (OP_CACHE, count);
  return reshape_split_cache (next, handle, count, offset, flags, err);
}

static int
reshape_extents (nbdkit_next *next, void *handle, uint32_t count,
                 uint64_t offset, uint32_t flags,
                 struct nbdkit_extents *extents, int *err)
{
  struct writeback_claim c;
  bool staged;

  reshape_stats_client (OP_EXTENTS, count);
  /* Staged data would otherwise look like a hole, or like what the
   * plugin has: while the plugin will not take it, fail.
   */
  reshape_writeback_begin (next, handle, offset, offset + count, &c);
  staged = c.list != NULL;
  reshape_writeback_release (&c);
  if (staged) {
    *err = c.err;
    return -1;
  }
  return reshape_split_extents (next, handle, count, offset, flags,
                                extents, err);
}

static int
reshape_flush (nbdkit_next *next, void *handle, uint32_t flags, int *err)
{
  int wb_err = 0, r;

  reshape_stats_client (OP_FLUSH, 0);
  /* Staged writes first; the plugin's flush makes durable what they
   * got there, even when some of them failed (those stay staged and
   * fail this flush).
   */
  r = reshape_writeback_flush (next, handle, &wb_err);
  reshape_stats_plugin (OP_FLUSH, 0);
  if (next->flush (next, flags, err) == -1)
    return -1;
  if (r == -1) {
    *err = wb_err;
    return -1;
  }
  return 0;
}

static struct nbdkit_filter filter = {
  .name              = "reshape",
  .longname          = "nbdkit reshape filter",
  .description       = "reshape request sizes into the plugin's optimum",
  .load              = reshape_load,
  .unload            = reshape_unload,
  .config            = reshape_config,
  .config_complete   = reshape_config_complete_cb,
  .config_help       = RESHAPE_CONFIG_HELP,
  .get_ready         = reshape_get_ready,
  .after_fork        = reshape_after_fork,
  .cleanup           = reshape_cleanup,
  .open              = reshape_open,
  .close             = reshape_close,
  .prepare           = reshape_prepare,
  .finalize          = reshape_finalize,
  .block_size        = reshape_block_size,
  .pread             = reshape_pread,
  .pwrite            = reshape_pwrite,
  .zero              = reshape_zero,
  .trim              = reshape_trim,
  .cache             = reshape_cache,
  .extents           = reshape_extents,
  .flush             = reshape_flush,
};

NBDKIT_REGISTER_FILTER (filter)
