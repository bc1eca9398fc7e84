/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Client requests become plugin requests here.  Each operation walks
 * its range (walk.c) and runs one small function per piece.  Data
 * pieces read into or write from slices of the client's buffer; only
 * partial blocks go through bounce buffers from the pool: read whole,
 * then copied out, or patched and written back whole
 * (read-modify-write).  With reshape-size=auto, data pieces are timed
 * for auto.c, in one batch per thread that worked on the request.
 *
 * Each piece of a write, zero or trim locks the blocks it covers while
 * it runs: exclusively for a read-modify-write, shared for whole
 * blocks.  Whole-block writers run in parallel, never inside another's
 * read-modify-write of the same block.  A piece holds one lock at a
 * time and takes it before its bounce buffer, so locks cannot deadlock
 * with each other or with the pool.  Reads take none: a
 * read-modify-write writes back the bytes it did not change as they
 * were, so a read sees old or new data, never torn data.
 */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <nbdkit-filter.h>

#include "auto.h"
#include "common.h"
#include "helpers.h"
#include "params.h"
#include "pool.h"
#include "split.h"
#include "stats.h"
#include "walk.h"

/* -D reshape.split=1: each piece; -D reshape.rmw=1: each
 * read-modify-write.
 */
NBDKIT_DLL_PUBLIC int reshape_debug_split;
NBDKIT_DLL_PUBLIC int reshape_debug_rmw;

/* --- Block-range locks. --- */

static struct {
  pthread_mutex_t lock;             /* the list, never I/O */
  pthread_cond_t changed;
  struct split_lock *head, *tail;   /* in arrival order */
} blocks = {
  .lock = PTHREAD_MUTEX_INITIALIZER, .changed = PTHREAD_COND_INITIALIZER,
};

static bool
blocks_wait (const struct split_lock *l)
{
  const struct split_lock *o;

  for (o = l->prev; o; o = o->prev)
    if ((o->exclusive || l->exclusive) && o->lo < l->hi && l->lo < o->hi)
      return true;
  return false;
}

bool
split_lock_blocks (struct split_lock *l, uint64_t lo, uint64_t hi,
                   bool exclusive)
{
  bool waited = false;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&blocks.lock);

  *l = (struct split_lock) { .lo = lo, .hi = hi, .exclusive = exclusive,
                             .prev = blocks.tail };
  *(blocks.tail ? &blocks.tail->next : &blocks.head) = l;
  blocks.tail = l;
  while (blocks_wait (l)) {
    waited = true;
    pthread_cond_wait (&blocks.changed, &blocks.lock);
  }
  return waited;
}

void
split_unlock_blocks (struct split_lock *l)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&blocks.lock);

  *(l->prev ? &l->prev->next : &blocks.head) = l->next;
  *(l->next ? &l->next->prev : &blocks.tail) = l->prev;
  pthread_cond_broadcast (&blocks.changed);
}

/* --- Pieces. --- */

/* One request being cut into pieces. */
struct op {
  const struct io *io;
  uint64_t offset;              /* where the client request starts */
  char *rbuf;                   /* pread */
  const char *wbuf;             /* pwrite */
  uint32_t flags;               /* for each piece */
  uint32_t cap;                 /* maxdata or maxlen */
  bool write;                   /* pieces take block-range locks */
  bool timed;                   /* data pieces: told to auto.c */
  bool own;                     /* the filter's own read */
  int (*piece) (const struct op *o, const struct piece *p, int *err);
};

/* Read the whole block of partial piece p into a bounce buffer. */
static char *
read_block (const struct io *io, const struct piece *p, int *err)
{
  char *blk = pool_get (POOL_BOUNCE, p->blk_count);

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

/* Patch p's part of its block with src (NULL: zeros) and write the
 * block back, under its exclusive lock.
 */
static int
rmw_write (const struct op *o, const struct piece *p, const void *src,
           uint32_t flags, int *err)
{
  char *blk = read_block (o->io, p, err);
  int r;

  if (blk == NULL)
    return -1;
  stats_add (C_PAD_BYTES, p->blk_count);
  if (src)
    memcpy (blk + (p->offset - p->blk_offset), src, p->count);
  else
    memset (blk + (p->offset - p->blk_offset), 0, p->count);
  if (reshape_debug_rmw)
    nbdkit_debug ("reshape: rmw block %" PRIu64 "+%" PRIu32
                  " for %" PRIu64 "+%" PRIu32,
                  p->blk_offset, p->blk_count, p->offset, p->count);
  stats_plugin (OP_PWRITE, p->blk_count);
  r = o->io->next->pwrite (o->io->next, blk, p->blk_count, p->blk_offset,
                           flags, err);
  pool_put (POOL_BOUNCE, blk, p->blk_count);
  if (r == 0)
    stats_add (C_RMW_WRITES, 1);
  return r;
}

static int
piece_run (const struct op *o, const struct piece *p, int *err)
{
  struct split_lock l;
  int r;

  if (!o->write || o->io->geo->min == 1)   /* no partial blocks ever */
    return o->piece (o, p, err);
  if (split_lock_blocks (&l, p->blk_offset, p->blk_offset + p->blk_count,
                         p->partial))
    stats_add (C_LOCK_WAITS, 1);
  r = o->piece (o, p, err);
  split_unlock_blocks (&l);
  return r;
}

/* The pieces of one request, taken by the requesting thread and any
 * helpers without a lock: a thread claims the next piece by moving pos
 * on with a compare-and-swap, and times its pieces in a batch of its
 * own.
 */
struct pieces {
  const struct op *o;
  struct walk w;                /* its pos is where the walk began */
  uint64_t pos;                 /* what is left starts here (atomic) */
  unsigned n;                   /* pieces handed out (atomic) */
  uint64_t busy_ns;             /* time in pieces, all threads (atomic) */
  int err;                      /* the first error, 0 if none (atomic) */
  struct piece failed;          /* its piece, written by who set err */
  bool failed_on_helper;
  pthread_t requester;
};

static bool
pieces_take (struct pieces *ps, struct piece *p)
{
  struct walk w = ps->w;
  uint64_t pos = __atomic_load_n (&ps->pos, __ATOMIC_ACQUIRE);

  do {
    w.pos = pos;
    if (__atomic_load_n (&ps->err, __ATOMIC_ACQUIRE) || !walk_next (&w, p))
      return false;
  } while (!__atomic_compare_exchange_n (&ps->pos, &pos, w.pos, false,
                                         __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
  return true;
}

static void
pieces_work (void *opaque)
{
  struct pieces *ps = opaque;
  struct auto_batch batch = { .n = 0 };
  struct piece p;
  uint64_t start, ns;
  unsigned n;
  int r, err, none;

  while (pieces_take (ps, &p)) {
    n = __atomic_fetch_add (&ps->n, 1, __ATOMIC_RELAXED);
    if (reshape_debug_split)
      nbdkit_debug ("reshape: piece %u: %" PRIu64 "+%" PRIu32 "%s",
                    n, p.offset, p.count, p.partial ? " (partial)" : "");
    start = now_ns ();
    err = 0;                    /* nbdkit 1.42 sets only an error of 0 */
    r = piece_run (ps->o, &p, &err);
    ns = now_ns () - start;
    __atomic_add_fetch (&ps->busy_ns, ns, __ATOMIC_RELAXED);
    none = 0;
    if (r == -1 &&
        __atomic_compare_exchange_n (&ps->err, &none, err, false,
                                     __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
      ps->failed = p;
      ps->failed_on_helper = !pthread_equal (pthread_self (), ps->requester);
    }
    else if (r == 0 && ps->o->timed && !p.partial)
      auto_batch_add (&batch, p.count, ns);
  }
  if (ps->o->timed)
    auto_time (ps->o->io->autoexp, ps->o->write ? AUTO_WRITE : AUTO_READ,
               &batch);
}

/* How many helpers a request deserves: one per piece beyond the
 * requester's own, at most reshape-parallel - 1, none when the plugin
 * is not fully parallel, and none when the connection's last split
 * request's pieces took under PLUGIN_SLOW_NS each (memory, the page
 * cache: waking helpers would cost more than it saves; reads and
 * writes apart, as storage often writes into a cache and reads slowly).
 */
static unsigned
helpers_for (const struct op *o, uint64_t count, uint32_t step)
{
  const uint64_t ns = __atomic_load_n (&o->io->split->piece_ns[o->write],
                                       __ATOMIC_RELAXED);

  if (step >= count || !reshape_cfg.parallel_ok ||
      reshape_cfg.parallel <= 1 || (ns && ns < PLUGIN_SLOW_NS))
    return 0;
  return MIN (count / step + 1, reshape_cfg.parallel - 1);
}

/* Run o's pieces of [offset, offset+count), cut at multiples of step,
 * in parallel when allowed.  A failed piece fails the request (no new
 * pieces start); this returns once every piece started has finished.
 */
static int
pieces_run (const struct op *o, uint64_t count, uint32_t step, int *err)
{
  struct pieces ps = { .o = o, .requester = pthread_self () };
  unsigned helpers;

  walk_init (&ps.w, o->io->geo, o->offset, count, step, o->cap);
  ps.pos = ps.w.pos;
  helpers = helpers_for (o, count, ps.w.step);
  if (helpers) {
    stats_add (o->write ? C_PARALLEL_WRITES : C_PARALLEL_READS, 1);
    helpers_share (pieces_work, &ps, helpers);
  }
  else
    pieces_work (&ps);
  if (ps.n > 1) {
    stats_add (C_SPLITS, 1);
    __atomic_store_n (&o->io->split->piece_ns[o->write],
                      MAX (ps.busy_ns / ps.n, 1), __ATOMIC_RELAXED);
  }
  if (ps.err == 0)
    return 0;
#if NBDKIT_VERSION_MAJOR > 1 || NBDKIT_VERSION_MINOR >= 42
  /* Since nbdkit 1.42 errors are per thread, and the client gets the
   * last one its request's own thread raised: say which piece failed.
   */
  if (ps.failed_on_helper)
    nbdkit_error ("reshape: the plugin failed a piece of this request "
                  "(%" PRIu32 " bytes at %" PRIu64 "): %s",
                  ps.failed.count, ps.failed.offset, strerror (ps.err));
#endif
  *err = ps.err;
  return -1;
}

int
split_flush (nbdkit_next *next, uint32_t flags, int *err)
{
  stats_plugin (OP_FLUSH, 0);
  return next->flush (next, flags, err);
}

/* A write-like request.  FUA goes on every piece when the plugin does
 * it natively; else the pieces go without it and one flush follows
 * (a plugin that emulates FUA with a flush it does not advertise gets
 * the flag on every piece: only nbdkit may call that flush).
 */
static int
write_run (struct op *o, uint32_t count, uint32_t step, int *err)
{
  nbdkit_next *next = o->io->next;
  const bool flush_after = (o->flags & NBDKIT_FLAG_FUA) &&
    next->can_fua (next) != NBDKIT_FUA_NATIVE && next->can_flush (next) == 1;

  o->write = true;
  if (flush_after)
    o->flags &= ~NBDKIT_FLAG_FUA;
  if (pieces_run (o, count, step, err) == -1)
    return -1;
  if (!flush_after)
    return 0;
  stats_add (C_FUA_FLUSHES, 1);
  return split_flush (next, 0, err);
}

/* Where a read or write of count bytes is cut: at reshape-size, or
 * where auto.c finds it pays (UINT32_MAX: whole, up to the cap).
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
  return step < count ? step : UINT32_MAX;
}

static int
pread_piece (const struct op *o, const struct piece *p, int *err)
{
  char *dst = o->rbuf + (p->offset - o->offset);
  char *blk;

  if (!p->partial) {
    stats_plugin (OP_PREAD, p->count);
    return o->io->next->pread (o->io->next, dst, p->count, p->offset, 0,
                               err);
  }
  if ((blk = read_block (o->io, p, err)) == NULL)
    return -1;
  memcpy (dst, blk + (p->offset - p->blk_offset), p->count);
  pool_put (POOL_BOUNCE, blk, p->blk_count);
  stats_add (C_RMW_READS, 1);
  stats_add (C_PAD_BYTES, p->blk_count - p->count);
  return 0;
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
                  .cap = io->geo->max, .piece = pread_piece };
  const int r = pieces_run (&o, count, data_step (&o, count), err);

  if (o.timed)
    auto_cut_end (io->autoexp, count);
  return r;
}

static int
pwrite_piece (const struct op *o, const struct piece *p, int *err)
{
  const char *src = o->wbuf + (p->offset - o->offset);

  if (p->partial)
    return rmw_write (o, p, src, o->flags, err);
  stats_plugin (OP_PWRITE, p->count);
  return o->io->next->pwrite (o->io->next, src, p->count, p->offset,
                              o->flags, err);
}

int
split_pwrite (const struct io *io, const void *buf, uint32_t count,
              uint64_t offset, uint32_t flags, int *err)
{
  struct op o = { .io = io, .offset = offset, .wbuf = buf, .flags = flags,
                  .cap = io->geo->max, .write = true,
                  .piece = pwrite_piece };
  const int r = write_run (&o, count, data_step (&o, count), err);

  if (o.timed)
    auto_cut_end (io->autoexp, count);
  return r;
}

/* Partial blocks of a zero are written as zeros (only FUA means
 * anything to a write).
 */
static int
zero_piece (const struct op *o, const struct piece *p, int *err)
{
  if (p->partial)
    return rmw_write (o, p, NULL, o->flags & NBDKIT_FLAG_FUA, err);
  stats_plugin (OP_ZERO, p->count);
  return o->io->next->zero (o->io->next, p->count, p->offset, o->flags,
                            err);
}

/* Zero carries no data: cut only where reshape-maxlen demands. */
int
split_zero (const struct io *io, uint32_t count, uint64_t offset,
            uint32_t flags, int *err)
{
  struct op o = { .io = io, .offset = offset, .flags = flags,
                  .cap = io->geo->maxlen, .piece = zero_piece };

  /* A fast zero must not fall back to writing: partial blocks would. */
  if ((flags & NBDKIT_FLAG_FAST_ZERO) &&
      !walk_is_aligned (io->geo, offset, count)) {
    *err = ENOTSUP;
    return -1;
  }
  return write_run (&o, count, UINT32_MAX, err);
}

/* Trim is advisory: partial blocks are left as they are. */
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
                  .cap = io->geo->maxlen, .piece = trim_piece };

  return write_run (&o, count, UINT32_MAX, err);
}

/* The first piece of [start, end) of at most reshape-maxlen: a hint
 * (cache) or a query (extents) must not become thousands of calls.
 */
static struct piece
first_piece (const struct io *io, uint64_t start, uint64_t end)
{
  struct walk w;
  struct piece p;

  walk_init (&w, io->geo, start, end - start, UINT32_MAX, io->geo->maxlen);
  if (!walk_next (&w, &p))      /* a non-empty range has a piece */
    abort ();
  return p;
}

/* Cache is a hint: widened to whole blocks, its first piece sent. */
int
split_cache (const struct io *io, uint32_t count, uint64_t offset,
             uint32_t flags, int *err)
{
  uint64_t start, end;
  struct piece p;

  walk_round_out (io->geo, offset, count, &start, &end);
  p = first_piece (io, start, end);
  stats_plugin (OP_CACHE, p.count);
  return io->next->cache (io->next, p.count, p.offset, flags, err);
}

/* Extents may answer for a prefix.  The plugin is asked from the block
 * holding offset (its answer may end before offset: REQ_ONE, a short
 * first extent), again from where it stopped until offset is covered.
 */
static int
query_extents (const struct io *io, uint64_t start, uint64_t end,
               uint64_t offset, uint32_t flags, struct nbdkit_extents *mine,
               int *err)
{
  uint64_t pos = start;

  while (pos <= offset && pos < end) {
    const struct piece p = first_piece (io, pos, end);
    struct nbdkit_extent last;
    size_t n;

    stats_plugin (OP_EXTENTS, p.count);
    if (io->next->extents (io->next, p.count, p.offset, flags, mine,
                           err) == -1)
      return -1;
    if ((n = nbdkit_extents_count (mine)) == 0)
      break;
    last = nbdkit_get_extent (mine, n - 1);
    if (last.offset + last.length <= pos)
      break;                    /* no progress: give up */
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
  if (start == offset)          /* aligned: the client's list */
    return query_extents (io, start, end, offset, flags, extents, err);
  if ((mine = nbdkit_extents_new (start, end)) == NULL) {
    *err = errno;
    return -1;
  }
  /* Then what lies at or past offset is handed on (nbdkit clips the
   * extent overlapping it).
   */
  r = query_extents (io, start, end, offset, flags, mine, err);
  for (i = 0; r == 0 && i < nbdkit_extents_count (mine); i++) {
    const struct nbdkit_extent e = nbdkit_get_extent (mine, i);
    if (e.offset + e.length > offset &&
        nbdkit_add_extent (extents, e.offset, e.length, e.type) == -1) {
      *err = errno;
      r = -1;
    }
  }
  nbdkit_extents_free (mine);
  return r;
}
