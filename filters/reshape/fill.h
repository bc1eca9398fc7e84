/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Filling the read cache from the plugin for a client's read (see
 * fill.c): what windows and grains have in common.
 */

#ifndef NBDKIT_RESHAPE_FILL_H
#define NBDKIT_RESHAPE_FILL_H

#include <stdbool.h>
#include <stdint.h>

#include "cache.h"
#include "split.h"
#include "stage.h"

/* A client's read: [offset, offset+count) into buf (NULL: nobody
 * waits, the fill is a fetch ahead).
 */
struct read_req {
  void *buf;
  uint32_t count;
  uint64_t offset;
};

/* What became of a fill. */
enum fill_result {
  FILL_KEPT,                /* in the cache */
  FILL_LOST,                /* not kept, or not made (no memory, staged
                               writes there, over budget) */
  FILL_FAILED,              /* the plugin failed it */
};

/* The largest fill: reshape-readahead, within what the pool can lend
 * one request, in whole minimum blocks.
 */
extern uint32_t fill_cap (const struct geometry *geo);

/* The read as it is, straight to the stage below (0 for nobody's). */
extern int fill_direct (const struct down *down, const struct read_req *rq,
                        int *err);

/* Read [f->lo, f->hi), a fill begun in the cache, into it, then serve
 * rq from it.  If the fill is lost or fails, rq goes to the plugin
 * alone: bytes the client did not ask for may be what failed.  *took
 * (if not NULL): the plugin read's time, 0 if it was not made or
 * failed.  Returns rq's result (0, or -1 with *err set).
 */
extern int fill_read (struct cache *cache, const struct io *io,
                      const struct down *down, struct cache_fill *f,
                      const struct read_req *rq, uint64_t *took,
                      enum fill_result *result, int *err);

/* [lo, hi) begun in the cache (within the budget: else rq goes
 * alone, FILL_LOST) and read for rq.
 */
extern int fill_range (struct cache *cache, const struct io *io,
                       const struct down *down, uint64_t lo, uint64_t hi,
                       const struct read_req *rq, enum fill_result *result,
                       int *err);

/* If a fill in progress holds rq, wait for it and serve rq from the
 * cache; true if served.  held: the cache was seen to hold rq a
 * moment ago, look again even if nothing was waited for.
 */
extern bool fill_wait (struct cache *cache, bool held,
                       const struct read_req *rq);

/* A cache request's range read into the cache in pieces of chunk (0:
 * nothing), those the cache does not hold yet, as far as the budget
 * allows (advice: what is not read costs nothing).
 */
extern void fill_cache_request (struct cache *cache, const struct io *io,
                                const struct down *down, uint64_t chunk,
                                uint32_t count, uint64_t offset);

#endif /* NBDKIT_RESHAPE_FILL_H */
