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

/* A client's read of [offset, offset+count) into dst: true if the
 * cache holds it whole (with wait: once a fill in progress that holds
 * it has ended).  On a miss ask (if not NULL) is registered for the
 * read until a fill for it begins or cache_ask_end.
 */
extern bool cache_lookup (struct cache *c, uint64_t offset, uint32_t count,
                          void *dst, struct cache_ask *ask, bool wait);
extern void cache_ask_end (struct cache *c, struct cache_ask *ask);

/* Begin f, a fill of what [lo, hi) holds around the read [read_lo,
 * read_hi) (empty: nobody's, a fetch ahead) that the cache neither
 * holds nor fills, in whole blocks of align: a fill never reads again
 * what the cache has.  What neither the read (and the expect bytes
 * after it that its stream is about to ask for) nor the reads asking
 * cover is charged to the budget.  1: begun; 0: a fill in progress
 * holds the read (look it up again); CACHE_NOTHING: nothing to fill
 * beyond the read; CACHE_REFUSED: the budget, or fills that keep
 * failing, refuse it.
 */
#define CACHE_NOTHING (-1)
#define CACHE_REFUSED (-2)
extern int cache_fill_begin (struct cache *c, struct cache_fill *f,
                             uint64_t lo, uint64_t hi, uint32_t align,
                             uint64_t read_lo, uint64_t read_hi,
                             uint64_t expect, struct cache_ask *ask);
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
