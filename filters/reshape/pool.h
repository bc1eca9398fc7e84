/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * The buffer pool: every buffer of the filter, recycled, its total
 * capped by reshape-pool, shared out between its uses.  Only bounce
 * buffers are ever waited for; the other uses take memory when it is
 * there and do without when it is not (see pool.c for why that cannot
 * deadlock).
 */

#ifndef NBDKIT_RESHAPE_POOL_H
#define NBDKIT_RESHAPE_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "tunables.h"

enum pool_use {
  POOL_BOUNCE,      /* one partial block (read-modify-write): may wait */
  POOL_REQUEST,     /* readahead windows and grains being filled */
  POOL_CACHE,       /* read data kept (a filled window moves here) */
  POOL_STAGING,     /* write-back pages */
  POOL_USES
};

/* Every bounce buffer fits in BLOCK_MIN_MAX (tunables.h): the largest
 * block a plugin may demand whole.
 */

extern void pool_init (uint64_t cap);
extern void pool_free_all (void);

/* Who gives memory back when requests are short of it: a function
 * that frees at least want bytes of POOL_CACHE if it can, returning
 * how much it freed.  Called without any pool lock held.
 */
extern void pool_set_reclaim (uint64_t (*reclaim) (uint64_t want));

/* The largest single buffer of this use that can ever be had (0: the
 * use gets nothing from a pool this small).  Callers size windows,
 * staging pages by it.
 */
extern uint32_t pool_largest (enum pool_use use);

/* A page-aligned buffer of at least len bytes.  POOL_BOUNCE waits for
 * memory (len <= BLOCK_MIN_MAX); every other use returns NULL at
 * once when its share is spent.  NULL also on allocation failure, with
 * errno set.  POOL_CACHE buffers come only from pool_keep.
 */
extern void *pool_get (enum pool_use use, uint32_t len);
extern void pool_put (enum pool_use use, void *buf, uint32_t len);

/* A POOL_REQUEST buffer of len bytes (a filled window) becomes a
 * POOL_CACHE one; false if the cache's share has no room for it.
 */
extern bool pool_keep (uint32_t len);

/* What the pool holds now, in bytes (the unit tests check it). */
struct pool_usage {
  uint64_t cap, total, idle;
  uint64_t used[POOL_USES];
  uint64_t share[POOL_USES];
};
extern void pool_usage (struct pool_usage *u);

#endif /* NBDKIT_RESHAPE_POOL_H */
