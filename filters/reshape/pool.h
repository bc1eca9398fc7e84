/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * The buffer pool: every buffer of the filter, recycled, its total
 * capped by reshape-pool, shared out between its uses.  Only bounce
 * buffers wait for memory; the other uses take what is there or do
 * without (pool.c says why that cannot deadlock).
 */

#ifndef NBDKIT_RESHAPE_POOL_H
#define NBDKIT_RESHAPE_POOL_H

#include <stdbool.h>
#include <stdint.h>

enum pool_use {
  POOL_BOUNCE,      /* one partial block, at most BLOCK_MIN_MAX: waits */
  POOL_REQUEST,     /* read-ahead fills */
  POOL_CACHE,       /* read data kept (a fill's buffer moves here) */
  POOL_STAGING,     /* write-back pages */
  POOL_USES
};

extern void pool_init (uint64_t cap);
extern void pool_free_all (void);

/* Who frees at least want bytes of POOL_CACHE when requests are short
 * of memory (called with no pool lock held): how much it freed.
 */
extern void pool_set_reclaim (uint64_t (*reclaim) (uint64_t want));

/* The largest buffer of this use there can ever be (0: none). */
extern uint32_t pool_largest (enum pool_use use);

/* A page-aligned buffer of at least len bytes: NULL with errno when
 * the use's share is spent (but POOL_BOUNCE, which waits) or malloc
 * fails.  POOL_CACHE buffers come only from pool_keep.
 */
extern void *pool_get (enum pool_use use, uint32_t len);
extern void pool_put (enum pool_use use, void *buf, uint32_t len);

/* A POOL_REQUEST buffer of len bytes becomes a POOL_CACHE one; false
 * if the cache's share has no room.
 */
extern bool pool_keep (uint32_t len);

/* What the pool holds now, in bytes (for tests/unit-pool.c). */
struct pool_usage {
  uint64_t cap, total, idle;
  uint64_t used[POOL_USES];
  uint64_t share[POOL_USES];
};
extern void pool_usage (struct pool_usage *u);

#endif /* NBDKIT_RESHAPE_POOL_H */
