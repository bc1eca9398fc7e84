/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Read data kept for later reads (filled by readahead), kept coherent
 * with every write to any export.  A cache serves one export's
 * connections (or one connection: reshape.c decides), so that one
 * export's clients never see another's data.  Each entry remembers
 * which of its bytes a client has read, for the readahead budget.
 */

#ifndef NBDKIT_RESHAPE_CACHE_H
#define NBDKIT_RESHAPE_CACHE_H

#include <stdbool.h>
#include <stdint.h>

struct cache;

/* A fill in progress: a write to its range meanwhile makes it stale,
 * and a stale fill is not kept (it may hold data from before the
 * write).  [ask_lo, ask_hi) is the read that made it (empty: nobody's,
 * a fetch ahead); what no read asks for is charged to the budget while
 * it is filled.  Lives on the filler's stack.
 */
struct cache_fill {
  uint64_t lo, hi;
  uint64_t ask_lo, ask_hi;
  uint64_t expect;          /* set by the filler before it begins: the
                               bytes after its read that the reader's
                               stream has asked for in flight, about to
                               arrive (not charged either) */
  uint64_t charged;
  bool stale;
  struct cache_fill *next;
};

/* A client's read that missed the cache, from the miss until it is
 * served or goes to the plugin on its own: a fill begun meanwhile over
 * its range charges the budget nothing for those bytes (the read is
 * about to take them, as a pipelining client's reads in flight do).
 * Lives on the reader's stack.
 */
struct cache_ask {
  uint64_t lo, hi;
  bool linked;
  struct cache_ask *next;
};

/* A cache; NULL with errno on failure. */
extern struct cache *cache_new (void);
extern void cache_free (struct cache *c);

/* Copy [offset, offset+count) to dst if cached whole; true on a hit. */
extern bool cache_read (struct cache *c, uint64_t offset, uint32_t count,
                        void *dst);

/* The same, and on a miss ask (if not NULL) is registered for the
 * read until cache_ask_end (which a hit needs not).
 */
extern bool cache_read_or_ask (struct cache *c, uint64_t offset,
                               uint32_t count, void *dst,
                               struct cache_ask *ask);
extern void cache_ask_end (struct cache *c, struct cache_ask *ask);

/* Does the cache hold [lo, hi) whole, or is a fill of it in progress? */
extern bool cache_holds (struct cache *c, uint64_t lo, uint64_t hi);

/* Narrow [*lo, *hi), around the read [read_lo, read_hi), to the gap
 * the cache neither holds nor is filling: a fill never reads again
 * what the cache has.
 */
extern void cache_gap (struct cache *c, uint64_t read_lo, uint64_t read_hi,
                       uint64_t *lo, uint64_t *hi);

/* If a fill in progress covers [lo, hi), wait for it to end (then
 * cache_read may hit); true if there was one.
 */
extern bool cache_wait_fill (struct cache *c, uint64_t lo, uint64_t hi);

/* Before reading [lo, hi) from the plugin to keep it, for the read
 * [read_lo, read_hi) (empty: nobody's, a fetch ahead): what neither it
 * nor the reads registered as asking cover is charged.  False
 * (nothing begun) if that exceeds the budget.
 */
extern bool cache_fill_begin (struct cache *c, struct cache_fill *f,
                              uint64_t lo, uint64_t hi,
                              uint64_t read_lo, uint64_t read_hi);
/* The same for the read [read_lo, read_hi), unless a fill in progress
 * covers it: 1 begun, 0 (nothing begun: wait for that one), -1 over
 * budget.
 */
extern int cache_fill_begin_unless (struct cache *c, struct cache_fill *f,
                                    uint64_t lo, uint64_t hi,
                                    uint64_t read_lo, uint64_t read_hi);
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
