/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Read data kept for later reads (filled by readahead), one cache per
 * export so that one export's clients never see another's data, kept
 * coherent with every write to any export.
 */

#ifndef NBDKIT_RESHAPE_CACHE_H
#define NBDKIT_RESHAPE_CACHE_H

#include <stdbool.h>
#include <stdint.h>

struct cache;

/* A fill in progress: a write to its range meanwhile makes it stale,
 * and a stale fill is not kept (it may hold data from before the
 * write).  Lives on the filler's stack.
 */
struct cache_fill {
  uint64_t lo, hi;
  bool stale;
  struct cache_fill *next;
};

/* One export's cache; NULL with errno on failure. */
extern struct cache *cache_new (void);
extern void cache_free (struct cache *c);

/* Copy [offset, offset+count) to dst if cached whole; true on a hit. */
extern bool cache_read (struct cache *c, uint64_t offset, uint32_t count,
                        void *dst);

/* If a fill in progress covers [lo, hi), wait for it to end (then
 * cache_read may hit); true if there was one.
 */
extern bool cache_wait_fill (struct cache *c, uint64_t lo, uint64_t hi);

/* Before reading [lo, hi) from the plugin to keep it. */
extern void cache_fill_begin (struct cache *c, struct cache_fill *f,
                              uint64_t lo, uint64_t hi);
/* The same, unless a fill in progress covers [want_lo, want_hi) (then
 * false, and nothing is begun: wait for that one).
 */
extern bool cache_fill_begin_unless (struct cache *c, struct cache_fill *f,
                                     uint64_t lo, uint64_t hi,
                                     uint64_t want_lo, uint64_t want_hi);
/* After: keeps buf (a POOL_REQUEST buffer of len bytes at f->lo)
 * unless the fill went stale or failed (ok false) or the pool's cache
 * share has no room; returns whether it was kept.  A buffer not kept
 * still belongs to the caller.
 */
extern bool cache_fill_end (struct cache *c, struct cache_fill *f,
                            void *buf, uint32_t len, bool ok);

/* A write, zero or trim touched [lo, hi): no export's cache keeps it.
 * Called before the write is acknowledged.  (Every export's: export
 * names do not tell whether two exports share storage.)
 */
extern void cache_invalidate_all (uint64_t lo, uint64_t hi);

/* The pool's reclaim callback: the caches give back at least want
 * bytes if they hold that much, each its least recently used first.
 */
extern uint64_t cache_reclaim (uint64_t want);

#endif /* NBDKIT_RESHAPE_CACHE_H */
