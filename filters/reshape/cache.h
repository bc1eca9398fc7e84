/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Read data kept for later reads (filled by readahead), one cache per
 * export so that one export's clients never see another's data.
 */

#ifndef NBDKIT_RESHAPE_CACHE_H
#define NBDKIT_RESHAPE_CACHE_H

#include <stdbool.h>
#include <stdint.h>
#include <pthread.h>

struct cache_entry;

/* A fill in progress: a write to its range meanwhile makes it stale,
 * and a stale fill is not kept (it may hold data from before the write).
 */
struct cache_fill {
  uint64_t lo, hi;
  bool stale;
  struct cache_fill *next;
};

struct cache {
  pthread_mutex_t lock;
  struct cache_entry *entries;      /* most recently used first */
  struct cache_fill *fills;
};

extern void cache_init (struct cache *c);
extern void cache_destroy (struct cache *c);

/* Copy [offset, offset+count) to dst if cached whole; true on a hit. */
extern bool cache_read (struct cache *c, uint64_t offset, uint32_t count,
                        void *dst);

/* Before reading [lo, hi) from the plugin to keep it. */
extern void cache_fill_begin (struct cache *c, struct cache_fill *f,
                              uint64_t lo, uint64_t hi);
/* After: keeps buf (a pool buffer of len bytes at f->lo) unless the
 * fill went stale or there is no room; returns whether it was kept.
 * A buffer not kept still belongs to the caller.
 */
extern bool cache_fill_end (struct cache *c, struct cache_fill *f,
                            void *buf, uint32_t len, bool ok);

/* A write, zero or trim touched [lo, hi): forget it.  Called before
 * the write is acknowledged.
 */
extern void cache_invalidate (struct cache *c, uint64_t lo, uint64_t hi);

/* Could any cache of any export hold data? */
extern bool cache_anything (void);

/* Give at least want bytes back to the pool (UINT64_MAX: all), the
 * least recently used first; returns bytes freed.
 */
extern uint64_t cache_shrink (struct cache *c, uint64_t want);

#endif /* NBDKIT_RESHAPE_CACHE_H */
