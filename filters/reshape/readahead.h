/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Adaptive readahead for clients that read sequentially, one small
 * read at a time.
 */

#ifndef NBDKIT_RESHAPE_READAHEAD_H
#define NBDKIT_RESHAPE_READAHEAD_H

#include <pthread.h>
#include <stdint.h>

#include "cache.h"
#include "split.h"
#include "stage.h"

/* One connection's sequential detection. */
struct readahead {
  pthread_mutex_t lock;
  uint64_t next;            /* where a sequential read would start */
  uint32_t window;          /* current window, 0 = not sequential */
  unsigned reading;         /* small reads of this connection in flight */
  unsigned alone;           /* reads in a row that came with no other */
  bool deep;                /* the stream had reads in flight together */
  uint64_t latency;         /* ns, fastest direct read of this stream */
  uint64_t ahead_lo;        /* the grains last fetched for the stream */
  uint64_t ahead_hi;        /* (reshape-size=auto), 0 = none */
};

extern void readahead_init (struct readahead *ra);
extern void readahead_destroy (struct readahead *ra);

/* A read served from the export's cache, or by filling a window into
 * it (read through split.c), or passed down (down->pread) when neither
 * pays.  0, or -1 with *err set.
 */
/* A fetch of the stream's next grains, due after a read served from
 * the cache (reshape-size=auto, a pipelining stream): begun in the
 * cache by readahead_pread, made by readahead_fetch_ahead once the
 * read has let go of what it holds (its write-back claim).
 */
struct ra_ahead {
  bool due;
  struct cache_fill f;
};

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
extern int readahead_cache (struct readahead *ra, struct cache *cache,
                            const struct io *io, const struct down *down,
                            uint32_t count, uint64_t offset);

#endif /* NBDKIT_RESHAPE_READAHEAD_H */
