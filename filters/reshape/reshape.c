/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * The nbdkit callbacks, and the order in which the mechanisms see each
 * request, top to bottom:
 *
 *   pread    write-back: staged writes there go to the plugin first;
 *              what it refuses is laid over the result
 *            readahead: the read cache, runs of grains (reshape-readahead)
 *            split: pieces of the optimal size, partial blocks
 *   pwrite   write-back: staged, or passed down      (reshape-writeback)
 *            split; then every cache forgets the range
 *   zero,    write-back: staged writes there first
 *   trim     split; then every cache forgets the range
 *   extents  write-back: staged writes there first; split
 *   cache    readahead: read into the cache, if there is one
 *            split
 *   flush    write-back: everything staged before it; the plugin's
 *            flush
 *
 * Each mechanism lives in its own file with its own header.  The order
 * in which a client request passes the stages is decided here alone:
 * a stage hands the request on through the struct io built here.  The
 * stages' own plugin requests (a readahead run, a write-back) go
 * straight to split.c, the bottom.
 */

#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nbdkit-filter.h>

#include "cache.h"
#include "common.h"
#include "params.h"
#include "export.h"
#include "pool.h"
#include "sockbuf.h"
#include "split.h"
#include "stats.h"
#include "stream.h"
#include "tunables.h"
#include "auto.h"
#include "helpers.h"
#include "warn.h"
#include "writeback.h"


/* One client connection. */
struct handle {
  struct export *exp;
  struct geometry geo;          /* settled at prepare */
  uint32_t preferred;           /* block size told to clients */
  bool multi_conn;              /* the plugin allows multi-conn */
  bool staging;                 /* it stages writes (write-back) */
  struct cache *cache;          /* readahead's: see conn_cache */
  int next_cache;               /* the layer below's can_cache */
  struct split_conn split;
  struct stream stream;
  struct wb_conn wb;
  struct sockbuf_conn sb;
};

/* The stages below write-back and the stream, for struct io. */
static int
pread_below (const struct io *io, void *buf, uint32_t count,
             uint64_t offset, int *err)
{
  return split_pread (io, buf, count, offset, err);
}

static int
pwrite_below (const struct io *io, const void *buf, uint32_t count,
              uint64_t offset, uint32_t flags, int *err)
{
  return split_pwrite (io, buf, count, offset, flags, err);
}

static bool
flush_staged (const struct io *io, uint64_t lo, uint64_t hi)
{
  struct handle *h = io->conn;

  return writeback_clean (&h->wb, io, lo, hi);
}

/* A request's context on its way down. */
static void
io_init (struct io *io, nbdkit_next *next, struct handle *h)
{
  /* reshape-size=SIZE: nothing to learn, nothing timed. */
  *io = (struct io) { .next = next, .geo = &h->geo, .split = &h->split,
                      .autoexp = reshape_cfg.size ? NULL : h->exp->autoexp,
                      .pread_below = pread_below,
                      .pwrite_below = pwrite_below,
                      .flush_staged = flush_staged,
                      .conn = h };
}

/* Twice in one stack, the copies would share one set of globals (and
 * the outer one's block locks would block the inner one): refuse.
 */
static unsigned instances;

static void
reshape_load (void)
{
  instances++;
  stats_start ();
}

static void
reshape_unload (void)
{
  stats_report (reshape_cfg.stats_file, reshape_cfg.size,
                reshape_cfg.size ? NULL : &export_stats);
  export_free_all ();
  pool_free_all ();
  params_free ();
}

static int
reshape_config (nbdkit_next_config *next, nbdkit_backend *nxdata,
                const char *key, const char *value)
{
  int r = params_key (key, value);

  if (r == -1)
    return -1;
  if (r == 1)
    return 0;
  params_other (key, value);
  /* nbdkit's blocksize filter below takes these: the two would cut
   * and align each other's requests.
   */
  if (strcmp (key, "minblock") == 0 || strcmp (key, "maxdata") == 0 ||
      strcmp (key, "maxlen") == 0)
    reshape_warning ("%s= reaches a layer below the reshape filter: "
                     "do not stack nbdkit's blocksize filter with it "
                     "(reshape-min, reshape-maxdata, reshape-maxlen do "
                     "that job)", key);
  return next (nxdata, key, value);
}

static int
reshape_config_complete (nbdkit_next_config_complete *next,
                         nbdkit_backend *nxdata)
{
  if (instances > 1) {
    nbdkit_error ("the reshape filter can appear only once in a stack");
    return -1;
  }
  /* Fail now, not at exit, if the report cannot be written. */
  if (params_complete () == -1 ||
      (reshape_cfg.stats_file && stats_check (reshape_cfg.stats_file) == -1))
    return -1;
  pool_init (reshape_cfg.pool);
  pool_set_reclaim (cache_reclaim);
  sockbuf_configure (reshape_cfg.sndbuf_set, reshape_cfg.sndbuf);
  return next (nxdata);
}

static int
reshape_get_ready (int thread_model)
{
  params_set_thread_model (thread_model);
  writeback_thread_model (thread_model);
  return 0;
}

/* Threads start after nbdkit forks into the background. */
static int
reshape_after_fork (nbdkit_backend *nxdata)
{
  if (!reshape_cfg.parallel_ok || reshape_cfg.parallel <= 1)
    return 0;
  return helpers_start (reshape_cfg.parallel - 1);
}

/* nbdkit runs .cleanup, filter first, once every connection has
 * ended and before it frees anything.
 */
static void
reshape_cleanup (nbdkit_backend *nxdata)
{
  helpers_stop ();
}

/* reshape-writeback=true under -r: said once. */
static bool told_readonly;

static void *
reshape_open (nbdkit_next_open *next, nbdkit_context *nxdata,
              int readonly, const char *exportname, int is_tls)
{
  struct handle *h;

  if (next (nxdata, readonly, exportname) == -1)
    return NULL;
  if (readonly && reshape_cfg.writeback &&
      !__atomic_exchange_n (&told_readonly, true, __ATOMIC_RELAXED))
    reshape_warning ("reshape-writeback=true has no effect: the export is "
                     "read-only (nbdkit -r)");
  h = calloc (1, sizeof *h);
  if (h == NULL) {
    nbdkit_error ("calloc: %m");
    return NULL;
  }
  h->exp = export_get (exportname, is_tls);
  if (h->exp == NULL) {
    free (h);
    return NULL;
  }
  stream_init (&h->stream);
  sockbuf_open (&h->sb);
  return h;
}

static void
reshape_close (void *handle)
{
  struct handle *h = handle;

  if (h->cache && h->cache != h->exp->cache)
    cache_free (h->cache);
  stream_destroy (&h->stream);
  export_put (h->exp);
  free (h);
}

/* Over a plugin without multi-conn each connection has a read cache
 * of its own (conn_cache) while staged writes are the export's: a
 * cache could be filled around another connection's staged writes.
 * No test covers that pairing, so readahead stays off for it.
 */
static bool
readahead_on (const struct handle *h)
{
  return reshape_cfg.readahead && (!h->staging || h->multi_conn);
}

/* The cache readahead fills and reads: the export's, shared by its
 * connections, only if the plugin allows multi-conn.  Without it, the
 * plugin does not promise that connections see the same data (a
 * fresh disk each, as tmpdisk; what a client may see behind
 * tls-fallback), and one connection's reads must never serve
 * another's.  None without readahead: every write walks the live
 * caches.
 */
static int
conn_cache (struct handle *h)
{
  if (!readahead_on (h))
    return 0;
  h->cache = h->multi_conn ? h->exp->cache : cache_new ();
  if (h->cache == NULL) {
    nbdkit_error ("reshape: cache: %m");
    return -1;
  }
  return 0;
}

static int
reshape_prepare (nbdkit_next *next, void *handle, int readonly)
{
  struct handle *h = handle;
  uint32_t ppref;

  h->multi_conn = next->can_multi_conn (next) == 1;
  /* Staged data is durable only once flushed: over a plugin that
   * cannot flush, clients have no way to ask for that, so nothing is
   * staged.
   */
  h->staging = reshape_cfg.writeback && next->can_flush (next) == 1;
  if (conn_cache (h) == -1)
    return -1;
  if (params_limits (next, &h->geo, &ppref) == -1)
    return -1;
  /* reshape-size=auto: what earlier connections measured; nothing is
   * read from the plugin here.
   */
  if (reshape_cfg.size == 0)
    auto_connect (h->exp->autoexp, &h->geo, reshape_cfg.parallel_ok);
  params_sizes (&h->geo, ppref, &h->preferred);
  /* Balanced by writeback_close in finalize, which nbdkit calls only
   * for a connection whose prepare succeeded.  Only a context that can
   * write may write back for another export name (nbdkit asserts it).
   */
  writeback_open (&h->wb, h->exp->wb, h->multi_conn, h->staging,
                  readonly || next->can_write (next) != 1 ? NULL :
                  &(struct io) { .next = next, .geo = &h->geo,
                                 .split = &h->split });
  return 0;
}

/* The connection is closing: write back what it staged. */
static int
reshape_finalize (nbdkit_next *next, void *handle)
{
  struct handle *h = handle;
  struct io io;

  io_init (&io, next, h);
  writeback_close (&h->wb, &io);
  return 0;
}

/* The export rounded down to whole minimum blocks (params_limits). */
static int64_t
reshape_get_size (nbdkit_next *next, void *handle)
{
  struct handle *h = handle;

  return h->geo.exportsize;
}

/* Clients may send any size and alignment (the filter aligns for the
 * plugin), should send the size the filter cuts at, and may send up to
 * what the nbdkit server accepts.
 */
static int
reshape_block_size (nbdkit_next *next, void *handle,
                    uint32_t *minimum, uint32_t *preferred, uint32_t *maximum)
{
  struct handle *h = handle;

  *minimum = 1;
  *preferred = h->preferred;
  *maximum = CLIENT_MAX;
  return 0;
}

static int
reshape_pread (nbdkit_next *next, void *handle, void *buf, uint32_t count,
               uint64_t offset, uint32_t flags, int *err)
{
  struct handle *h = handle;
  struct io io;
  struct wb_claim claim;
  struct stream_ahead ahead = { .due = false };
  int r;

  stats_client (OP_PREAD, count);
  sockbuf_reply (&h->sb, count);
  io_init (&io, next, h);
  /* Cache hits are never older than staged data: staging a write drops
   * what it overlaps from the caches.
   */
  writeback_begin (&h->wb, &io, offset, offset + count, &claim);
  r = STREAM_PASS;
  if (readahead_on (h) && !(io.autoexp && auto_fast (io.autoexp)))
    r = stream_pread (&h->stream, h->cache, &io, buf, count, offset,
                      &ahead, err);
  if (r == STREAM_PASS)
    r = pread_below (&io, buf, count, offset, err);
  writeback_end_read (&claim, buf, count, offset, r == 0);
  stream_fetch_ahead (&h->stream, h->cache, &io, &ahead);
  return r;
}

static int
reshape_pwrite (nbdkit_next *next, void *handle, const void *buf,
                uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  struct handle *h = handle;
  struct io io;
  int r;

  stats_client (OP_PWRITE, count);
  io_init (&io, next, h);
  if (reshape_cfg.writeback)
    r = writeback_pwrite (&h->wb, &io, buf, count, offset, flags, err);
  else
    r = pwrite_below (&io, buf, count, offset, flags, err);
  /* Coherence: before the reply, whatever the outcome. */
  cache_invalidate_all (offset, offset + count);
  return r;
}

/* Zero and trim: staged writes there go first; a zero is copied into
 * those the plugin refuses, a trim leaves them (any contents are right
 * after a trim).  Cached data there is dropped before the reply,
 * whatever the outcome.
 */
static int
erase (nbdkit_next *next, struct handle *h, enum stats_op op,
       uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  struct io io;
  struct wb_claim claim;
  int r;

  stats_client (op, count);
  io_init (&io, next, h);
  if (writeback_order (&h->wb, offset, offset + count, err) == -1)
    return -1;
  writeback_begin (&h->wb, &io, offset, offset + count, &claim);
  if (op == OP_ZERO) {
    r = split_zero (&io, count, offset, flags, err);
    writeback_end_write (&claim, NULL, count, offset, r == 0);
  }
  else {
    r = split_trim (&io, count, offset, flags, err);
    writeback_release (&claim);
  }
  cache_invalidate_all (offset, offset + count);
  return r;
}

static int
reshape_zero (nbdkit_next *next, void *handle, uint32_t count,
              uint64_t offset, uint32_t flags, int *err)
{
  return erase (next, handle, OP_ZERO, count, offset, flags, err);
}

static int
reshape_trim (nbdkit_next *next, void *handle, uint32_t count,
              uint64_t offset, uint32_t flags, int *err)
{
  return erase (next, handle, OP_TRIM, count, offset, flags, err);
}

/* With a read cache, cache requests fill it (so that nbdkit's scan
 * filter above helps whatever the plugin): the filter caches natively.
 * The layer below is asked first in any case: nbdkit's core passes a
 * cache request down only to a layer whose answer it has, and a filter
 * below (readahead) may act on being asked.
 */
static int
reshape_can_cache (nbdkit_next *next, void *handle)
{
  struct handle *h = handle;

  h->next_cache = next->can_cache (next);
  if (h->next_cache == -1)
    return -1;
  if (h->cache)
    return NBDKIT_CACHE_NATIVE;
  return h->next_cache;
}

static int
reshape_cache (nbdkit_next *next, void *handle, uint32_t count,
               uint64_t offset, uint32_t flags, int *err)
{
  struct handle *h = handle;
  struct io io;

  stats_client (OP_CACHE, count);
  io_init (&io, next, h);
  /* A plugin learnt to have no latency gains nothing from a copy; a
   * layer below that does not cache gets no request (a hint, done).
   */
  if (h->cache == NULL || (io.autoexp && auto_fast (io.autoexp))) {
    if (h->next_cache == NBDKIT_CACHE_NONE)
      return 0;
    return split_cache (&io, count, offset, flags, err);
  }
  stream_prefetch (h->cache, &io, count, offset);
  return 0;
}

static int
reshape_extents (nbdkit_next *next, void *handle, uint32_t count,
                 uint64_t offset, uint32_t flags,
                 struct nbdkit_extents *extents, int *err)
{
  struct handle *h = handle;
  struct io io;
  struct wb_claim claim;

  stats_client (OP_EXTENTS, count);
  io_init (&io, next, h);
  /* Staged data would otherwise look like a hole, or like what the
   * plugin has: while the plugin refuses it, fail.
   */
  writeback_begin (&h->wb, &io, offset, offset + count, &claim);
  writeback_release (&claim);
  if (claim.held) {
    *err = claim.err;
    return -1;
  }
  return split_extents (&io, count, offset, flags, extents, err);
}

static int
reshape_flush (nbdkit_next *next, void *handle, uint32_t flags, int *err)
{
  struct handle *h = handle;
  struct io io;
  int wb_err = 0, r;

  stats_client (OP_FLUSH, 0);
  io_init (&io, next, h);
  /* Staged writes first.  The plugin's flush then makes durable what
   * did reach it, even when some of them failed (those stay staged
   * and fail this flush).
   */
  r = writeback_flush (&h->wb, &io, &wb_err);
  if (split_flush (next, flags, err) == -1)
    return -1;
  if (r == -1) {
    *err = wb_err;
    return -1;
  }
  return 0;
}

static struct nbdkit_filter filter = {
  .name              = "reshape",
  /* --version prints nbdkit's version for every filter (_version must
   * match it); --help prints this.
   */
  .longname          = "nbdkit reshape filter " PACKAGE_VERSION,
  .description       = "reshape request sizes into the plugin's optimum",
  .load              = reshape_load,
  .unload            = reshape_unload,
  .config            = reshape_config,
  .config_complete   = reshape_config_complete,
  .config_help       = PARAMS_HELP,
  .get_ready         = reshape_get_ready,
  .after_fork        = reshape_after_fork,
  .cleanup           = reshape_cleanup,
  .open              = reshape_open,
  .close             = reshape_close,
  .prepare           = reshape_prepare,
  .finalize          = reshape_finalize,
  .get_size          = reshape_get_size,
  .block_size        = reshape_block_size,
  .pread             = reshape_pread,
  .pwrite            = reshape_pwrite,
  .zero              = reshape_zero,
  .trim              = reshape_trim,
  .can_cache         = reshape_can_cache,
  .cache             = reshape_cache,
  .extents           = reshape_extents,
  .flush             = reshape_flush,
};

NBDKIT_REGISTER_FILTER (filter)
