/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Write-back combining (reshape-writeback=true).  Small writes are
 * copied into staging blocks of reshape-size and acknowledged once
 * staged; a block goes to the plugin as one request when it is
 * complete, and before anything could miss it:
 *
 *   - a read, zero, trim or extents request overlapping it, a FUA or
 *     large write overlapping it (written through after), a write to
 *     the same block that does not continue what is staged;
 *   - flush (then the plugin's flush), connection close (finalize),
 *     and when staging reaches its share of the pool.
 *
 * All write-back runs inline, in the request that needs it, so it
 * works with plugins that serialize requests (no background thread
 * may call them).  Only at connection close does a short-lived thread
 * do it: nbdkit aborts sleeps of a closing connection's own threads,
 * which would fail the write-back in layers that sleep (delay filter).
 *
 * Blocks are kept per export, and shared by its connections only when
 * the plugin allows multi-conn; otherwise per connection, so that each
 * connection's flush covers exactly what it wrote.  A failed deferred
 * write is logged and returned by the next flush of every connection
 * that could have staged it (each connection remembers the failure
 * count it has seen), and by a read that needed it written first.
 * A flush writes back only blocks staged before it arrived, so a busy
 * writer on another connection cannot hold it up.
 */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <nbdkit-filter.h>

#include "reshape.h"

/* Staged bytes of a block: sorted, disjoint, not touching.  Requests
 * reach the filter slightly out of order, so a block fills up with a
 * few gaps on the way; more than MAX_RANGES and it is written back.
 */
#define MAX_RANGES 16

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
  bool busy;                    /* being written back */
  struct wb_block *next;
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

static uint64_t staged_bytes;   /* all exports, atomic */
static uint64_t next_seq;       /* block creation order, atomic */

void
reshape_writeback_init (struct writeback *wb)
{
  pthread_mutex_init (&wb->lock, NULL);
  pthread_cond_init (&wb->changed, NULL);
  wb->blocks = NULL;
}

void
reshape_writeback_destroy (struct writeback *wb)
{
  pthread_cond_destroy (&wb->changed);
  pthread_mutex_destroy (&wb->lock);
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
unlink_block (struct writeback *wb, struct wb_block *b)
{
  struct wb_block **pp;

  for (pp = &wb->blocks; *pp != b; pp = &(*pp)->next)
    ;
  *pp = b->next;
  __atomic_sub_fetch (&staged_bytes, b->len, __ATOMIC_RELAXED);
}

/* Write block b (marked busy by the caller, lock not held) to the
 * plugin, then forget it.  Returns 0 or the error, which is also
 * recorded for the flushes that must report it.
 */
static int
write_back (nbdkit_next *next, struct reshape_handle *h,
            struct writeback *wb, struct wb_block *b)
{
  int err = 0, r = 0;
  unsigned i;

  for (i = 0; i < b->nr; i++) {
    const struct range x = b->r[i];
    reshape_stats_add (C_WB_WRITTEN, x.hi - x.lo);
    if (reshape_split_pwrite (next, h, b->buf + x.lo, x.hi - x.lo,
                              b->off + x.lo, 0, &err) == -1) {
      nbdkit_error ("reshape: deferred write of %" PRIu32 " bytes at %"
                    PRIu64 " failed: %s; the next flush reports it",
                    x.hi - x.lo, b->off + x.lo, strerror (err));
      r = err;
    }
  }
  if (r) {
    /* Who must hear of it: the owner, or every connection. */
    if (b->owner)
      __atomic_store_n (&b->owner->wb_failed, r, __ATOMIC_RELAXED);
    else {
      __atomic_store_n (&wb->last_error, r, __ATOMIC_RELAXED);
      __atomic_add_fetch (&wb->failures, 1, __ATOMIC_RELAXED);
    }
  }
  /* Whatever a reader cached meanwhile is older than this. */
  reshape_export_invalidate (b->off + b->r[0].lo, b->off + b->r[b->nr - 1].hi);
  pthread_mutex_lock (&wb->lock);
  unlink_block (wb, b);
  pthread_cond_broadcast (&wb->changed);
  pthread_mutex_unlock (&wb->lock);
  pool_put (POOL_STAGING, b->buf, b->len);
  free (b);
  return r;                     /* 0 or the error */
}

/* Write back every block visible to h that overlaps [lo, hi) and was
 * created before upto, waiting for blocks others are writing back.
 * Returns 0 or the first error.
 */
static int
drain (nbdkit_next *next, struct reshape_handle *h, uint64_t lo,
       uint64_t hi, uint64_t upto)
{
  struct writeback *wb = &h->exp->wb;
  struct wb_block *b;
  int err = 0, e;

  if (!reshape_cfg.writeback ||
      __atomic_load_n (&staged_bytes, __ATOMIC_RELAXED) == 0)
    return 0;
  pthread_mutex_lock (&wb->lock);
 again:
  for (b = wb->blocks; b; b = b->next) {
    if (!visible (b, h) || b->seq >= upto ||
        end_byte (b) <= lo || hi <= first_byte (b))
      continue;
    if (b->busy)
      pthread_cond_wait (&wb->changed, &wb->lock);
    else {
      b->busy = true;
      pthread_mutex_unlock (&wb->lock);
      e = write_back (next, h, wb, b);
      if (e && !err)
        err = e;
      pthread_mutex_lock (&wb->lock);
    }
    goto again;
  }
  pthread_mutex_unlock (&wb->lock);
  return err;
}

/* Before anything else touches [lo, hi): stage nothing there.  Returns
 * -1 with *err if staged data there failed to reach the plugin: a read
 * must then fail rather than return what the plugin still has.
 */
int
reshape_writeback_drain (nbdkit_next *next, struct reshape_handle *h,
                         uint64_t lo, uint64_t hi, int *err)
{
  int e = drain (next, h, lo, hi, UINT64_MAX);

  if (e) {
    *err = e;
    return -1;
  }
  return 0;
}

/* Everything staged before the flush, then: did anything this
 * connection could have staged fail since its last flush?
 */
int
reshape_writeback_flush (nbdkit_next *next, struct reshape_handle *h,
                         int *err)
{
  struct writeback *wb = &h->exp->wb;
  uint64_t seen;
  int own;

  drain (next, h, 0, UINT64_MAX,
         __atomic_load_n (&next_seq, __ATOMIC_RELAXED));
  own = __atomic_exchange_n (&h->wb_failed, 0, __ATOMIC_RELAXED);
  seen = __atomic_load_n (&wb->failures, __ATOMIC_RELAXED);
  if (own) {
    *err = own;
    return -1;
  }
  if (seen != h->wb_seen) {
    h->wb_seen = seen;
    *err = __atomic_load_n (&wb->last_error, __ATOMIC_RELAXED);
    return -1;
  }
  return 0;
}

/* A new connection is not told of failures from before it. */
void
reshape_writeback_open (struct reshape_handle *h)
{
  h->wb_seen = __atomic_load_n (&h->exp->wb.failures, __ATOMIC_RELAXED);
  h->wb_failed = 0;
}

/* Write back the oldest visible block to make room; false if none. */
static bool
evict_one (nbdkit_next *next, struct reshape_handle *h, struct writeback *wb)
{
  struct wb_block *b, *oldest = NULL;

  pthread_mutex_lock (&wb->lock);
  for (b = wb->blocks; b; b = b->next)
    if (!b->busy && visible (b, h))
      oldest = b;                       /* new blocks go in front */
  if (oldest)
    oldest->busy = true;
  pthread_mutex_unlock (&wb->lock);
  if (oldest)
    write_back (next, h, wb, oldest);
  return oldest != NULL;
}

/* Stage [offset, offset+count), all within one block; returns 1 if
 * staged, 0 if it must be written through, -1 if the block it
 * completed failed to write (*err set).
 */
static int
stage (nbdkit_next *next, struct reshape_handle *h, const char *buf,
       uint32_t count, uint64_t offset, bool *evicted, int *err)
{
  struct writeback *wb = &h->exp->wb;
  const uint64_t boff = offset - offset % h->geo.size;
  const uint32_t lo = offset - boff, hi = lo + count;
  struct wb_block *b;

  pthread_mutex_lock (&wb->lock);
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
    pthread_mutex_unlock (&wb->lock);
    write_back (next, h, wb, b);
    pthread_mutex_lock (&wb->lock);
    goto again;
  }
  if (b == NULL) {
    const uint64_t end = boff + h->geo.size;
    uint32_t len = (end < h->geo.exportsize ? end : h->geo.exportsize) - boff;
    char *mem;

    mem = pool_get (POOL_STAGING, len);
    if (mem == NULL) {
      /* Staging is full: make room once, else write through. */
      pthread_mutex_unlock (&wb->lock);
      if (*evicted || !evict_one (next, h, wb))
        return 0;
      *evicted = true;
      pthread_mutex_lock (&wb->lock);
      goto again;
    }
    b = malloc (sizeof *b);
    if (b == NULL) {
      pool_put (POOL_STAGING, mem, len);
      pthread_mutex_unlock (&wb->lock);
      return 0;
    }
    *b = (struct wb_block) {
      .owner = owner_of (h), .off = boff, .len = len,
      .seq = __atomic_fetch_add (&next_seq, 1, __ATOMIC_RELAXED),
      .nr = 1, .r = { { lo, hi } }, .buf = mem, .next = wb->blocks,
    };
    wb->blocks = b;
    __atomic_add_fetch (&staged_bytes, len, __ATOMIC_RELAXED);
  }
  memcpy (b->buf + lo, buf, count);
  reshape_stats_add (C_WB_STAGED, count);
  if (b->nr == 1 && b->r[0].lo == 0 && b->r[0].hi == b->len) {
    /* complete: send it now */
    b->busy = true;
    pthread_mutex_unlock (&wb->lock);
    *err = write_back (next, h, wb, b);
    return *err ? -1 : 1;
  }
  pthread_mutex_unlock (&wb->lock);
  return 1;
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
    goto through;
  while (pos < offset + count) {
    uint64_t block_end = pos - pos % size + size;
    uint32_t n = (block_end < offset + count ? block_end : offset + count)
      - pos;
    bool evicted = false;
    int r = stage (next, h, p + (pos - offset), n, pos, &evicted, err);
    if (r == -1)                /* this write's block failed: say so now */
      return -1;
    if (r == 0) {
      /* Could not stage: what is left goes through, in order (a failed
       * drain is the sticky error's to report).
       */
      int ignored;
      reshape_writeback_drain (next, h, pos, offset + count, &ignored);
      return reshape_merge_pwrite (next, h, p + (pos - offset),
                                   offset + count - pos, pos, flags, err);
    }
    pos += n;
  }
  return 0;

 through:
  {
    int ignored;
    reshape_writeback_drain (next, h, offset, offset + count, &ignored);
  }
  return reshape_merge_pwrite (next, h, buf, count, offset, flags, err);
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

  drain (c->next, c->h, 0, UINT64_MAX, UINT64_MAX);  /* errors: logged */
  return NULL;
}

void
reshape_writeback_finalize (nbdkit_next *next, struct reshape_handle *h)
{
  struct closing c = { .next = next, .h = h };
  pthread_t t;

  if (!reshape_cfg.writeback ||
      __atomic_load_n (&staged_bytes, __ATOMIC_RELAXED) == 0)
    return;
  if (pthread_create (&t, NULL, drain_all, &c) == 0)
    pthread_join (t, NULL);
  else
    drain_all (&c);
}
