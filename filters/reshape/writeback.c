/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Write-back combining (reshape-writeback=true): a volatile write
 * cache.  Small writes are copied into staging blocks of reshape-size
 * and acknowledged once staged; a block goes to the plugin as one
 * request when it is complete, and before anything could miss it:
 *
 *   - a read, zero, trim or extents request overlapping it, a FUA or
 *     large write overlapping it (written through after), a write to
 *     the same block that would leave too many gaps;
 *   - flush (then the plugin's flush), connection close (finalize),
 *     and when staging reaches its share of the pool (eviction).
 *
 * A block leaves staging only once the plugin has it.  A write-back
 * that fails keeps the block staged and is tried again at the next of
 * the occasions above; meanwhile reads overlapping it get its bytes
 * laid over what the plugin returns, so acknowledged data stays
 * readable.  A flush succeeds only when every block staged before it
 * is in the plugin, and fails with the plugin's error while one is
 * not.  When failed blocks fill the staging share, new writes go
 * through to the plugin (their writers get their own errors).  Only
 * when the last connection that can see a block closes, after
 * retries, is it given up, with an error naming the bytes lost.
 *
 * Who may touch a block: a thread claims it (busy) to write it back,
 * to lay it over a read or to patch it around a write sent through;
 * others wait.  A request claims all the blocks it needs at once, and
 * never waits for a claim while holding one, so claims cannot
 * deadlock.
 *
 * All write-back runs inline, in the request that needs it, so it
 * works with plugins that serialize requests (no background thread
 * may call them).  Only at connection close does a short-lived thread
 * do it: nbdkit aborts sleeps of a closing connection's own threads,
 * which would fail the write-back in layers that sleep (delay filter).
 *
 * Blocks are kept per export, and shared by its connections only when
 * the plugin allows multi-conn; otherwise per connection, so that each
 * connection's flush covers exactly what it wrote.
 */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <nbdkit-filter.h>

#include "common.h"
#include "reshape.h"

/* Staged bytes of a block: sorted, disjoint, not touching.  Requests
 * reach the filter slightly out of order, so a block fills up with a
 * few gaps on the way; more than MAX_RANGES and it is written back.
 */
#define MAX_RANGES 16

/* Tries per block when a connection closes, before giving it up. */
#define CLOSE_TRIES 8

struct range {
  uint32_t lo, hi;
};

struct wb_block {
  struct reshape_handle *owner; /* NULL: shared by the export */
  uint64_t seq;                 /* when it was created */
  uint64_t off;                 /* aligned to reshape-size */
  uint32_t len;                 /* block length, clipped at export end */
  unsigned nr;                  /* staged ranges */
  struct range r[MAX_RANGES];
  char *buf;
  bool busy;                    /* claimed by a thread */
  int failed;                   /* error of its last write-back, or 0 */
  uint64_t tried;               /* the last flush that tried it */
  struct wb_block *next;        /* the export's list */
  struct wb_block *claimed;     /* its claimer's list */
};

/* Add [lo, hi) to the ranges of b, merging what touches it.  False if
 * that needs more ranges than a block keeps.
 */
static bool
add_range (struct wb_block *b, uint32_t lo, uint32_t hi)
{
  struct range out[MAX_RANGES + 1];
  unsigned i, n = 0;
  bool placed = false;

  for (i = 0; i < b->nr; i++) {
    struct range x = b->r[i];
    if (x.hi < lo || hi < x.lo) {         /* apart: keep in order */
      if (!placed && hi < x.lo) {
        out[n++] = (struct range) { lo, hi };
        placed = true;
      }
      out[n++] = x;
    }
    else {                                /* touching: absorb */
      if (x.lo < lo) lo = x.lo;
      if (x.hi > hi) hi = x.hi;
    }
    if (n > MAX_RANGES)
      return false;
  }
  if (!placed)
    out[n++] = (struct range) { lo, hi };
  if (n > MAX_RANGES)
    return false;
  memcpy (b->r, out, n * sizeof out[0]);
  b->nr = n;
  return true;
}

/* The first and last staged byte, for overlap tests. */
static uint64_t first_byte (const struct wb_block *b) { return b->off + b->r[0].lo; }
static uint64_t end_byte (const struct wb_block *b) { return b->off + b->r[b->nr - 1].hi; }

static bool
overlaps (const struct wb_block *b, uint64_t lo, uint64_t hi)
{
  return first_byte (b) < hi && lo < end_byte (b);
}

/* Shared by all exports. */
static struct {
  uint64_t staged_bytes;        /* atomic: the fast path's test */
  uint64_t next_seq;            /* block creation order, atomic */
  uint64_t next_ticket;         /* flush tickets, atomic */
} all;

void
reshape_writeback_init (struct writeback *wb)
{
  pthread_mutex_init (&wb->lock, NULL);
  pthread_cond_init (&wb->changed, NULL);
  wb->blocks = NULL;
  wb->conns = 0;
}

static void give_up (struct wb_block *b);

void
reshape_writeback_destroy (struct writeback *wb)
{
  /* Every connection finalized gave up what it could not write; a
   * connection that never got that far leaves its blocks here.
   */
  while (wb->blocks) {
    struct wb_block *b = wb->blocks;
    wb->blocks = b->next;
    give_up (b);
  }
  pthread_cond_destroy (&wb->changed);
  pthread_mutex_destroy (&wb->lock);
}

static bool
enabled (void)
{
  return reshape_cfg.writeback &&
    __atomic_load_n (&all.staged_bytes, __ATOMIC_RELAXED) > 0;
}

static struct reshape_handle *
owner_of (struct reshape_handle *h)
{
  return h->multi_conn ? NULL : h;
}

static bool
visible (const struct wb_block *b, struct reshape_handle *h)
{
  return b->owner == NULL || b->owner == h;
}

static void
free_block (struct wb_block *b)
{
  __atomic_sub_fetch (&all.staged_bytes, b->len, __ATOMIC_RELAXED);
  pool_put (POOL_STAGING, b->buf, b->len);
  free (b);
}

/* Data that can never reach the plugin: say which bytes. */
static void
give_up (struct wb_block *b)
{
  unsigned i;

  for (i = 0; i < b->nr; i++)
    nbdkit_error ("reshape: write-back: %" PRIu32 " acknowledged bytes at "
                  "%" PRIu64 " lost: the plugin kept failing (%s)",
                  b->r[i].hi - b->r[i].lo, b->off + b->r[i].lo,
                  strerror (b->failed ? b->failed : EIO));
  free_block (b);
}

/* Claim every block visible to h that overlaps [lo, hi), once none of
 * them is busy (so nothing is held while waiting).
 */
static void
claim_range (struct writeback_claim *c, struct reshape_handle *h,
             uint64_t lo, uint64_t hi)
{
  struct writeback *wb = &h->exp->wb;
  struct wb_block *b;
  SCOPED_LOCK (&wb->lock);

  c->wb = wb;
  c->list = NULL;
 again:
  for (b = wb->blocks; b; b = b->next)
    if (visible (b, h) && overlaps (b, lo, hi) && b->busy) {
      pthread_cond_wait (&wb->changed, &wb->lock);
      goto again;
    }
  for (b = wb->blocks; b; b = b->next)
    if (visible (b, h) && overlaps (b, lo, hi)) {
      b->busy = true;
      b->claimed = c->list;
      c->list = b;
    }
}

/* Let the claimed blocks go. */
static void
release (struct writeback_claim *c)
{
  struct wb_block *b;

  if (c->list == NULL)
    return;
  SCOPED_LOCK (&c->wb->lock);
  for (b = c->list; b; b = b->claimed)
    b->busy = false;
  c->list = NULL;
  pthread_cond_broadcast (&c->wb->changed);
}

/* Write claimed block b to the plugin.  On success it leaves staging
 * (unlinked and freed); on failure it stays, still claimed, with the
 * error noted.  Returns 0 or the error.
 */
static int
write_back (nbdkit_next *next, struct reshape_handle *h,
            struct writeback *wb, struct wb_block *b)
{
  const uint64_t lo = first_byte (b), hi = end_byte (b);
  int err = 0, r = 0;
  unsigned i;

  for (i = 0; i < b->nr; i++) {
    const struct range x = b->r[i];
    if (reshape_split_pwrite (next, h, b->buf + x.lo, x.hi - x.lo,
                              b->off + x.lo, 0, &err) == -1) {
      nbdkit_error ("reshape: deferred write of %" PRIu32 " bytes at %"
                    PRIu64 " failed: %s; kept staged, tried again later",
                    x.hi - x.lo, b->off + x.lo, strerror (err));
      r = err;
    }
  }
  if (r) {
    b->failed = r;
    return r;
  }
  for (i = 0; i < b->nr; i++)
    reshape_stats_add (C_WB_WRITTEN, b->r[i].hi - b->r[i].lo);
  /* Whatever a reader cached meanwhile is older than this. */
  reshape_export_invalidate (lo, hi);
  {
    struct wb_block **pp;
    SCOPED_LOCK (&wb->lock);

    for (pp = &wb->blocks; *pp != b; pp = &(*pp)->next)
      ;
    *pp = b->next;
    pthread_cond_broadcast (&wb->changed);
  }
  free_block (b);
  return 0;
}

/* Write back every claimed block; the ones that fail stay claimed.
 * Returns 0 or the first error.
 */
static int
settle (nbdkit_next *next, struct reshape_handle *h,
        struct writeback_claim *c)
{
  struct wb_block **pp = &c->list;
  int err = 0;

  while (*pp) {
    struct wb_block *b = *pp, *after = b->claimed;
    int e = write_back (next, h, c->wb, b);
    if (e == 0)
      *pp = after;                /* b is gone */
    else {
      if (!err)
        err = e;
      pp = &b->claimed;
    }
  }
  return err;
}

/* Lay the staged bytes of the claimed blocks over buf, which holds
 * [offset, offset+count) as read from the plugin.
 */
static void
overlay (const struct writeback_claim *c, char *buf, uint32_t count, uint64_t offset)
{
  const struct wb_block *b;
  unsigned i;

  for (b = c->list; b; b = b->claimed)
    for (i = 0; i < b->nr; i++) {
      uint64_t lo = max_u64 (b->off + b->r[i].lo, offset);
      uint64_t hi = min_u64 (b->off + b->r[i].hi, offset + count);
      if (lo < hi)
        memcpy (buf + (lo - offset), b->buf + (lo - b->off), hi - lo);
    }
}

/* A write went through to the plugin over [offset, offset+count):
 * the claimed blocks that are still staged take its bytes (src, or
 * zeros when src is NULL), so that their later write-back does not
 * undo it.
 */
static void
patch (const struct writeback_claim *c, const char *src, uint32_t count,
       uint64_t offset)
{
  const struct wb_block *b;

  for (b = c->list; b; b = b->claimed) {
    uint64_t lo = max_u64 (b->off, offset);
    uint64_t hi = min_u64 (b->off + b->len, offset + count);
    if (lo >= hi)
      continue;
    if (src)
      memcpy (b->buf + (lo - b->off), src + (lo - offset), hi - lo);
    else
      memset (b->buf + (lo - b->off), 0, hi - lo);
  }
}

void
reshape_writeback_begin (nbdkit_next *next, struct reshape_handle *h,
                         uint64_t lo, uint64_t hi,
                         struct writeback_claim *c)
{
  c->wb = &h->exp->wb;
  c->list = NULL;
  c->err = 0;
  if (!enabled ())
    return;
  claim_range (c, h, lo, hi);
  c->err = settle (next, h, c);
}

void
reshape_writeback_end_read (struct writeback_claim *c, void *buf,
                            uint32_t count, uint64_t offset, bool ok)
{
  if (ok)
    overlay (c, buf, count, offset);
  release (c);
}

void
reshape_writeback_end_write (struct writeback_claim *c, const void *src,
                             uint32_t count, uint64_t offset, bool ok)
{
  if (ok)
    patch (c, src, count, offset);
  release (c);
}

void
reshape_writeback_release (struct writeback_claim *c)
{
  release (c);
}

bool
reshape_writeback_clean (nbdkit_next *next, struct reshape_handle *h,
                         uint64_t lo, uint64_t hi)
{
  struct writeback *wb = &h->exp->wb;
  struct writeback_claim c = { .wb = wb, .list = NULL };
  struct wb_block *b;
  bool clean;

  if (!enabled ())
    return true;
  {
    SCOPED_LOCK (&wb->lock);

    /* Never wait: the caller may itself hold blocks in the range. */
    for (b = wb->blocks; b; b = b->next)
      if (visible (b, h) && overlaps (b, lo, hi) && b->busy)
        return false;
    for (b = wb->blocks; b; b = b->next)
      if (visible (b, h) && overlaps (b, lo, hi)) {
        b->busy = true;
        b->claimed = c.list;
        c.list = b;
      }
  }
  settle (next, h, &c);
  clean = c.list == NULL;
  release (&c);
  return clean;
}

/* Write back every block visible to h created before upto, trying
 * each once (ticket marks the ones tried), waiting for blocks others
 * hold.  Returns 0 or the first error.
 */
static int
drain (nbdkit_next *next, struct reshape_handle *h, uint64_t upto)
{
  struct writeback *wb = &h->exp->wb;
  const uint64_t ticket = __atomic_add_fetch (&all.next_ticket, 1,
                                              __ATOMIC_RELAXED);
  struct wb_block *b;
  int err = 0;

  pthread_mutex_lock (&wb->lock);       /* dropped around write-backs */
 again:
  for (b = wb->blocks; b; b = b->next) {
    struct writeback_claim c = { .wb = wb, .list = b };
    int e;

    if (!visible (b, h) || b->seq >= upto || b->tried == ticket)
      continue;
    if (b->busy) {
      pthread_cond_wait (&wb->changed, &wb->lock);
      goto again;
    }
    b->busy = true;
    b->tried = ticket;
    b->claimed = NULL;
    pthread_mutex_unlock (&wb->lock);
    e = settle (next, h, &c);
    if (e && !err)
      err = e;
    release (&c);
    pthread_mutex_lock (&wb->lock);
    goto again;
  }
  pthread_mutex_unlock (&wb->lock);
  return err;
}

int
reshape_writeback_flush (nbdkit_next *next, struct reshape_handle *h,
                         int *err)
{
  int e;

  if (!enabled ())
    return 0;
  e = drain (next, h, __atomic_load_n (&all.next_seq, __ATOMIC_RELAXED));
  if (e) {
    *err = e;
    return -1;
  }
  return 0;
}

void
reshape_writeback_open (struct reshape_handle *h)
{
  struct writeback *wb = &h->exp->wb;
  SCOPED_LOCK (&wb->lock);

  wb->conns++;
}

/* Write back the oldest block visible to h to make room; false if
 * nothing could be written back.
 */
static bool
evict_one (nbdkit_next *next, struct reshape_handle *h, struct writeback *wb)
{
  struct writeback_claim c = { .wb = wb, .list = NULL };
  struct wb_block *b;
  bool freed;

  {
    SCOPED_LOCK (&wb->lock);

    for (b = wb->blocks; b; b = b->next)
      if (!b->busy && visible (b, h))
        c.list = b;                     /* new blocks go in front */
    if (c.list == NULL)
      return false;
    c.list->busy = true;
    c.list->claimed = NULL;
  }
  freed = settle (next, h, &c) == 0;
  release (&c);
  return freed;
}

/* A new staging block for [lo, hi) of the block at boff, linked in
 * with the lock held; NULL if staging has no room.
 */
static struct wb_block *
new_block (struct reshape_handle *h, struct writeback *wb, uint64_t boff,
           uint32_t lo, uint32_t hi)
{
  const uint32_t len = min_u64 (boff + h->geo.size, h->geo.exportsize) - boff;
  char *mem = pool_get (POOL_STAGING, len);
  struct wb_block *b;

  if (mem == NULL)
    return NULL;
  b = malloc (sizeof *b);
  if (b == NULL) {
    pool_put (POOL_STAGING, mem, len);
    return NULL;
  }
  *b = (struct wb_block) {
    .owner = owner_of (h), .off = boff, .len = len,
    .seq = __atomic_fetch_add (&all.next_seq, 1, __ATOMIC_RELAXED),
    .nr = 1, .r = { { lo, hi } }, .buf = mem, .next = wb->blocks,
  };
  wb->blocks = b;
  __atomic_add_fetch (&all.staged_bytes, len, __ATOMIC_RELAXED);
  return b;
}

/* Stage [offset, offset+count), all within one block.  Returns true
 * if staged, false if it must be written through instead.
 */
static bool
stage (nbdkit_next *next, struct reshape_handle *h, const char *buf,
       uint32_t count, uint64_t offset)
{
  struct writeback *wb = &h->exp->wb;
  const uint64_t boff = offset - offset % h->geo.size;
  const uint32_t lo = offset - boff, hi = lo + count;
  struct writeback_claim c = { .wb = wb, .list = NULL };
  bool evicted = false;
  struct wb_block *b;

  pthread_mutex_lock (&wb->lock);       /* dropped to write back */
 again:
  for (b = wb->blocks; b; b = b->next)
    if (b->off == boff && visible (b, h))
      break;
  if (b && b->busy) {
    pthread_cond_wait (&wb->changed, &wb->lock);
    goto again;
  }
  if (b && !add_range (b, lo, hi)) {
    /* Too many gaps: send what is staged, start afresh. */
    b->busy = true;
    b->claimed = NULL;
    c.list = b;
    pthread_mutex_unlock (&wb->lock);
    if (settle (next, h, &c)) {
      release (&c);
      return false;               /* it stays: this write goes through */
    }
    pthread_mutex_lock (&wb->lock);
    goto again;
  }
  if (b == NULL && (b = new_block (h, wb, boff, lo, hi)) == NULL) {
    /* Staging is full: make room once, else write through. */
    pthread_mutex_unlock (&wb->lock);
    if (evicted || !evict_one (next, h, wb))
      return false;
    evicted = true;
    pthread_mutex_lock (&wb->lock);
    goto again;
  }
  memcpy (b->buf + lo, buf, count);
  reshape_stats_add (C_WB_STAGED, count);
  if (b->nr == 1 && b->r[0].lo == 0 && b->r[0].hi == b->len) {
    /* Complete: send it now.  If that fails it stays staged, and the
     * write is acknowledged all the same: its data is kept.
     */
    b->busy = true;
    b->claimed = NULL;
    c.list = b;
    pthread_mutex_unlock (&wb->lock);
    settle (next, h, &c);
    release (&c);
    return true;
  }
  pthread_mutex_unlock (&wb->lock);
  return true;
}

/* A write that is not staged goes to the plugin after the staged
 * blocks it overlaps, and is copied into those that stay staged.
 */
static int
through (nbdkit_next *next, struct reshape_handle *h, const void *buf,
         uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  struct writeback_claim c;
  int r;

  reshape_writeback_begin (next, h, offset, offset + count, &c);
  r = reshape_merge_pwrite (next, h, buf, count, offset, flags, err);
  reshape_writeback_end_write (&c, buf, count, offset, r == 0);
  return r;
}

int
reshape_writeback_pwrite (nbdkit_next *next, struct reshape_handle *h,
                          const void *buf, uint32_t count, uint64_t offset,
                          uint32_t flags, int *err)
{
  const uint32_t size = h->geo.size;
  const char *p = buf;
  uint64_t pos = offset;

  if (!reshape_cfg.writeback || (flags & NBDKIT_FLAG_FUA) ||
      count >= size || pool_largest (POOL_STAGING) < size)
    return through (next, h, buf, count, offset, flags, err);
  while (pos < offset + count) {
    uint64_t block_end = pos - pos % size + size;
    uint32_t n = min_u64 (block_end, offset + count) - pos;

    if (!stage (next, h, p + (pos - offset), n, pos))
      /* What is left goes through, in order. */
      return through (next, h, p + (pos - offset), offset + count - pos,
                      pos, flags, err);
    pos += n;
  }
  return 0;
}

/* Connection closing: nothing it staged may be left behind.  The
 * write-back runs on a thread of its own, since nbdkit aborts sleeps
 * (delay filter, some plugins) made by a closing connection's threads.
 */
struct closing {
  nbdkit_next *next;
  struct reshape_handle *h;
};

static void *
drain_all (void *arg)
{
  struct closing *c = arg;
  unsigned i;

  for (i = 0; i < CLOSE_TRIES; i++)
    if (drain (c->next, c->h, UINT64_MAX) == 0)
      break;
  return NULL;
}

/* After the last tries: what this connection alone could see, or
 * what nobody else can see any more, is given up.
 */
static void
give_up_left (struct reshape_handle *h)
{
  struct writeback *wb = &h->exp->wb;
  struct wb_block **pp;
  SCOPED_LOCK (&wb->lock);

  wb->conns--;
  for (pp = &wb->blocks; *pp; ) {
    struct wb_block *b = *pp;
    if (b->owner == h || (b->owner == NULL && wb->conns == 0)) {
      *pp = b->next;
      give_up (b);
    }
    else
      pp = &b->next;
  }
}

void
reshape_writeback_finalize (nbdkit_next *next, struct reshape_handle *h)
{
  struct closing c = { .next = next, .h = h };
  pthread_t t;

  if (enabled ()) {
    if (pthread_create (&t, NULL, drain_all, &c) == 0)
      pthread_join (t, NULL);
    else
      drain_all (&c);
  }
  give_up_left (h);
}
