/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * The nbdkit callbacks, and the order in which each request passes
 * the mechanisms, top to bottom:
 *
 *   pread    write-back: staged writes there first, what the plugin
 *              refuses laid over the result; read-ahead; split
 *   pwrite   write-back: staged, or passed down to split; then every
 *              cache forgets the range
 *   zero,    write-back: staged writes there first; split; then every
 *   trim       cache forgets the range
 *   extents  write-back: staged writes there first; split
 *   cache    read-ahead, else split
 *   flush    write-back: everything staged; the plugin's flush
 *
 * And the registry of exports: what an export's connections share
 * (the read cache, staged writes) is found by its name and whether the
 * client uses TLS (tls-fallback serves the two different data under
 * one name); what is learnt of the plugin is the name's, kept after its
 * connections close, so that a client that reconnects keeps it.
 */

#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nbdkit-filter.h>

#include "auto.h"
#include "common.h"
#include "helpers.h"
#include "params.h"
#include "pool.h"
#include "readahead.h"
#include "sockbuf.h"
#include "split.h"
#include "stats.h"
#include "tunables.h"
#include "warn.h"
#include "writeback.h"

/* What an export's connections share: made at the first, freed at the
 * last close.
 */
struct export {
  unsigned refs;                /* registry lock */
  struct readahead_cache cache; /* with multi-conn */
  struct writeback *wb;
  struct auto_export *autoexp;  /* the name's */
};

/* One export name, kept while no connection holds it, for its
 * learning, for EXPORTS_MAX names.
 */
struct record {
  char *name;
  struct auto_export *autoexp;
  struct export by_tls[2];
  struct record *next;          /* most recently used first */
};

/* Taken when a connection opens or closes, and by the report. */
static struct {
  pthread_mutex_t lock;
  struct record *list;
  unsigned count;
} registry = { .lock = PTHREAD_MUTEX_INITIALIZER };

static void
export_close (struct export *exp)
{
  readahead_cache_drop (&exp->cache);
  if (exp->wb)
    writeback_drop (exp->wb);
  exp->wb = NULL;
}

static void
record_free (struct record *e)
{
  export_close (&e->by_tls[false]);
  export_close (&e->by_tls[true]);
  if (e->autoexp)
    auto_free (e->autoexp);
  free (e->name);
  free (e);
}

static bool
record_held (const struct record *e)
{
  return e->by_tls[false].refs || e->by_tls[true].refs;
}

/* name's record, made if new (the least recently used one no
 * connection holds forgotten when the registry is full), moved to the
 * front.  Registry lock held.
 */
static struct record *
record_get (const char *name)
{
  struct record **pp, *e, **victim = NULL;

  for (pp = &registry.list; (e = *pp) != NULL; pp = &e->next) {
    if (strcmp (e->name, name) == 0) {
      *pp = e->next;
      break;
    }
    if (!record_held (e))
      victim = pp;
  }
  if (e == NULL && registry.count >= EXPORTS_MAX && victim) {
    e = *victim;
    *victim = e->next;
    registry.count--;
    record_free (e);
    e = NULL;
  }
  if (e == NULL) {
    if ((e = calloc (1, sizeof *e)) == NULL ||
        (e->name = strdup (name)) == NULL ||
        (e->autoexp = auto_new (e->name)) == NULL) {
      const int saved = errno;
      if (e)
        record_free (e);
      errno = saved;
      return NULL;
    }
    e->by_tls[false].autoexp = e->by_tls[true].autoexp = e->autoexp;
    registry.count++;
  }
  e->next = registry.list;
  registry.list = e;
  return e;
}

static struct export *
export_get (const char *name, bool tls)
{
  struct record *e;
  struct export *exp = NULL;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&registry.lock);

  if ((e = record_get (name)) != NULL) {
    exp = &e->by_tls[tls];
    if (exp->refs == 0 && (exp->wb = writeback_new (e->name)) == NULL)
      exp = NULL;
  }
  if (exp == NULL) {
    nbdkit_error ("reshape: export state: %m");
    return NULL;
  }
  exp->refs++;
  return exp;
}

static void
export_put (struct export *exp)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&registry.lock);

  if (--exp->refs == 0)
    export_close (exp);
}

static void
export_each (auto_visit *fn, void *opaque)
{
  struct record *e;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&registry.lock);

  for (e = registry.list; e; e = e->next)
    fn (e->autoexp, opaque);
}

static void
reshape_learning (FILE *fp, enum stats_part part)
{
  auto_report (export_each, fp, part);
}

/* One client connection. */
struct handle {
  struct export *exp;
  struct geometry geo;          /* settled at prepare */
  uint32_t preferred;           /* told to clients */
  bool multi_conn;
  bool staging;                 /* it stages writes */
  struct readahead_cache *cache; /* read-ahead's, or NULL */
  struct readahead_cache own;
  int next_cache;               /* the layer below's can_cache */
  struct split_conn split;
  struct readahead_stream stream;
  struct wb_conn wb;
  struct sockbuf_conn sb;
};

static bool
flush_staged (const struct io *io, uint64_t lo, uint64_t hi)
{
  struct handle *h = io->conn;

  return writeback_clean (&h->wb, io, lo, hi);
}

static void
io_init (struct io *io, nbdkit_next *next, struct handle *h)
{
  /* reshape-size=SIZE: nothing to learn, nothing timed. */
  *io = (struct io) { .next = next, .geo = &h->geo, .split = &h->split,
                      .autoexp = reshape_cfg.size ? NULL : h->exp->autoexp,
                      .flush_staged = flush_staged, .conn = h };
}

/* Twice in one stack, the copies would share one set of globals (and
 * the outer one's block locks would block the inner one).
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
  struct record **pp = &registry.list, *e;

  stats_report (reshape_cfg.stats_file, reshape_cfg.size,
                reshape_cfg.size ? NULL : reshape_learning, true);
  /* A connection may still be closing (nbdkit quits on a signal): its
   * record stays, and what its cache holds is given back.
   */
  while ((e = *pp) != NULL)
    if (record_held (e))
      pp = &e->next;
    else {
      *pp = e->next;
      record_free (e);
    }
  readahead_invalidate (0, UINT64_MAX);
  pool_free_all ();
  params_free ();
}

static int
reshape_config (nbdkit_next_config *next, nbdkit_backend *nxdata,
                const char *key, const char *value)
{
  const int r = params_key (key, value);

  if (r != 0)
    return r == 1 ? 0 : -1;
  params_other (key, value);
  /* nbdkit's blocksize filter takes these: the two would cut and align
   * each other's requests.
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
  if (params_complete () == -1 ||
      (reshape_cfg.stats_file && stats_check (reshape_cfg.stats_file) == -1))
    return -1;
  pool_init (reshape_cfg.pool);
  pool_set_reclaim (readahead_reclaim);
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

/* Threads start after nbdkit forks, and stop at cleanup, once every
 * connection has ended.
 */
static int
reshape_after_fork (nbdkit_backend *nxdata)
{
  if (reshape_cfg.stats_file &&
      stats_live_start (reshape_cfg.stats_file, reshape_cfg.size,
                        reshape_cfg.size ? NULL : reshape_learning) == -1)
    return -1;
  if (!reshape_cfg.parallel_ok || reshape_cfg.parallel <= 1)
    return 0;
  return helpers_start (reshape_cfg.parallel - 1);
}

static void
reshape_cleanup (nbdkit_backend *nxdata)
{
  stats_live_stop ();
  helpers_stop ();
}

static void *
reshape_open (nbdkit_next_open *next, nbdkit_context *nxdata,
              int readonly, const char *exportname, int is_tls)
{
  static bool told_readonly;
  struct handle *h;

  if (next (nxdata, readonly, exportname) == -1)
    return NULL;
  if (readonly && reshape_cfg.writeback &&
      !__atomic_exchange_n (&told_readonly, true, __ATOMIC_RELAXED))
    reshape_warning ("reshape-writeback=true has no effect: the export is "
                     "read-only (nbdkit -r)");
  if ((h = calloc (1, sizeof *h)) == NULL) {
    nbdkit_error ("calloc: %m");
    return NULL;
  }
  if ((h->exp = export_get (exportname, is_tls)) == NULL) {
    free (h);
    return NULL;
  }
  readahead_stream_init (&h->stream);
  sockbuf_open (&h->sb);
  return h;
}

static void
reshape_close (void *handle)
{
  struct handle *h = handle;

  if (h->cache == &h->own)
    readahead_cache_drop (&h->own);
  export_put (h->exp);
  free (h);
}

static int
reshape_prepare (nbdkit_next *next, void *handle, int readonly)
{
  struct handle *h = handle;
  uint32_t ppref;

  h->multi_conn = next->can_multi_conn (next) == 1;
  /* Staged data is durable once flushed: over a plugin that cannot
   * flush, clients cannot ask for that, so nothing is staged.
   */
  h->staging = reshape_cfg.writeback && next->can_flush (next) == 1;
  /* The export's cache only with multi-conn: without it, connections
   * need not see the same data (tmpdisk, tls-fallback).  Over no
   * multi-conn, a connection's own cache could be filled around
   * another's staged writes: no read-ahead with write-back there.
   */
  if (reshape_cfg.readahead && (!h->staging || h->multi_conn))
    h->cache = h->multi_conn ? &h->exp->cache : &h->own;
  if (params_limits (next, &h->geo, &ppref) == -1)
    return -1;
  /* What earlier connections measured; nothing read here. */
  if (reshape_cfg.size == 0)
    auto_connect (h->exp->autoexp, &h->geo, reshape_cfg.parallel_ok);
  params_sizes (&h->geo, ppref, &h->preferred);
  /* Balanced by writeback_close in finalize, called only after a
   * prepare that succeeded.  Only a context that can write may write
   * back for another export name (nbdkit asserts it).
   */
  writeback_open (&h->wb, h->exp->wb, h->staging,
                  readonly || next->can_write (next) != 1 ? NULL :
                  &(struct io) { .next = next, .geo = &h->geo,
                                 .split = &h->split });
  return 0;
}

static int
reshape_finalize (nbdkit_next *next, void *handle)
{
  struct io io;

  io_init (&io, next, handle);
  writeback_close (&((struct handle *) handle)->wb, &io);
  return 0;
}

/* The export rounded down to whole blocks (params_limits). */
static int64_t
reshape_get_size (nbdkit_next *next, void *handle)
{
  return ((struct handle *) handle)->geo.exportsize;
}

/* Any size and alignment (the filter aligns), preferably the size
 * told, up to what nbdkit accepts.
 */
static int
reshape_block_size (nbdkit_next *next, void *handle,
                    uint32_t *minimum, uint32_t *preferred, uint32_t *maximum)
{
  *minimum = 1;
  *preferred = ((struct handle *) handle)->preferred;
  *maximum = CLIENT_MAX;
  return 0;
}

static int
reshape_pread (nbdkit_next *next, void *handle, void *buf, uint32_t count,
               uint64_t offset, uint32_t flags, int *err)
{
  struct handle *h = handle;
  struct readahead_range *ahead = NULL;
  struct wb_claim claim;
  struct io io;
  int r = READAHEAD_PASS;

  stats_client (OP_PREAD, count);
  sockbuf_reply (&h->sb, count);
  io_init (&io, next, h);
  /* Cached data is never older than staged data: staging a write
   * drops what it overlaps from the caches.
   */
  writeback_begin (&h->wb, &io, offset, offset + count, &claim);
  if (h->cache && !(io.autoexp && auto_fast (io.autoexp)))
    r = readahead_pread (h->cache, &h->stream, &io, buf, count, offset,
                         &ahead, err);
  if (r == READAHEAD_PASS)
    r = split_pread (&io, buf, count, offset, err);
  writeback_end_read (&claim, buf, count, offset, r == 0);
  readahead_fetch_ahead (&h->stream, &io, ahead);
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
  r = writeback_pwrite (&h->wb, &io, buf, count, offset, flags, err);
  readahead_invalidate (offset, offset + count);
  return r;
}

/* Zero and trim: staged writes there first; a zero is copied into
 * those the plugin refuses, a trim leaves them (any data is right
 * after a trim).
 */
static int
reshape_erase (nbdkit_next *next, struct handle *h, enum stats_op op,
       uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  struct wb_claim claim;
  struct io io;
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
  readahead_invalidate (offset, offset + count);
  return r;
}

static int
reshape_zero (nbdkit_next *next, void *handle, uint32_t count,
              uint64_t offset, uint32_t flags, int *err)
{
  return reshape_erase (next, handle, OP_ZERO, count, offset, flags, err);
}

static int
reshape_trim (nbdkit_next *next, void *handle, uint32_t count,
              uint64_t offset, uint32_t flags, int *err)
{
  return reshape_erase (next, handle, OP_TRIM, count, offset, flags, err);
}

/* With a read cache, cache requests fill it (nbdkit's scan filter above
 * then helps any plugin).  The layer below is asked first all the same:
 * nbdkit passes a cache request down only to a layer it has asked.
 */
static int
reshape_can_cache (nbdkit_next *next, void *handle)
{
  struct handle *h = handle;

  h->next_cache = next->can_cache (next);
  if (h->next_cache == -1 || h->cache == NULL)
    return h->next_cache;
  return NBDKIT_CACHE_NATIVE;
}

static int
reshape_cache (nbdkit_next *next, void *handle, uint32_t count,
               uint64_t offset, uint32_t flags, int *err)
{
  struct handle *h = handle;
  struct io io;

  stats_client (OP_CACHE, count);
  io_init (&io, next, h);
  /* A plugin without latency gains nothing from a copy; a layer that
   * does not cache gets nothing (a hint, done).
   */
  if (h->cache && !(io.autoexp && auto_fast (io.autoexp)))
    readahead_prefetch (h->cache, &io, count, offset);
  else if (h->next_cache != NBDKIT_CACHE_NONE)
    return split_cache (&io, count, offset, flags, err);
  return 0;
}

static int
reshape_extents (nbdkit_next *next, void *handle, uint32_t count,
                 uint64_t offset, uint32_t flags,
                 struct nbdkit_extents *extents, int *err)
{
  struct handle *h = handle;
  struct wb_claim claim;
  struct io io;

  stats_client (OP_EXTENTS, count);
  io_init (&io, next, h);
  /* Staged data would look like a hole, or like what the plugin has:
   * while the plugin refuses it, fail.
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
  /* The plugin's flush makes durable what did reach it, even when some
   * staged writes failed (they stay staged and fail this flush).
   */
  r = writeback_flush (&h->wb, &io, &wb_err);
  if (split_flush (next, flags, err) == -1)
    return -1;
  if (r == -1)
    *err = wb_err;
  return r;
}

static struct nbdkit_filter filter = {
  .name              = "reshape",
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
