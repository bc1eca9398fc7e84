/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Grains, for a stream of small reads that keeps several in flight
 * (see grain.c).
 */

#ifndef NBDKIT_RESHAPE_GRAIN_H
#define NBDKIT_RESHAPE_GRAIN_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "cache.h"
#include "fill.h"
#include "split.h"
#include "stage.h"
#include "tune.h"

/* One connection's stream of grains: its last run, [lo, hi). */
struct grains {
  pthread_mutex_t lock;
  uint64_t lo, hi;          /* hi == lo: no run */
};

extern void grains_init (struct grains *g);
extern void grains_destroy (struct grains *g);
/* The stream broke off: its next run starts afresh. */
extern void grains_reset (struct grains *g);

/* How a read in the stream that missed the cache is served, as
 * tune.c says (tune_stream_fetch), if the block is whole minimum
 * blocks that the pool can lend and the plugin take in one call; else
 * tf->size is 0: the read goes as it is.
 */
extern void grains_plan (const struct io *io, uint32_t count,
                         unsigned in_flight, struct tune_fetch *tf);

/* Serve rq by tf->size: one block alone (the learning's, timed if a
 * sample), or the stream's runs of grains.
 */
extern int grains_read (struct grains *g, struct cache *cache,
                        const struct io *io, const struct down *down,
                        const struct tune_fetch *tf,
                        const struct read_req *rq, int *err);

/* rq was served from the cache half way or more through the stream's
 * last run, in a stream that keeps reads in flight: the next run is
 * due (begun in f; true), fetched by grains_fetch_ahead once the read
 * has let go of what it holds.
 */
extern bool grains_ahead_due (struct grains *g, struct cache *cache,
                              const struct io *io, const struct read_req *rq,
                              struct cache_fill *f);
extern void grains_fetch_ahead (struct grains *g, struct cache *cache,
                                const struct io *io, const struct down *down,
                                struct cache_fill *f);

#endif /* NBDKIT_RESHAPE_GRAIN_H */
