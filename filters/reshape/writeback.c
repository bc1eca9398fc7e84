/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Write-back combining (reshape-writeback=true): a volatile write
 * cache.  Small writes are copied into staging pages of reshape-size
 * and acknowledged once staged; a page goes to the plugin as one
 * request when it is complete, and before anything could miss it:
 *
 *   - a read, zero, trim or extents request overlapping it, a FUA or
 *     large write overlapping it (written through after), a write to
 *     the same page that would leave too many gaps;
 *   - flush (then the plugin's flush), connection close, and when
 *     staging reaches its share of the pool (eviction).
 *
 * A page leaves staging only once the plugin has it.  A write-back
 * that fails keeps the page staged and is tried again at the next of
 * the occasions above; meanwhile reads overlapping it get its bytes
 * laid over what the plugin returns, so acknowledged data stays
 * readable.  A flush succeeds only when every page staged before it
 * is in the plugin, and fails with the plugin's error while one is
 * not.  When failed pages fill the staging share, new writes go
 * through to the plugin (their writers get their own errors).  A
 * closing connection's pages become the export's: its other
 * connections see them, and their flushes and closes retry them.
 * Staged data never outlives its export name's last connection: that
 * close retries for CLOSE_RETRY_NS, and gives up what the plugin still
 * refuses, in one error line (only a successful flush promises
 * durability, and a client whose flush failed was told so).  So
 * nothing is staged at server exit (nbdkit 1.32 closes every
 * connection before cleanup), and no later write of another name
 * waits for, or fails on, a name nobody uses.
 *
 * Who may touch a page's data: a thread claims the page (busy) to
 * write it back, to lay it over a read or to patch it around a write
 * sent through; others wait.  A request claims all the pages it
 * needs at once and never waits for a claim while holding one, so
 * claims cannot deadlock.  Staging a write (under the export's lock)
 * waits for its page to be free.
 *
 * All write-back runs inline, in the request that needs it, so it
 * works with plugins that serialize requests (no background thread
 * may call them).  Only at connection close does a short-lived thread
 * do it: nbdkit aborts sleeps of a closing connection's own threads,
 * which would fail the write-back in layers that sleep (delay filter).
 *
 * Pages are kept per export, and shared by its connections only when
 * the plugin allows multi-conn; otherwise per connection, so that each
 * connection's flush covers exactly what it wrote.  Whoever owns a
 * page, every request of the export that overlaps it sees it (reads
 * get its bytes, writes go after it), and no two pages of an export
 * overlap, so nothing staged is written back over a later write.
 * Export names may share storage: a write first writes back what
 * other names staged over it, through an open connection of that name
 * (none open: the write fails, since the staged data must not go to
 * the wrong storage nor undo this write later).
 */

#include <config.h>

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nbdkit-filter.h>

#include "readahead.h"
#include "common.h"
#include "pool.h"
#include "ranges.h"
#include "split.h"
#include "stats.h"
#include "tunables.h"
#include "writeback.h"

struct wb_page {
  const struct wb_conn *owner;  /* NULL: shared by the export */
  uint64_t seq;                 /* when it was created */
  uint64_t off;                 /* aligned to reshape-size */
  uint32_t len;                 /* page length, clipped at export end */
  struct ranges staged;         /* the bytes of it staged */
  char *buf;
  bool busy;                    /* claimed by a thread */
  int failed;                   /* error of its last write-back, or 0 */
  struct wb_page *next;         /* the export's list */
  struct wb_page *claimed;      /* its claimer's list */
};

struct writeback {
  pthread_mutex_t lock;         /* the list and each page's fields */
  pthread_cond_t changed;       /* a page was released or removed */
  struct wb_page *pages;        /* newest first */
  unsigned conns;               /* connections open to the export */
  bool shared;                  /* pages shared: the first's multi-conn */
  struct wb_conn *open;         /* its open connections */
  char *name;                   /* the export's, for messages */
  unsigned refs;                /* the export's, walks' (staging.lock) */
  struct writeback *next;
};

/* Staging as a whole, every export's. */
static struct {
  uint64_t staged_bytes;        /* atomic: the fast path's test */
  uint64_t next_seq;            /* page creation order, atomic */
  pthread_mutex_t lock;         /* the list of exports */
  struct writeback *list;       /* for writeback_order */
  unsigned exports;             /* in the list, atomic */
  bool may_borrow;              /* see writeback_thread_model */
} staging = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* The first and the end of the staged bytes, for overlap tests. */
static uint64_t
first_byte (const struct wb_page *b)
{
  return b->off + ranges_first (&b->staged);
}

static uint64_t
end_byte (const struct wb_page *b)
{
  return b->off + ranges_end (&b->staged);
}

static bool
overlaps (const struct wb_page *b, uint64_t lo, uint64_t hi)
{
  return first_byte (b) < hi && lo < end_byte (b);
}

static bool
visible (const struct wb_page *b, const struct wb_conn *wc)
{
  return b->owner == NULL || b->owner == wc;
}

/* The owner of the pages wc creates. */
static const struct wb_conn *
owner_for (const struct wb_conn *wc)
{
  return wc->shared ? NULL : wc;
}

/* Is anything staged anywhere?  Every request asks first. */
static bool
anything_staged (void)
{
  return __atomic_load_n (&staging.staged_bytes, __ATOMIC_RELAXED) > 0;
}

static void
free_page (struct wb_page *b)
{
  __atomic_sub_fetch (&staging.staged_bytes, b->len, __ATOMIC_RELAXED);
  pool_put (POOL_STAGING, b->buf, b->len);
  free (b);
}

/* Data that can never reach the plugin (its export's last close):
 * the bytes of it that are lost, each range in the debug log.
 */
static uint64_t
give_up (struct wb_page *b)
{
  uint64_t lost = 0;
  unsigned i;

  for (i = 0; i < b->staged.nr; i++) {
    const struct range x = b->staged.r[i];
    nbdkit_debug ("reshape: write-back: %" PRIu32 " acknowledged bytes at "
                  "%" PRIu64 " lost (%s)", x.hi - x.lo, b->off + x.lo,
                  strerror (b->failed ? b->failed : EIO));
    stats_add (C_WB_LOST, x.hi - x.lo);
    lost += x.hi - x.lo;
  }
  free_page (b);
  return lost;
}

struct writeback *
writeback_new (const char *name)
{
  struct writeback *wb = calloc (1, sizeof *wb);

  if (wb == NULL)
    return NULL;
  wb->name = stats_log_name (name);     /* only log lines show it */
  if (wb->name == NULL) {
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

static void
writeback_free (struct writeback *wb)
{
  assert (wb->pages == NULL);
  pthread_cond_destroy (&wb->changed);
  pthread_mutex_destroy (&wb->lock);
  free (wb->name);
  free (wb);
}

void
writeback_thread_model (int model)
{
  staging.may_borrow = model == NBDKIT_THREAD_MODEL_PARALLEL ||
    model == NBDKIT_THREAD_MODEL_SERIALIZE_ALL_REQUESTS;
}

/* Drop a reference; wb is unlinked and freed once none is left (then
 * it is empty: its last close left nothing staged).  staging.lock
 * held.
 */
static void
put (struct writeback *wb)
{
  struct writeback **pp;

  if (--wb->refs > 0)
    return;
  for (pp = &staging.list; *pp != wb; pp = &(*pp)->next)
    ;
  *pp = wb->next;
  __atomic_sub_fetch (&staging.exports, 1, __ATOMIC_RELAXED);
  writeback_free (wb);
}

void
writeback_drop (struct writeback *wb)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&staging.lock);

  put (wb);
}

void
writeback_open (struct wb_conn *wc, struct writeback *wb, bool shared,
                bool may_stage, const struct io *door)
{
  wc->wb = wb;
  wc->shared = shared;
  wc->may_stage = may_stage;
  wc->door = door ? *door : (struct io) { .next = NULL };
  wc->borrowers = 0;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&wb->lock);
  if (door) {
    wc->next_open = wb->open;
    wb->open = wc;
  }
  /* Whether pages are shared is the export's, not each connection's:
   * a plugin may answer multi-conn differently per connection (yes to
   * read-only ones, say), and a shared page over another
   * connection's own would stage the same bytes twice, written back
   * in the order of the pages, not of the writes.  The first
   * connection while none is open decides (pages left by earlier
   * ones belong to no connection, so either answer sees them); one
   * that disagrees does not stage.
   */
  if (wb->conns == 0)
    wb->shared = shared;
  else if (shared != wb->shared) {
    wc->may_stage = false;
    nbdkit_debug ("reshape: write-back: this connection's multi-conn "
                  "differs from the export's first: its writes are not "
                  "staged");
  }
  wb->conns++;
}

/* Claim b for c.  Lock held, b not busy. */
static void
claim (struct wb_claim *c, struct wb_page *b)
{
  b->busy = true;
  b->claimed = c->list;
  c->list = b;
}

/* Is a page of wb that overlaps [lo, hi) busy?  Lock held.  (Any
 * owner's: a request sees every page of its export.)
 */
static bool
busy_over (struct writeback *wb, uint64_t lo, uint64_t hi)
{
  struct wb_page *b;

  for (b = wb->pages; b; b = b->next)
    if (overlaps (b, lo, hi) && b->busy)
      return true;
  return false;
}

/* Claim every page of wb that overlaps [lo, hi).  Lock held, none of
 * them busy.  The list comes out oldest first: written back and laid
 * over reads in that order.
 */
static void
claim_over (struct wb_claim *c, struct writeback *wb, uint64_t lo,
            uint64_t hi)
{
  struct wb_page *b;

  for (b = wb->pages; b; b = b->next)
    if (overlaps (b, lo, hi))
      claim (c, b);
}

/* Claim every page of wb that overlaps [lo, hi), once none of them
 * is busy (so nothing is held while waiting).
 */
static void
claim_range (struct wb_claim *c, struct writeback *wb, uint64_t lo,
             uint64_t hi)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&wb->lock);

  while (busy_over (wb, lo, hi))
    pthread_cond_wait (&wb->changed, &wb->lock);
  claim_over (c, wb, lo, hi);
}

/* Let the claimed pages go. */
static void
release (struct wb_claim *c)
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

/* Unlink b (claimed) from the export's list and free it. */
static void
remove_page (struct writeback *wb, struct wb_page *b)
{
  struct wb_page **pp;

  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&wb->lock);
    for (pp = &wb->pages; *pp != b; pp = &(*pp)->next)
      ;
    *pp = b->next;
    pthread_cond_broadcast (&wb->changed);
  }
  free_page (b);
}

/* Write claimed page b to the plugin.  On success it leaves staging
 * (unlinked and freed); on failure it stays, still claimed, with the
 * error noted.  0, or -1 with *err set.
 */
static int
write_back (const struct io *io, struct writeback *wb, struct wb_page *b,
            int *err)
{
  const uint64_t lo = first_byte (b), hi = end_byte (b);
  bool failed = false;
  unsigned i;

  for (i = 0; i < b->staged.nr; i++) {
    const struct range x = b->staged.r[i];
    int e;
    if (split_pwrite (io, b->buf + x.lo, x.hi - x.lo, b->off + x.lo, 0,
                      &e) == -1) {
      nbdkit_error ("reshape: deferred write of %" PRIu32 " bytes at %"
                    PRIu64 " failed: %s; kept staged, tried again later",
                    x.hi - x.lo, b->off + x.lo, strerror (e));
      if (!failed)
        *err = e;
      failed = true;
    }
  }
  if (failed) {
    b->failed = *err;
    stats_add (C_WB_FAILED, 1);
    return -1;
  }
  for (i = 0; i < b->staged.nr; i++)
    stats_add (C_WB_WRITTEN, b->staged.r[i].hi - b->staged.r[i].lo);
  /* Whatever a reader cached meanwhile is older than this. */
  readahead_invalidate (lo, hi);
  remove_page (wb, b);
  return 0;
}

/* Write back every claimed page; the ones that fail stay claimed.
 * 0, or -1 with *err set to the first error.
 */
static int
write_back_claimed (const struct io *io, struct wb_claim *c, int *err)
{
  struct wb_page **pp = &c->list;
  int r = 0, e = 0;

  while (*pp) {
    struct wb_page *b = *pp, *after = b->claimed;

    if (write_back (io, c->wb, b, &e) == 0)
      *pp = after;                /* b is gone */
    else {
      if (r == 0)
        *err = e;
      r = -1;
      pp = &b->claimed;
    }
  }
  return r;
}

/* Lay the staged bytes of the claimed pages over buf, which holds
 * [offset, offset+count) as read from the plugin.
 */
static void
overlay (const struct wb_claim *c, char *buf, uint32_t count,
         uint64_t offset)
{
  const struct wb_page *b;
  unsigned i;

  for (b = c->list; b; b = b->claimed)
    for (i = 0; i < b->staged.nr; i++) {
      uint64_t lo = MAX (b->off + b->staged.r[i].lo, offset);
      uint64_t hi = MIN (b->off + b->staged.r[i].hi, offset + count);
      if (lo < hi)
        memcpy (buf + (lo - offset), b->buf + (lo - b->off), hi - lo);
    }
}

/* A write went through to the plugin over [offset, offset+count):
 * the claimed pages that are still staged take its bytes (src, or
 * zeros when src is NULL), so that their later write-back does not
 * undo it.
 */
static void
patch (const struct wb_claim *c, const char *src, uint32_t count,
       uint64_t offset)
{
  const struct wb_page *b;

  for (b = c->list; b; b = b->claimed) {
    uint64_t lo = MAX (b->off, offset);
    uint64_t hi = MIN (b->off + b->len, offset + count);
    if (lo >= hi)
      continue;
    if (src)
      memcpy (b->buf + (lo - b->off), src + (lo - offset), hi - lo);
    else
      memset (b->buf + (lo - b->off), 0, hi - lo);
  }
}

void
writeback_begin (struct wb_conn *wc, const struct io *io,
                 uint64_t lo, uint64_t hi, struct wb_claim *c)
{
  *c = (struct wb_claim) { .wb = wc->wb };
  if (!anything_staged ())
    return;
  claim_range (c, wc->wb, lo, hi);
  /* What the plugin refuses stays held (it is what is left in
   * c->list): the caller decides what to do with it.
   */
  write_back_claimed (io, c, &c->err);
  c->held = c->list != NULL;
}

void
writeback_end_read (struct wb_claim *c, void *buf, uint32_t count,
                    uint64_t offset, bool ok)
{
  if (ok)
    overlay (c, buf, count, offset);
  release (c);
}

void
writeback_end_write (struct wb_claim *c, const void *src, uint32_t count,
                     uint64_t offset, bool ok)
{
  if (ok)
    patch (c, src, count, offset);
  release (c);
}

void
writeback_release (struct wb_claim *c)
{
  release (c);
}

bool
writeback_clean (struct wb_conn *wc, const struct io *io,
                 uint64_t lo, uint64_t hi)
{
  struct writeback *wb = wc->wb;
  struct wb_claim c = { .wb = wb };
  bool clean;
  int e;

  if (!anything_staged ())
    return true;
  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&wb->lock);

    /* Never wait: the caller may itself hold pages in the range. */
    if (busy_over (wb, lo, hi))
      return false;
    claim_over (&c, wb, lo, hi);
  }
  /* A failure is logged, and the range is not clean. */
  clean = write_back_claimed (io, &c, &e) == 0;
  release (&c);
  return clean;
}

/* The pages visible to wc created before upto, by sequence number
 * (pages come and go while a drain runs; numbers are never reused).
 * Lock held.  0, or -1 if there is no memory for the list.
 */
static int
snapshot (struct wb_conn *wc, uint64_t upto, uint64_t **seqs, size_t *n)
{
  struct wb_page *b;
  size_t i = 0;

  *n = 0;
  *seqs = NULL;
  for (b = wc->wb->pages; b; b = b->next)
    if (visible (b, wc) && b->seq < upto)
      (*n)++;
  if (*n == 0)
    return 0;
  *seqs = malloc (*n * sizeof **seqs);
  if (*seqs == NULL)
    return -1;
  for (b = wc->wb->pages; b; b = b->next)
    if (visible (b, wc) && b->seq < upto)
      (*seqs)[i++] = b->seq;
  return 0;
}

/* The page numbered seq, NULL if it is gone.  Lock held. */
static struct wb_page *
find_seq (struct writeback *wb, uint64_t seq)
{
  struct wb_page *b;

  for (b = wb->pages; b; b = b->next)
    if (b->seq == seq)
      return b;
  return NULL;
}

/* Claim the page numbered seq, waiting while another thread holds
 * it; false if it is gone (written back).  Lock held.
 */
static bool
claim_seq (struct wb_claim *c, struct writeback *wb, uint64_t seq)
{
  struct wb_page *b;

  while ((b = find_seq (wb, seq)) != NULL && b->busy)
    pthread_cond_wait (&wb->changed, &wb->lock);
  if (b)
    claim (c, b);
  return b != NULL;
}

/* Write back every page visible to wc created before upto, each
 * tried once by this drain (however often other threads try it
 * meanwhile), waiting for pages others hold.  0, or -1 with *err
 * set to the first error (also when there was no memory to list the
 * pages: then nothing was tried).
 */
static int
drain (struct wb_conn *wc, const struct io *io, uint64_t upto, int *err)
{
  struct writeback *wb = wc->wb;
  CLEANUP_FREE uint64_t *seqs = NULL;
  size_t n, i;
  int r = 0, e;

  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&wb->lock);
    if (snapshot (wc, upto, &seqs, &n) == -1) {
      *err = ENOMEM;
      nbdkit_error ("reshape: write-back: %m");
      return -1;
    }
  }
  for (i = 0; i < n; i++) {
    struct wb_claim c = { .wb = wb };
    bool claimed;

    {
      ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&wb->lock);
      claimed = claim_seq (&c, wb, seqs[i]);
    }
    if (!claimed)
      continue;
    if (write_back_claimed (io, &c, &e) == -1 && r == 0) {
      *err = e;
      r = -1;
    }
    release (&c);
  }
  return r;
}

int
writeback_flush (struct wb_conn *wc, const struct io *io, int *err)
{
  if (!anything_staged ())
    return 0;
  return drain (wc, io, __atomic_load_n (&staging.next_seq, __ATOMIC_RELAXED),
                err);
}

/* Write back the oldest page visible to wc to make room; false if
 * nothing could be written back.
 */
static bool
evict_one (struct wb_conn *wc, const struct io *io)
{
  struct writeback *wb = wc->wb;
  struct wb_claim c = { .wb = wb };
  struct wb_page *b, *oldest = NULL;
  bool freed;
  int e;

  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&wb->lock);

    for (b = wb->pages; b; b = b->next)
      if (!b->busy && visible (b, wc))
        oldest = b;                     /* new pages go in front */
    if (oldest == NULL)
      return false;
    claim (&c, oldest);
  }
  freed = write_back_claimed (io, &c, &e) == 0;     /* failures logged */
  release (&c);
  return freed;
}

/* A new staging page of len bytes at boff holding [lo, hi), linked
 * in (lock held); NULL if staging has no room.
 */
static struct wb_page *
new_page (struct wb_conn *wc, uint64_t boff, uint32_t len,
          uint32_t lo, uint32_t hi)
{
  struct writeback *wb = wc->wb;
  char *mem = pool_get (POOL_STAGING, len);
  struct wb_page *b;

  if (mem == NULL)
    return NULL;
  b = malloc (sizeof *b);
  if (b == NULL) {
    pool_put (POOL_STAGING, mem, len);
    return NULL;
  }
  *b = (struct wb_page) {
    .owner = owner_for (wc), .off = boff, .len = len,
    .seq = __atomic_fetch_add (&staging.next_seq, 1, __ATOMIC_RELAXED),
    .staged = { .nr = 1, .r = { { lo, hi } } },
    .buf = mem, .next = wb->pages,
  };
  wb->pages = b;
  __atomic_add_fetch (&staging.staged_bytes, len, __ATOMIC_RELAXED);
  return b;
}

/* Write back page b, claimed, and let it go: true if it left
 * staging (a failure is logged, and the page stays staged).
 */
static bool
write_back_now (const struct io *io, struct writeback *wb,
                struct wb_page *b)
{
  struct wb_claim c = { .wb = wb, .list = b };
  bool freed;
  int e;

  b->claimed = NULL;
  freed = write_back_claimed (io, &c, &e) == 0;
  release (&c);
  return freed;
}

/* The staged page of the export whose extent overlaps [lo, hi), if
 * any, whoever owns it.  Lock held.  Pages never overlap each other
 * (stage_step).
 */
static struct wb_page *
page_over (struct writeback *wb, uint64_t lo, uint64_t hi)
{
  struct wb_page *b;

  for (b = wb->pages; b; b = b->next)
    if (b->off < hi && lo < b->off + b->len)
      return b;
  return NULL;
}

/* What staging a write found it must do (stage_step). */
enum stage_next {
  STAGED,                   /* done */
  STAGED_WHOLE,             /* done, the page complete: send it */
  SEND_FIRST,               /* the page has too many gaps: send it,
                               then try again */
  MAKE_ROOM,                /* staging is full: evict, then again */
  WRITE_THROUGH,            /* the write cannot be staged */
};

/* One try at staging [lo, hi) of the page at boff (len bytes, this
 * connection's request size), under the export's lock, waiting while
 * the page is busy.  For STAGED_WHOLE and SEND_FIRST, *b is the page,
 * claimed.
 *
 * Connections of one export may be told different sizes (reshape-
 * size=auto: those made before and after it was learnt) and share
 * their pages (multi-conn).  A page of another shape where this
 * one would be means writing through: staged in a page of its own,
 * a write would be written back in the order of the pages, not of
 * the writes, and a page found by its offset alone may be shorter
 * than the write reaches.  A page another connection owns (no
 * multi-conn), or one a closed connection left, means writing
 * through too: after it, so that its later write-back cannot undo
 * this write.
 */
static enum stage_next
stage_step (struct wb_conn *wc, uint64_t boff, uint32_t len,
            uint32_t lo, const char *buf, uint32_t count,
            struct wb_page **b)
{
  struct writeback *wb = wc->wb;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&wb->lock);

  for (;;) {
    *b = page_over (wb, boff, boff + len);
    if (*b && ((*b)->off != boff || (*b)->len != len ||
               (*b)->owner != owner_for (wc)))
      return WRITE_THROUGH;
    if (*b == NULL || !(*b)->busy)
      break;
    pthread_cond_wait (&wb->changed, &wb->lock);
  }
  if (*b && !ranges_add (&(*b)->staged, lo, lo + count)) {
    (*b)->busy = true;
    return SEND_FIRST;
  }
  if (*b == NULL && (*b = new_page (wc, boff, len, lo, lo + count)) == NULL)
    return MAKE_ROOM;
  memcpy ((*b)->buf + lo, buf, count);
  stats_add (C_WB_STAGED, count);
  if (!ranges_whole (&(*b)->staged, (*b)->len))
    return STAGED;
  (*b)->busy = true;
  return STAGED_WHOLE;
}

/* Stage [offset, offset+count), all within one page.  Returns true
 * if staged, false if it must be written through instead.
 */
static bool
stage (struct wb_conn *wc, const struct io *io, const char *buf,
       uint32_t count, uint64_t offset)
{
  const uint64_t boff = ROUND_DOWN (offset, io->geo->size);
  const uint32_t len =
    MIN (boff + io->geo->size, io->geo->exportsize) - boff;
  bool evicted = false;
  struct wb_page *b;

  assert (offset - boff + count <= len);
  for (;;) {
    switch (stage_step (wc, boff, len, offset - boff, buf, count, &b)) {
    case STAGED:
      return true;
    case STAGED_WHOLE:
      /* Sent now.  If that fails it stays staged, and the write is
       * acknowledged all the same: its data is kept.
       */
      write_back_now (io, wc->wb, b);
      return true;
    case SEND_FIRST:
      if (!write_back_now (io, wc->wb, b))
        return false;           /* it stays: this write goes through */
      break;
    case MAKE_ROOM:
      if (evicted || !evict_one (wc, io))
        return false;
      evicted = true;
      break;
    case WRITE_THROUGH:
      return false;
    }
  }
}

/* A write that is not staged goes down after the staged pages it
 * overlaps, and is copied into those the plugin still refuses.
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
  uint64_t pos = offset;

  if (writeback_order (wc, offset, offset + count, err) == -1)
    return -1;
  if (!wc->may_stage || (flags & NBDKIT_FLAG_FUA) || count >= size ||
      pool_largest (POOL_STAGING) < size)
    return write_through (wc, io, buf, count, offset, flags, err);
  while (pos < offset + count) {
    const uint32_t n = MIN (ROUND_DOWN (pos, size) + size,
                            offset + count) - pos;

    if (!stage (wc, io, p + (pos - offset), n, pos))
      /* What is left goes through, in order. */
      return write_through (wc, io, p + (pos - offset),
                            offset + count - pos, pos, flags, err);
    pos += n;
  }
  return 0;
}

/* Connection closing: nothing it staged may be left behind.  The
 * write-back runs on a thread of its own, since nbdkit aborts sleeps
 * (delay filter, some plugins) made by a closing connection's threads.
 * The export's last connection retries for CLOSE_RETRY_NS: what it
 * cannot write is lost then.
 */
struct closing {
  struct wb_conn *wc;
  const struct io *io;
  bool last;
};

static void *
drain_all (void *arg)
{
  const struct closing *c = arg;
  const uint64_t end = now_ns () + CLOSE_RETRY_NS;
  const struct timespec pause = { .tv_nsec = CLOSE_RETRY_NS / 20 };
  unsigned i;
  int e;

  for (i = 1; drain (c->wc, c->io, UINT64_MAX, &e) == -1; i++) {
    if (i < CLOSE_TRIES)
      continue;                     /* failures are logged */
    if (!c->last || now_ns () >= end)
      break;
    nanosleep (&pause, NULL);
  }
  return NULL;
}

/* The connection's pages become the export's, so that its other
 * connections see them and their flushes retry them (a client that
 * reconnects at once reads what it wrote).  True if wc is the
 * export's last connection.
 */
static bool
hand_over (struct wb_conn *wc)
{
  struct writeback *wb = wc->wb;
  struct wb_page *b;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&wb->lock);

  for (b = wb->pages; b; b = b->next)
    if (b->owner == wc)
      b->owner = NULL;
  return wb->conns == 1;
}

/* No other export's write may use wc's context any more: it is
 * about to go.  True if no connection of the export is left.
 */
static bool
shut_door (struct wb_conn *wc)
{
  struct writeback *wb = wc->wb;
  struct wb_conn **pp;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&wb->lock);

  for (pp = &wb->open; *pp && *pp != wc; pp = &(*pp)->next_open)
    ;
  if (*pp)
    *pp = wc->next_open;
  while (wc->borrowers > 0)
    pthread_cond_wait (&wb->changed, &wb->lock);
  return --wb->conns == 0;
}

/* The export's last connection has closed: what the plugin refused
 * until now is given up, in one line (a connection of the name opened
 * meanwhile keeps it instead).
 */
static void
give_up_left (struct writeback *wb)
{
  uint64_t lost = 0;
  int err = 0;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&wb->lock);

  while (wb->conns == 0 && wb->pages) {
    struct wb_page *b = wb->pages;
    if (b->busy) {
      pthread_cond_wait (&wb->changed, &wb->lock);
      continue;
    }
    wb->pages = b->next;
    err = err ? err : b->failed;
    lost += give_up (b);
  }
  if (lost > 0)
    nbdkit_error ("reshape: write-back: %" PRIu64 " acknowledged bytes of "
                  "export %s lost at its last close: the plugin refused "
                  "them for %g s (%s)", lost, wb->name,
                  CLOSE_RETRY_NS / 1e9, strerror (err ? err : EIO));
}

void
writeback_close (struct wb_conn *wc, const struct io *io)
{
  struct closing c = { .wc = wc, .io = io, .last = hand_over (wc) };
  pthread_t t;

  if (anything_staged ()) {
    if (pthread_create (&t, NULL, drain_all, &c) == 0)
      pthread_join (t, NULL);
    else
      drain_all (&c);
  }
  if (shut_door (wc))
    give_up_left (wc->wb);
}

/* Has wb a page over [lo, hi)? */
static bool
has_over (struct writeback *wb, uint64_t lo, uint64_t hi)
{
  struct wb_page *b;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&wb->lock);

  for (b = wb->pages; b; b = b->next)
    if (overlaps (b, lo, hi))
      return true;
  return false;
}

/* An open connection of wb's export whose context another export's
 * request may use (nbdkit 1.32 gives a connection no context of
 * another export name), marked borrowed; NULL if there is none, or
 * the plugin's thread model forbids it (requests of one connection
 * serialized, but not all requests).
 */
static struct wb_conn *
borrow (struct writeback *wb, bool *connected)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&wb->lock);

  *connected = wb->open != NULL;
  if (!staging.may_borrow || wb->open == NULL)
    return NULL;
  wb->open->borrowers++;
  return wb->open;
}

static void
give_back (struct wb_conn *wc)
{
  struct writeback *wb = wc->wb;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&wb->lock);

  wc->borrowers--;
  pthread_cond_broadcast (&wb->changed);
}

/* Write back wb's pages over [lo, hi) through a connection of its
 * own export.  0, or -1 with *err set (those that failed stay
 * staged; with no connection to use, nothing is tried).
 */
static int
write_back_elsewhere (struct writeback *wb, uint64_t lo, uint64_t hi,
                      int *err)
{
  struct wb_claim c = { .wb = wb };
  bool connected;
  struct wb_conn *door = borrow (wb, &connected);
  int r;

  if (door == NULL) {
    if (!has_over (wb, lo, hi))         /* given up at its last close */
      return 0;
    if (!connected)
      nbdkit_error ("reshape: write-back: no connection of export %s "
                    "to write back through", wb->name);
    else
      nbdkit_error ("reshape: write-back: export %s is connected, but "
                    "the plugin serializes requests, so no request of "
                    "another export may use its connection", wb->name);
    *err = EIO;
    return -1;
  }
  claim_range (&c, wb, lo, hi);
  r = write_back_claimed (&door->door, &c, err);
  release (&c);
  give_back (door);
  return r;
}

/* The other exports with pages over [lo, hi), each referenced (put
 * them back).  NULL if none, or if there is no memory (*err set).
 */
static struct writeback **
others_over (struct writeback *self, uint64_t lo, uint64_t hi, size_t *n,
             int *err)
{
  struct writeback *wb, **v = NULL, **nv;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&staging.lock);

  *n = 0;
  for (wb = staging.list; wb; wb = wb->next) {
    if (wb == self || !has_over (wb, lo, hi))
      continue;
    nv = realloc (v, (*n + 1) * sizeof *v);
    if (nv == NULL) {
      *err = ENOMEM;
      break;
    }
    v = nv;
    v[(*n)++] = wb;
    wb->refs++;                 /* not freed under the walk */
  }
  return v;
}

int
writeback_order (struct wb_conn *wc, uint64_t lo, uint64_t hi, int *err)
{
  struct writeback **v;
  size_t n, i;
  int r = 0, e = 0;

  /* A write of the only export (the usual case) takes no global lock. */
  if (!anything_staged () ||
      __atomic_load_n (&staging.exports, __ATOMIC_RELAXED) < 2)
    return 0;
  v = others_over (wc->wb, lo, hi, &n, &e);
  for (i = 0; i < n; i++) {
    if (r == 0 && write_back_elsewhere (v[i], lo, hi, &e) == -1) {
      nbdkit_error ("reshape: write-back: what export %s staged at "
                    "%" PRIu64 "-%" PRIu64 " must reach the plugin "
                    "before this write and could not: %s",
                    v[i]->name, lo, hi, strerror (e));
      r = -1;
    }
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&staging.lock);
    put (v[i]);
  }
  free (v);
  if (r == 0 && e != 0) {       /* no memory for the list */
    nbdkit_error ("reshape: write-back: %s", strerror (e));
    r = -1;
  }
  if (r == -1)
    *err = e;
  return r;
}
