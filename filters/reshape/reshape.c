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
 * Each mechanism lives in its own file with its own header; the order
 * in which a client request passes them is decided here alone.  Here
 * too is the registry of exports: what an export's connections share
 * (the read cache, staged writes) is found by its name and whether the
 * client uses TLS (tls-fallback serves the two different data under
 * one name), and what is learnt of the plugin is the name's, kept
 * after its connections close so that a client that reconnects keeps
 * it.
 */

#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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



/* What the connections of an export (a name, plain or TLS) share:
 * made at its first connection, freed at its last close.
 */
struct export {
  unsigned refs;                /* connections (registry lock) */
  struct readahead_cache cache; /* with multi-conn */
  struct writeback *wb;         /* staged writes */
  struct auto_export *autoexp;  /* the name's: outlives the above */
};

/* One export name, most recently used first.  Kept while no
 * connection holds it, for its learning, for EXPORTS_MAX names.
 */
struct record {
  char *name;
  struct auto_export *autoexp;
  struct export by_tls[2];
  struct record *next;
};

/* The registry's lock is taken when a connection opens or closes, and
 * by the report's walks: never on a request's path.
 */
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

/* The record of name, made if new (the least recently used one no
 * connection holds forgotten if the registry is full), moved to the
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

/* fn on every name's learning, most recently used first. */
static void
export_each (auto_visit *fn, void *opaque)
{
  struct record *e;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&registry.lock);

  for (e = registry.list; e; e = e->next)
    fn (e->autoexp, opaque);
}

/* At unload: every name no connection holds (one may still be closing
 * when nbdkit quits on a signal).
 */
static void
export_free_all (void)
{
  struct record **pp = &registry.list, *e;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&registry.lock);

  while ((e = *pp) != NULL) {
    if (record_held (e)) {
      pp = &e->next;
      continue;
    }
    *pp = e->next;
    registry.count--;
    record_free (e);
  }
}

static void report_summary (FILE *fp) { auto_summary (export_each, fp); }
static void report_tables (FILE *fp) { auto_tables (export_each, fp); }
static void report_json (FILE *fp) { auto_json (export_each, fp); }

static const struct stats_learning export_stats = {
  .summary = report_summary, .tables = report_tables, .json = report_json,
};

/* One client connection. */
struct handle {
  struct export *exp;
  struct geometry geo;          /* settled at prepare */
  uint32_t preferred;           /* block size told to clients */
  bool multi_conn;              /* the plugin allows multi-conn */
  bool staging;                 /* it stages writes (write-back) */
  struct readahead_cache *cache;/* readahead's: see conn_cache */
  struct readahead_cache own;   /* a cache of its own */
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

/* A request's context on its way down. */
static void
io_init (struct io *io, nbdkit_next *next, struct handle *h)
{
  /* reshape-size=SIZE: nothing to learn, nothing timed. */
  *io = (struct io) { .next = next, .geo = &h->geo, .split = &h->split,
                      .autoexp = reshape_cfg.size ? NULL : h->exp->autoexp,
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
static void
conn_cache (struct handle *h)
{
  if (readahead_on (h))
    h->cache = h->multi_conn ? &h->exp->cache : &h->own;
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
  conn_cache (h);
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
  struct readahead_range *ahead = NULL;
  int r;

  stats_client (OP_PREAD, count);
  sockbuf_reply (&h->sb, count);
  io_init (&io, next, h);
  /* Cache hits are never older than staged data: staging a write drops
   * what it overlaps from the caches.
   */
  writeback_begin (&h->wb, &io, offset, offset + count, &claim);
  r = READAHEAD_PASS;
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
  if (reshape_cfg.writeback)
    r = writeback_pwrite (&h->wb, &io, buf, count, offset, flags, err);
  else
    r = split_pwrite (&io, buf, count, offset, flags, err);
  /* Coherence: before the reply, whatever the outcome. */
  readahead_invalidate (offset, offset + count);
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
  readahead_invalidate (offset, offset + count);
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
  readahead_prefetch (h->cache, &io, count, offset);
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
