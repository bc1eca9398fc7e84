/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Client requests become plugin requests here.  Every read, write,
 * zero, trim, cache, extents and flush request the plugin gets comes
 * through this file; with reshape-size=auto its data reads and writes
 * are timed for auto.c.  Each
 * operation walks its range (walk.c) and runs one small function per
 * piece.  Data pieces read into or write from slices of the client's
 * buffer directly; only partial blocks go through bounce buffers from
 * the pool: read whole, then copied out (reads) or patched and written
 * back whole (writes: read-modify-write).
 *
 * Locking.  Each piece of a write, zero or trim locks the blocks it
 * covers while it runs: exclusively when it read-modify-writes a
 * partial block, shared when it writes whole blocks.  So whole-block
 * writers run in parallel with each other but never inside somebody's
 * read-modify-write of the same block, and two requests that only
 * share a block wait for each other on that block alone.  A piece
 * holds one lock at a time and takes it before its bounce buffer, so
 * locks cannot deadlock with each other or with the pool.  There is
 * one lock table for the whole process: export names do not tell
 * whether two exports share storage (many plugins ignore them).
 * Reads take no lock: a read-modify-write writes back the bytes it
 * did not change as they were, so a concurrent read sees old or new
 * data, never torn data.
 */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <nbdkit-filter.h>

#include "common.h"
#include "params.h"
#include "pool.h"
#include "rangelock.h"
#include "split.h"
#include "stats.h"
#include "walk.h"
#include "helpers.h"

/* -D reshape.split=1: each piece; -D reshape.rmw=1: each
 * read-modify-write.
 */
NBDKIT_DLL_PUBLIC int reshape_debug_split;
NBDKIT_DLL_PUBLIC int reshape_debug_rmw;

static struct rangelock locks = {
  .lock = PTHREAD_MUTEX_INITIALIZER,
  .changed = PTHREAD_COND_INITIALIZER,
};

/* One request being cut into pieces: what each piece needs. */
struct op {
  const struct io *io;
  uint64_t offset;            /* where the client request starts */
  char *rbuf;                 /* pread */
  const char *wbuf;           /* pwrite */
  uint32_t flags;             /* flags for each piece */
  uint32_t cap;               /* no piece larger: maxdata or maxlen */
  bool write;                 /* pieces take block-range locks */
  bool timed;                 /* data pieces: tell auto.c their cost */
  bool own;                   /* the filter's own read, no client's */
};

typedef int (*piece_fn) (const struct op *o, const struct piece *p,
                         int *err);

/* Read the whole block of partial piece p into a bounce buffer. */
static void *
read_block (const struct io *io, const struct piece *p, int *err)
{
  void *blk = pool_get (POOL_BOUNCE, p->blk_count);

  if (blk == NULL) {
    *err = errno;
    nbdkit_error ("reshape: bounce buffer: %m");
    return NULL;
  }
  stats_plugin (OP_PREAD, p->blk_count);
  if (io->next->pread (io->next, blk, p->blk_count, p->blk_offset, 0,
                       err) == -1) {
    pool_put (POOL_BOUNCE, blk, p->blk_count);
    return NULL;
  }
  return blk;
}

static int
rmw_read (const struct io *io, const struct piece *p, void *dst, int *err)
{
  char *blk = read_block (io, p, err);

  if (blk == NULL)
    return -1;
  memcpy (dst, blk + (p->offset - p->blk_offset), p->count);
  pool_put (POOL_BOUNCE, blk, p->blk_count);
  stats_add (C_RMW_READS, 1);
  stats_add (C_PAD_BYTES, p->blk_count - p->count);
  return 0;
}

/* The caller holds the block's range lock exclusively, so no other
 * write to the block can slip in between the read and the write back.
 * src == NULL writes zeros.
 */
static int
rmw_write (const struct io *io, const struct piece *p, const void *src,
           uint32_t flags, int *err)
{
  char *blk = read_block (io, p, err);
  char *at;
  int r;

  if (blk == NULL)
    return -1;
  stats_add (C_PAD_BYTES, p->blk_count);     /* no client read any of it */
  at = blk + (p->offset - p->blk_offset);
  if (src)
    memcpy (at, src, p->count);
  else
    memset (at, 0, p->count);
  if (reshape_debug_rmw)
    nbdkit_debug ("reshape: rmw block %" PRIu64 "+%" PRIu32
                  " for %" PRIu64 "+%" PRIu32,
                  p->blk_offset, p->blk_count, p->offset, p->count);
  stats_plugin (OP_PWRITE, p->blk_count);
  r = io->next->pwrite (io->next, blk, p->blk_count, p->blk_offset, flags,
                        err);
  pool_put (POOL_BOUNCE, blk, p->blk_count);
  if (r == 0)
    stats_add (C_RMW_WRITES, 1);
  return r;
}

/* One piece, under its block-range lock for writes (see the top). */
static int
run_piece (const struct op *o, const struct piece *p, piece_fn fn, int *err)
{
  struct rangelock_entry e;
  int r;

  if (!o->write || o->io->geo->min == 1)   /* no partial blocks ever */
    return fn (o, p, err);
  if (rangelock_acquire (&locks, &e, p->blk_offset,
                         p->blk_offset + p->blk_count, p->partial))
    stats_add (C_LOCK_WAITS, 1);
  r = fn (o, p, err);
  rangelock_release (&locks, &e);
  return r;
}

/* The pieces of one request, taken one at a time by every thread that
 * works on it (the requesting thread and any helpers).
 */
struct shared_walk {
  pthread_mutex_t lock;
  struct walk w;
  const struct op *o;
  piece_fn fn;
  unsigned n;                 /* pieces handed out */
  int err;                    /* first error, 0 if none */
  struct piece failed;        /* the piece that failed first */
  bool failed_on_helper;      /* ... on a helper thread */
  pthread_t requester;
  uint64_t busy_ns;           /* time spent in pieces, all threads */
};

static bool
take_piece (struct shared_walk *sw, struct piece *p, unsigned *n)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&sw->lock);

  if (sw->err || !walk_next (&sw->w, p))
    return false;
  *n = sw->n++;
  return true;
}

static void
work_on (void *opaque)
{
  struct shared_walk *sw = opaque;
  struct piece p;
  unsigned n;
  uint64_t busy = 0;
  int err = 0;

  while (take_piece (sw, &p, &n)) {
    const uint64_t start = now_ns ();

    if (reshape_debug_split)
      nbdkit_debug ("reshape: piece %u: %" PRIu64 "+%" PRIu32 "%s",
                    n, p.offset, p.count, p.partial ? " (partial)" : "");
    if (run_piece (sw->o, &p, sw->fn, &err) == -1) {
      ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&sw->lock);
      if (sw->err == 0) {
        sw->err = err;
        sw->failed = p;
        sw->failed_on_helper = !pthread_equal (pthread_self (),
                                               sw->requester);
      }
    }
    else if (sw->o->timed && !p.partial)
      auto_time (sw->o->io->autoexp, sw->o->write ? AUTO_WRITE : AUTO_READ,
                   p.count, now_ns () - start);
    busy += now_ns () - start;
  }
  /* Once per thread, not per piece: the lock is on the request's path. */
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&sw->lock);
  sw->busy_ns += busy;
}

/* At most how many pieces a range of count bytes cut at multiples of
 * step makes: count / step whole steps, plus the parts of a step at
 * either end.  (Partial blocks lie inside those end parts.)
 */
static uint64_t
max_pieces (uint64_t count, uint32_t step)
{
  return count / step + 2;
}

/* How many helpers a request deserves: one per piece beyond the
 * requester's own, at most reshape-parallel - 1, none when the plugin
 * is not fully parallel.
 */
static unsigned
helpers_for (uint64_t count, uint32_t step)
{
  const unsigned fanout = reshape_cfg.parallel;

  if (!reshape_cfg.parallel_ok || fanout <= 1)
    return 0;
  return MIN (max_pieces (count, step) - 1, fanout - 1);
}

/* Helpers overlap plugin time; a plugin that answered the last split
 * request's pieces in less than PLUGIN_SLOW_NS each on average (memory,
 * the page cache) has none to overlap, and waking helpers would cost
 * more than it saves.  The pieces then run in the requesting thread,
 * and their times tell when the plugin gets slow again.  Reads and
 * writes are timed apart: storage often writes into a cache at once
 * and reads slowly.
 */
static bool
worth_helpers (const struct op *o)
{
  uint64_t ns = __atomic_load_n (&o->io->split->piece_ns[o->write],
                                 __ATOMIC_RELAXED);

  return ns == 0 || ns >= PLUGIN_SLOW_NS;
}

/* Since nbdkit 1.42 the last error a request's own thread raised goes
 * to the client with the failure, and errors are per thread: what the
 * plugin said on a helper thread would be lost.  The requester says
 * which piece failed and how (the plugin's own words are in the log).
 */
static void
report_helper_error (const struct shared_walk *sw)
{
#if NBDKIT_VERSION_MAJOR > 1 || NBDKIT_VERSION_MINOR >= 42
  if (sw->failed_on_helper)
    nbdkit_error ("reshape: the plugin failed a piece of this request "
                  "(%" PRIu32 " bytes at %" PRIu64 "): %s",
                  sw->failed.count, sw->failed.offset, strerror (sw->err));
#endif
}

/* Walk [offset, offset+count) and run fn on every piece, in parallel
 * when allowed.  A failed piece fails the request (no new pieces are
 * started); this returns only when every piece started has finished.
 */
static int
run_pieces (const struct op *o, uint64_t offset, uint64_t count,
            uint32_t step, piece_fn fn, int *err)
{
  struct shared_walk sw = { .lock = PTHREAD_MUTEX_INITIALIZER,
                            .o = o, .fn = fn,
                            .requester = pthread_self () };
  unsigned helpers;

  walk_init (&sw.w, o->io->geo, offset, count, step, o->cap);
  helpers = sw.w.step < count && worth_helpers (o) ?
    helpers_for (count, sw.w.step) : 0;
  if (helpers) {
    stats_add (o->write ? C_PARALLEL_WRITES : C_PARALLEL_READS, 1);
    helpers_share (work_on, &sw, helpers);
  }
  else
    work_on (&sw);
  pthread_mutex_destroy (&sw.lock);
  if (sw.n > 1) {
    /* The mean piece time; never 0, which means "not timed yet". */
    const uint64_t mean = MAX (sw.busy_ns / sw.n, 1);

    stats_add (C_SPLITS, 1);
    __atomic_store_n (&o->io->split->piece_ns[o->write], mean,
                      __ATOMIC_RELAXED);
  }
  if (sw.err) {
    report_helper_error (&sw);
    *err = sw.err;
    return -1;
  }
  return 0;
}

/* FUA goes on every piece when the plugin does it natively.  Else the
 * pieces go without it and one flush follows once all succeeded,
 * instead of the flush per piece nbdkit would emulate.  (A plugin may
 * emulate FUA with a flush it does not advertise; then only nbdkit
 * may call that flush, so the flag goes on every piece.)
 */
static uint32_t
fua_policy (nbdkit_next *next, uint32_t flags, bool *flush_after)
{
  *flush_after = false;
  if ((flags & NBDKIT_FLAG_FUA) &&
      next->can_fua (next) != NBDKIT_FUA_NATIVE &&
      next->can_flush (next) == 1) {
    *flush_after = true;
    flags &= ~NBDKIT_FLAG_FUA;
  }
  return flags;
}

static int
flush_for_fua (nbdkit_next *next, int *err)
{
  stats_add (C_FUA_FLUSHES, 1);
  return split_flush (next, 0, err);
}

int
split_flush (nbdkit_next *next, uint32_t flags, int *err)
{
  stats_plugin (OP_FLUSH, 0);
  return next->flush (next, flags, err);
}

/* A write-like request: walk with locks, then the FUA flush. */
static int
run_write (struct op *o, uint32_t count, uint32_t step, piece_fn fn,
           int *err)
{
  bool flush_after;
  int r;

  o->write = true;
  o->flags = fua_policy (o->io->next, o->flags, &flush_after);
  r = run_pieces (o, o->offset, count, step, fn, err);
  if (r == 0 && flush_after)
    r = flush_for_fua (o->io->next, err);
  return r;
}

static int
pread_piece (const struct op *o, const struct piece *p, int *err)
{
  char *dst = o->rbuf + (p->offset - o->offset);

  if (p->partial)
    return rmw_read (o->io, p, dst, err);
  stats_plugin (OP_PREAD, p->count);
  return o->io->next->pread (o->io->next, dst, p->count, p->offset, 0, err);
}

/* Where a read or write of count bytes is cut: at reshape-size, or
 * (reshape-size=auto) where auto.c finds it pays, which may be not at
 * all.  data_done must follow.
 */
static uint32_t
data_step (struct op *o, uint64_t count)
{
  uint64_t step;

  if (o->io->autoexp == NULL)
    return o->io->geo->size;
  o->timed = true;
  step = auto_cut_begin (o->io->autoexp, o->write ? AUTO_WRITE : AUTO_READ,
                         count, o->io->geo->max,
                         reshape_cfg.parallel_ok ? reshape_cfg.parallel : 1,
                         o->own);
  return step < count ? step : UINT32_MAX;    /* whole: up to the max */
}

static int
data_done (const struct op *o, uint64_t count, int r)
{
  if (o->timed)
    auto_cut_end (o->io->autoexp, count);
  return r;
}

int
split_pread (const struct io *io, void *buf, uint32_t count,
             uint64_t offset, int *err)
{
  return split_pread_as (io, buf, count, offset, false, err);
}

int
split_pread_as (const struct io *io, void *buf, uint32_t count,
                uint64_t offset, bool own, int *err)
{
  struct op o = { .io = io, .offset = offset, .rbuf = buf, .own = own,
                  .cap = io->geo->max };
  uint32_t step = data_step (&o, count);

  return data_done (&o, count, run_pieces (&o, offset, count, step,
                                           pread_piece, err));
}

static int
pwrite_piece (const struct op *o, const struct piece *p, int *err)
{
  const char *src = o->wbuf + (p->offset - o->offset);

  if (p->partial)
    return rmw_write (o->io, p, src, o->flags, err);
  stats_plugin (OP_PWRITE, p->count);
  return o->io->next->pwrite (o->io->next, src, p->count, p->offset,
                              o->flags, err);
}

int
split_pwrite (const struct io *io, const void *buf, uint32_t count,
              uint64_t offset, uint32_t flags, int *err)
{
  struct op o = { .io = io, .offset = offset, .wbuf = buf, .flags = flags,
                  .cap = io->geo->max, .write = true };
  uint32_t step = data_step (&o, count);

  return data_done (&o, count,
                    run_write (&o, count, step, pwrite_piece, err));
}

/* Partial blocks of a zero are written as zeros; MAY_TRIM and
 * FAST_ZERO mean nothing to a pwrite, only FUA is kept.
 */
static int
zero_piece (const struct op *o, const struct piece *p, int *err)
{
  if (p->partial)
    return rmw_write (o->io, p, NULL, o->flags & NBDKIT_FLAG_FUA, err);
  stats_plugin (OP_ZERO, p->count);
  return o->io->next->zero (o->io->next, p->count, p->offset, o->flags,
                            err);
}

int
split_zero (const struct io *io, uint32_t count, uint64_t offset,
            uint32_t flags, int *err)
{
  struct op o = { .io = io, .offset = offset, .flags = flags,
                  .cap = io->geo->maxlen };

  /* A fast zero must not fall back to writing: partial blocks would. */
  if ((flags & NBDKIT_FLAG_FAST_ZERO) &&
      !walk_is_aligned (io->geo, offset, count)) {
    *err = ENOTSUP;
    return -1;
  }
  /* Zero carries no data: cut only where reshape-maxlen demands. */
  return run_write (&o, count, UINT32_MAX, zero_piece, err);
}

/* Trim is advisory; partial blocks are simply left as they are. */
static int
trim_piece (const struct op *o, const struct piece *p, int *err)
{
  if (p->partial)
    return 0;
  stats_plugin (OP_TRIM, p->count);
  return o->io->next->trim (o->io->next, p->count, p->offset, o->flags,
                            err);
}

int
split_trim (const struct io *io, uint32_t count, uint64_t offset,
            uint32_t flags, int *err)
{
  struct op o = { .io = io, .offset = offset, .flags = flags,
                  .cap = io->geo->maxlen };

  return run_write (&o, count, UINT32_MAX, trim_piece, err);
}

static int
cache_piece (const struct op *o, const struct piece *p, int *err)
{
  stats_plugin (OP_CACHE, p->count);
  return o->io->next->cache (o->io->next, p->count, p->offset, o->flags,
                             err);
}

/* Cache is a hint: widen it to whole blocks, and send only the first
 * piece of at most reshape-maxlen (a 4G hint must not become thousands
 * of plugin calls).
 */
int
split_cache (const struct io *io, uint32_t count, uint64_t offset,
             uint32_t flags, int *err)
{
  struct op o = { .io = io, .offset = offset, .flags = flags };
  struct walk w;
  struct piece p;
  uint64_t start, end;

  walk_round_out (io->geo, offset, count, &start, &end);
  walk_init (&w, io->geo, start, end - start, UINT32_MAX, io->geo->maxlen);
  if (!walk_next (&w, &p))      /* a non-empty range has a piece */
    abort ();
  return cache_piece (&o, &p, err);
}

/* Extents may answer for a prefix of the range.  The plugin is asked
 * from the block holding offset, into a private list (its answer may
 * end before offset: REQ_ONE, or a short first extent), again from
 * where it stopped until offset is covered; then what lies at or past
 * offset is handed on.  Each call is at most reshape-maxlen.
 */
static int
query_extents (const struct io *io, uint64_t start, uint64_t end,
               uint64_t offset, uint32_t flags,
               struct nbdkit_extents *mine, int *err)
{
  uint64_t pos = start;

  while (pos <= offset && pos < end) {
    struct walk w;
    struct piece p;
    size_t n;
    struct nbdkit_extent last;
    int r;

    walk_init (&w, io->geo, pos, end - pos, UINT32_MAX, io->geo->maxlen);
    if (!walk_next (&w, &p))    /* a non-empty range has a piece */
      abort ();
    stats_plugin (OP_EXTENTS, p.count);
    r = io->next->extents (io->next, p.count, p.offset, flags, mine, err);
    if (r == -1)
      return -1;
    n = nbdkit_extents_count (mine);
    if (n == 0)
      break;
    last = nbdkit_get_extent (mine, n - 1);
    if (last.offset + last.length <= pos)
      break;                      /* no progress: give up */
    pos = last.offset + last.length;
  }
  return 0;
}

int
split_extents (const struct io *io, uint32_t count, uint64_t offset,
               uint32_t flags, struct nbdkit_extents *extents, int *err)
{
  struct nbdkit_extents *mine;
  uint64_t start, end;
  size_t i;
  int r;

  walk_round_out (io->geo, offset, count, &start, &end);
  if (start == offset)          /* already aligned: the client's list */
    return query_extents (io, start, end, offset, flags, extents, err);
  mine = nbdkit_extents_new (start, end);
  if (mine == NULL) {
    *err = errno;
    return -1;
  }
  r = query_extents (io, start, end, offset, flags, mine, err);
  for (i = 0; r == 0 && i < nbdkit_extents_count (mine); i++) {
    struct nbdkit_extent e = nbdkit_get_extent (mine, i);
    if (e.offset + e.length <= offset)
      continue;                 /* nbdkit clips the one overlapping offset */
    if (nbdkit_add_extent (extents, e.offset, e.length, e.type) == -1) {
      *err = errno;
      r = -1;
    }
  }
  nbdkit_extents_free (mine);
  return r;
}
