/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * A connection's stream of reads, and what serves it from the read
 * cache: windows for a client that waits for each read (window.c),
 * grains for one that keeps several in flight (grain.c).  See
 * readahead.c.
 */

#ifndef NBDKIT_RESHAPE_READAHEAD_H
#define NBDKIT_RESHAPE_READAHEAD_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "cache.h"
#include "grain.h"
#include "split.h"
#include "stage.h"
#include "window.h"

/* One connection's stream. */
struct readahead {
  pthread_mutex_t lock;
  uint64_t last;            /* where its last read started */
  uint64_t next;            /* where a read continuing it would start */
  unsigned in_flight;       /* its reads in flight */
  unsigned alone_run;       /* reads in a row that came with no other */
  bool pipelined;           /* it ever had reads in flight together */
  struct window window;
  struct grains grains;
};

extern void readahead_init (struct readahead *ra);
extern void readahead_destroy (struct readahead *ra);

/* A fetch of the stream's next run, due after a read served from the
 * cache: begun in the cache by readahead_pread, made by
 * readahead_fetch_ahead once the read has let go of what it holds (its
 * write-back claim).
 */
struct ra_ahead {
  bool due;
  struct cache_fill f;
};

/* A read served from the cache, or by a window or grains filling it,
 * or passed down (down->pread) when neither pays.  0, or -1 with *err
 * set.
 */
extern int readahead_pread (struct readahead *ra, struct cache *cache,
                            const struct io *io, const struct down *down,
                            void *buf, uint32_t count, uint64_t offset,
                            struct ra_ahead *ahead, int *err);
extern void readahead_fetch_ahead (struct readahead *ra, struct cache *cache,
                                   const struct io *io,
                                   const struct down *down,
                                   struct ra_ahead *ahead);

/* A client's cache request (NBD_CMD_CACHE, as nbdkit's scan and
 * readahead filters send ahead of their clients): its range read into
 * the cache, in windows, as far as the budget allows.  It is advice:
 * what is not read, or fails, costs the client nothing (always 0).
 */
extern int readahead_cache (struct cache *cache, const struct io *io,
                            const struct down *down, uint32_t count,
                            uint64_t offset);

#endif /* NBDKIT_RESHAPE_READAHEAD_H */
