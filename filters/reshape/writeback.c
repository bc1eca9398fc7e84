/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * A volatile write cache.  Small writes are copied into staging pages
 * of the request size and acknowledged once staged; a page goes to the
 * plugin when complete, and before anything could miss it (an
 * overlapping request, a flush, a close, staging full).  It leaves
 * staging only once the plugin has it: reads get the bytes of a page
 * the plugin refuses laid over what it returns, and a flush fails
 * while it refuses one.  Pages are the export's (its name, plain or
 * TLS), and never outlive its last connection: that close retries for
 * CLOSE_RETRY_NS, then gives up what is left, in one error line.
 * docs/design.md, Write-back, has the reasons.
 *
 * A thread claims a page (busy) to write it back, to lay it over a
 * read or to patch it around a write sent through; others wait.  A
 * request claims all the pages it needs at once and never waits while
 * holding a claim, so claims cannot deadlock.  All write-back runs in
 * the request that needs it (a plugin that serializes requests allows
 * no background thread); at close it runs on a thread of its own,
 * since nbdkit aborts the sleeps of a closing connection's threads.
 *
 * Export names may share storage: a write first writes back what other
 * names staged over it, through an open connection of that name (with
 * none, the write fails: the staged data must neither go to the wrong
 * storage nor undo this write later).
 */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nbdkit-filter.h>

#include "common.h"
#include "pool.h"
#include "ranges.h"
#include "readahead.h"
#include "split.h"
#include "stats.h"
#include "tunables.h"
#include "writeback.h"

struct wb_page {
  uint64_t off;                 /* aligned to the request size */
  uint32_t len;                 /* clipped at the export's end */
  struct ranges staged;         /* its bytes staged */
  char *buf;
  bool busy;                    /* claimed */
  int failed;                   /* its last write-back's error, or 0 */
  struct wb_page *next;         /* the export's list, newest first */
  struct wb_page *claimed;      /* its claimer's list */
};

struct writeback {
  pthread_mutex_t lock;         /* the pages and all below */
  pthread_cond_t changed;       /* a page released or gone, a borrower */
  struct wb_page *pages;
  unsigned conns;               /* open connections */
  struct wb_conn *open;         /* ... that can write */
  bool failing;                 /* said: write-backs fail (atomic) */
  char *name;                   /* quoted, for messages */
  unsigned refs;                /* staging.lock */
  struct writeback *next;
};

static struct {
  uint64_t staged_bytes;        /* atomic: every request asks */
  pthread_mutex_t lock;         /* the list */
  struct writeback *list;
  unsigned exports;             /* atomic */
  bool may_borrow;              /* writeback_thread_model */
} staging = { .lock = PTHREAD_MUTEX_INITIALIZER };

static bool
anything_staged (void)
{
  return __atomic_load_n (&staging.staged_bytes, __ATOMIC_RELAXED) > 0;
}

static bool
page_overlaps (const struct wb_page *b, uint64_t lo, uint64_t hi)
{
  return b->off + ranges_first (&b->staged) < hi &&
    lo < b->off + ranges_end (&b->staged);
}

static void
free_page (struct wb_page *b)
{
  __atomic_sub_fetch (&staging.staged_bytes, b->len, __ATOMIC_RELAXED);
  pool_put (POOL_STAGING, b->buf, b->len);
  free (b);
}

struct writeback *
writeback_new (const char *name)
{
  struct writeback *wb = calloc (1, sizeof *wb);

  if (wb == NULL || (wb->name = stats_log_name (name)) == NULL) {
    free (wb);
    return NULL;
  }
  pthread_mutex_init (&wb->lock, NULL);
  pthread_cond_init (&wb->changed, NULL);
  wb->refs = 1;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&staging.lock);
  wb->next = staging.list;
  staging.list = wb;
  __atomic_add_fetch (&staging.exports, 1, __ATOMIC_RELAXED);
  return wb;
}

/* Drop a reference; the last unlinks and frees wb.  staging.lock held. */
static void
wb_put (struct writeback *wb)
{
  struct writeback **pp;

  if (--wb->refs > 0)
    return;
  for (pp = &staging.list; *pp != wb; pp = &(*pp)->next)
    ;
  *pp = wb->next;
  __atomic_sub_fetch (&staging.exports, 1, __ATOMIC_RELAXED);
  pthread_cond_destroy (&wb->changed);
  pthread_mutex_destroy (&wb->lock);
  free (wb->name);
  free (wb);
}

void
writeback_drop (struct writeback *wb)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&staging.lock);

  wb_put (wb);
}

void
writeback_thread_model (int model)
{
  staging.may_borrow = model == NBDKIT_THREAD_MODEL_PARALLEL ||
    model == NBDKIT_THREAD_MODEL_SERIALIZE_ALL_REQUESTS;
}

void
writeback_open (struct wb_conn *wc, struct writeback *wb, bool may_stage,
                const struct io *door)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&wb->lock);

  *wc = (struct wb_conn) { .wb = wb, .may_stage = may_stage };
  if (door) {
    wc->door = *door;
    wc->next_open = wb->open;
    wb->open = wc;
  }
  wb->conns++;
}

/* --- Claims. --- */

/* Is a page of wb overlapping [lo, hi) busy?  Lock held. */
static bool
busy_over (struct writeback *wb, uint64_t lo, uint64_t hi)
{
  struct wb_page *b;

  for (b = wb->pages; b; b = b->next)
    if (b->busy && page_overlaps (b, lo, hi))
      return true;
  return false;
}

/* Claim every page of wb overlapping [lo, hi), none of them busy;
 * the list comes out oldest first, the order they are written back
 * and laid over reads in.  Lock held.
 */
static void
claim_over (struct wb_claim *c, struct writeback *wb, uint64_t lo,
            uint64_t hi)
{
  struct wb_page *b;

  for (b = wb->pages; b; b = b->next)
    if (page_overlaps (b, lo, hi)) {
      b->busy = true;
      b->claimed = c->list;
      c->list = b;
    }
}

/* Claim them once none is busy (nothing is held while waiting). */
static void
claim_range (struct wb_claim *c, struct writeback *wb, uint64_t lo,
             uint64_t hi)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&wb->lock);

  while (busy_over (wb, lo, hi))
    pthread_cond_wait (&wb->changed, &wb->lock);
  claim_over (c, wb, lo, hi);
}

static void
claim_release (struct wb_claim *c)
{
  struct wb_page *b;

  if (c->list == NULL)
    return;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&c->wb->lock);
  for (b = c->list; b; b = b->claimed)
    b->busy = false;
  c->list = NULL;
  pthread_cond_broadcast (&c->wb->changed);
}

/* Write claimed page b to the plugin: it leaves staging, or stays
 * claimed with its error.  The first failure after a success is said,
 * once: a plugin that keeps refusing must not flood the log.
 */
static int
write_back (const struct io *io, struct writeback *wb, struct wb_page *b,
            int *err)
{
  const uint64_t lo = b->off + ranges_first (&b->staged);
  const uint64_t hi = b->off + ranges_end (&b->staged);
  struct wb_page **pp;
  unsigned i;

  for (i = 0; i < b->staged.nr; i++) {
    const struct range x = b->staged.r[i];
    if (split_pwrite (io, b->buf + x.lo, x.hi - x.lo, b->off + x.lo, 0,
                      err) == -1) {
      if (!__atomic_exchange_n (&wb->failing, true, __ATOMIC_RELAXED))
        nbdkit_error ("reshape: write-back: deferred write of %" PRIu32
                      " bytes at %" PRIu64 " failed: %s; kept staged and "
                      "retried (said once until one succeeds)",
                      x.hi - x.lo, b->off + x.lo, strerror (*err));
      b->failed = *err;
      stats_add (C_WB_FAILED, 1);
      return -1;
    }
    stats_add (C_WB_WRITTEN, x.hi - x.lo);
  }
  __atomic_store_n (&wb->failing, false, __ATOMIC_RELAXED);
  /* Whatever a reader cached meanwhile is older than this. */
  readahead_invalidate (lo, hi);
  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&wb->lock);
    for (pp = &wb->pages; *pp != b; pp = &(*pp)->next)
      ;
    *pp = b->next;
    pthread_cond_broadcast (&wb->changed);
  }
  free_page (b);
  return 0;
}

/* Write back every claimed page; those that fail stay claimed.  0, or
 * -1 with *err the first error.
 */
static int
write_back_claimed (const struct io *io, struct wb_claim *c, int *err)
{
  struct wb_page **pp = &c->list;
  int r = 0, e = 0;

  while (*pp) {
    struct wb_page *b = *pp, *after = b->claimed;

    if (write_back (io, c->wb, b, &e) == 0)
      *pp = after;
    else {
      if (r == 0)
        *err = e;
      r = -1;
      pp = &b->claimed;
    }
  }
  return r;
}

void
writeback_begin (struct wb_conn *wc, const struct io *io,
                 uint64_t lo, uint64_t hi, struct wb_claim *c)
{
  *c = (struct wb_claim) { .wb = wc->wb };
  if (!anything_staged ())
    return;
  claim_range (c, wc->wb, lo, hi);
  write_back_claimed (io, c, &c->err);
  c->held = c->list != NULL;
}

void
writeback_end_read (struct wb_claim *c, void *buf, uint32_t count,
                    uint64_t offset, bool ok)
{
  const struct wb_page *b;
  unsigned i;

  for (b = c->list; ok && b; b = b->claimed)
    for (i = 0; i < b->staged.nr; i++) {
      const uint64_t lo = MAX (b->off + b->staged.r[i].lo, offset);
      const uint64_t hi = MIN (b->off + b->staged.r[i].hi, offset + count);
      if (lo < hi)
        memcpy ((char *) buf + (lo - offset), b->buf + (lo - b->off),
                hi - lo);
    }
  claim_release (c);
}

/* A write went through over pages the plugin still refuses: they take
 * its bytes, so that their later write-back does not undo it.
 */
void
writeback_end_write (struct wb_claim *c, const void *src, uint32_t count,
                     uint64_t offset, bool ok)
{
  const struct wb_page *b;

  for (b = c->list; ok && b; b = b->claimed) {
    const uint64_t lo = MAX (b->off, offset);
    const uint64_t hi = MIN (b->off + b->len, offset + count);
    if (lo >= hi)
      continue;
    if (src)
      memcpy (b->buf + (lo - b->off), (const char *) src + (lo - offset),
              hi - lo);
    else
      memset (b->buf + (lo - b->off), 0, hi - lo);
  }
  claim_release (c);
}

void
writeback_release (struct wb_claim *c)
{
  claim_release (c);
}

bool
writeback_clean (struct wb_conn *wc, const struct io *io,
                 uint64_t lo, uint64_t hi)
{
  struct wb_claim c = { .wb = wc->wb };
  bool clean;
  int e = 0;

  if (!anything_staged ())
    return true;
  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&wc->wb->lock);
    if (busy_over (wc->wb, lo, hi))
      return false;
    claim_over (&c, wc->wb, lo, hi);
  }
  clean = write_back_claimed (io, &c, &e) == 0;
  claim_release (&c);
  return clean;
}

/* Write back every page of the export, in one pass: all claimed at
 * once (pages staged meanwhile may wait for the next).
 */
static int
drain_pages (struct wb_conn *wc, const struct io *io, int *err)
{
  struct wb_claim c = { .wb = wc->wb };
  int r;

  claim_range (&c, wc->wb, 0, UINT64_MAX);
  r = write_back_claimed (io, &c, err);
  claim_release (&c);
  return r;
}

int
writeback_flush (struct wb_conn *wc, const struct io *io, int *err)
{
  return anything_staged () ? drain_pages (wc, io, err) : 0;
}

/* --- Staging. --- */

/* Write back claimed page b and let it go: true if it left staging. */
static bool
write_back_now (const struct io *io, struct writeback *wb, struct wb_page *b)
{
  struct wb_claim c = { .wb = wb, .list = b };
  int e = 0;

  b->claimed = NULL;
  if (write_back_claimed (io, &c, &e) == 0)
    return true;
  claim_release (&c);
  return false;
}

/* Write back the oldest page no request holds, to make room. */
static bool
evict_one (struct writeback *wb, const struct io *io)
{
  struct wb_page *b, *oldest = NULL;

  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&wb->lock);
    for (b = wb->pages; b; b = b->next)
      if (!b->busy)
        oldest = b;
    if (oldest == NULL)
      return false;
    oldest->busy = true;
  }
  return write_back_now (io, wb, oldest);
}

/* What staging a write found (stage_step). */
enum stage_next {
  STAGED,
  STAGED_WHOLE,             /* the page is complete: send it */
  SEND_FIRST,               /* too many gaps: send the page, again */
  MAKE_ROOM,                /* staging is full: evict, again */
  WRITE_THROUGH,
};

/* One try at staging [lo, lo+count) of the page at boff (len bytes),
 * waiting while the page is busy; *b the page, claimed, for
 * STAGED_WHOLE and SEND_FIRST.  Connections of one export may cut at
 * different sizes (those made before and after auto learnt): a page of
 * another shape where this one would be means writing through, or a
 * write would be written back in the order of the pages, not of the
 * writes.
 */
static enum stage_next
stage_step (struct writeback *wb, uint64_t boff, uint32_t len, uint32_t lo,
            const char *buf, uint32_t count, struct wb_page **b)
{
  char *mem;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&wb->lock);

  for (;;) {
    for (*b = wb->pages; *b; *b = (*b)->next)
      if ((*b)->off < boff + len && boff < (*b)->off + (*b)->len)
        break;
    if (*b && ((*b)->off != boff || (*b)->len != len))
      return WRITE_THROUGH;
    if (*b == NULL || !(*b)->busy)
      break;
    pthread_cond_wait (&wb->changed, &wb->lock);
  }
  if (*b && !ranges_add (&(*b)->staged, lo, lo + count)) {
    (*b)->busy = true;
    return SEND_FIRST;
  }
  if (*b == NULL) {
    if ((mem = pool_get (POOL_STAGING, len)) == NULL)
      return MAKE_ROOM;
    if ((*b = malloc (sizeof **b)) == NULL) {
      pool_put (POOL_STAGING, mem, len);
      return MAKE_ROOM;
    }
    **b = (struct wb_page) { .off = boff, .len = len, .buf = mem,
                             .staged = { .nr = 1, .r = { { lo, lo + count } } },
                             .next = wb->pages };
    wb->pages = *b;
    __atomic_add_fetch (&staging.staged_bytes, len, __ATOMIC_RELAXED);
  }
  memcpy ((*b)->buf + lo, buf, count);
  stats_add (C_WB_STAGED, count);
  if (!ranges_whole (&(*b)->staged, (*b)->len))
    return STAGED;
  (*b)->busy = true;
  return STAGED_WHOLE;
}

/* Stage [offset, offset+count), all in one page: false if it must go
 * through instead.
 */
static bool
stage_write (struct wb_conn *wc, const struct io *io, const char *buf,
       uint32_t count, uint64_t offset)
{
  const uint64_t boff = ROUND_DOWN (offset, io->geo->size);
  const uint32_t len = MIN (boff + io->geo->size, io->geo->exportsize) - boff;
  bool evicted = false;
  struct wb_page *b;

  for (;;)
    switch (stage_step (wc->wb, boff, len, offset - boff, buf, count, &b)) {
    case STAGED:
      return true;
    case STAGED_WHOLE:
      /* Sent now; if that fails it stays staged, and the write is
       * acknowledged all the same: its data is kept.
       */
      write_back_now (io, wc->wb, b);
      return true;
    case SEND_FIRST:
      if (!write_back_now (io, wc->wb, b))
        return false;
      break;
    case MAKE_ROOM:
      if (evicted || !evict_one (wc->wb, io))
        return false;
      evicted = true;
      break;
    case WRITE_THROUGH:
      return false;
    }
}

/* Down after the staged pages it overlaps, copied into those the
 * plugin still refuses.
 */
static int
write_through (struct wb_conn *wc, const struct io *io, const void *buf,
               uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  struct wb_claim c;
  int r;

  writeback_begin (wc, io, offset, offset + count, &c);
  r = split_pwrite (io, buf, count, offset, flags, err);
  writeback_end_write (&c, buf, count, offset, r == 0);
  return r;
}

int
writeback_pwrite (struct wb_conn *wc, const struct io *io, const void *buf,
                  uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  const uint32_t size = io->geo->size;
  const char *p = buf;
  uint64_t pos;

  if (writeback_order (wc, offset, offset + count, err) == -1)
    return -1;
  if (!wc->may_stage || (flags & NBDKIT_FLAG_FUA) || count >= size ||
      pool_largest (POOL_STAGING) < size)
    return write_through (wc, io, buf, count, offset, flags, err);
  for (pos = offset; pos < offset + count; ) {
    const uint32_t n = MIN (ROUND_DOWN (pos, size) + size,
                            offset + count) - pos;
    if (!stage_write (wc, io, p + (pos - offset), n, pos))   /* the rest, in order */
      return write_through (wc, io, p + (pos - offset), offset + count - pos,
                            pos, flags, err);
    pos += n;
  }
  return 0;
}

/* --- Closing. --- */

struct closing {
  struct wb_conn *wc;
  const struct io *io;
  bool last;                    /* the export's last connection */
};

/* CLOSE_TRIES tries in a row; the last connection then retries every
 * twentieth of CLOSE_RETRY_NS until that has passed.
 */
static void *
drain_all (void *arg)
{
  const struct closing *c = arg;
  const uint64_t end = now_ns () + CLOSE_RETRY_NS;
  const struct timespec pause = { .tv_nsec = CLOSE_RETRY_NS / 20 };
  unsigned i;
  int e = 0;

  for (i = 1; drain_pages (c->wc, c->io, &e) == -1; i++) {
    if (i < CLOSE_TRIES)
      continue;
    if (!c->last || now_ns () >= end)
      break;
    nanosleep (&pause, NULL);
  }
  return NULL;
}

/* No other name's write may use wc's context any more; what the
 * plugin refused is given up if no connection of the export is left
 * (one opened meanwhile keeps it).
 */
static void
close_door (struct wb_conn *wc)
{
  struct writeback *wb = wc->wb;
  struct wb_conn **pp;
  uint64_t lost = 0;
  int err = 0;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&wb->lock);

  for (pp = &wb->open; *pp && *pp != wc; pp = &(*pp)->next_open)
    ;
  if (*pp)
    *pp = wc->next_open;
  while (wc->borrowers > 0)
    pthread_cond_wait (&wb->changed, &wb->lock);
  for (--wb->conns; wb->conns == 0 && wb->pages; ) {
    struct wb_page *b = wb->pages;
    unsigned i;
    if (b->busy) {
      pthread_cond_wait (&wb->changed, &wb->lock);
      continue;
    }
    wb->pages = b->next;
    err = err ? err : b->failed;
    for (i = 0; i < b->staged.nr; i++)
      lost += b->staged.r[i].hi - b->staged.r[i].lo;
    free_page (b);
  }
  if (lost == 0)
    return;
  stats_add (C_WB_LOST, lost);
  nbdkit_error ("reshape: write-back: %" PRIu64 " acknowledged bytes of "
                "export %s lost at its last close: the plugin refused "
                "them for %g s (%s)", lost, wb->name, CLOSE_RETRY_NS / 1e9,
                strerror (err ? err : EIO));
}

void
writeback_close (struct wb_conn *wc, const struct io *io)
{
  struct closing c = { .wc = wc, .io = io };
  pthread_t t;

  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&wc->wb->lock);
    c.last = wc->wb->conns == 1;
  }
  if (anything_staged ()) {
    if (pthread_create (&t, NULL, drain_all, &c) == 0)
      pthread_join (t, NULL);
    else
      drain_all (&c);
  }
  close_door (wc);
}

/* --- Other export names. --- */

static bool
has_over (struct writeback *wb, uint64_t lo, uint64_t hi)
{
  struct wb_page *b;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&wb->lock);

  for (b = wb->pages; b; b = b->next)
    if (page_overlaps (b, lo, hi))
      return true;
  return false;
}

/* Write back wb's pages over [lo, hi) through an open connection of
 * its own name (nbdkit 1.32 gives a connection no context of another
 * name), whose close waits for its borrowers.  Only a parallel plugin,
 * or one that serializes all requests, may be called so.
 */
static int
write_back_elsewhere (struct writeback *wb, uint64_t lo, uint64_t hi,
                      int *err)
{
  struct wb_claim c = { .wb = wb };
  struct wb_conn *door;
  bool connected;
  int r;

  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&wb->lock);
    connected = wb->open != NULL;
    if ((door = staging.may_borrow ? wb->open : NULL) != NULL)
      door->borrowers++;
  }
  if (door == NULL) {
    if (!has_over (wb, lo, hi))         /* given up at its last close */
      return 0;
    if (connected)
      nbdkit_error ("reshape: write-back: export %s is connected, but the "
                    "plugin serializes requests, so no request of another "
                    "export may use its connection to write back what it "
                    "staged at %" PRIu64 "-%" PRIu64, wb->name, lo, hi);
    else
      nbdkit_error ("reshape: write-back: no connection of export %s to "
                    "write back what it staged at %" PRIu64 "-%" PRIu64,
                    wb->name, lo, hi);
    *err = EIO;
    return -1;
  }
  claim_range (&c, wb, lo, hi);
  r = write_back_claimed (&door->door, &c, err);
  claim_release (&c);
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&wb->lock);
  door->borrowers--;
  pthread_cond_broadcast (&wb->changed);
  return r;
}

int
writeback_order (struct wb_conn *wc, uint64_t lo, uint64_t hi, int *err)
{
  struct writeback *wb, *next;
  int r = 0;

  /* The usual case, one export name, takes no global lock. */
  if (!anything_staged () ||
      __atomic_load_n (&staging.exports, __ATOMIC_RELAXED) < 2)
    return 0;
  pthread_mutex_lock (&staging.lock);   /* dropped around write-backs */
  for (wb = staging.list; wb && r == 0; wb = next) {
    if (wb == wc->wb || !has_over (wb, lo, hi)) {
      next = wb->next;
      continue;
    }
    wb->refs++;                         /* stays in the list */
    pthread_mutex_unlock (&staging.lock);
    r = write_back_elsewhere (wb, lo, hi, err);
    pthread_mutex_lock (&staging.lock);
    next = wb->next;
    wb_put (wb);
  }
  pthread_mutex_unlock (&staging.lock);
  return r;
}
