/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * A connection's stream of reads, and how it is served from the read
 * cache: runs of grains filling it.  See stream.c.
 */

#ifndef NBDKIT_RESHAPE_STREAM_H
#define NBDKIT_RESHAPE_STREAM_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "cache.h"
#include "io.h"

/* One connection's stream. */
struct stream {
  pthread_mutex_t lock;     /* all below */
  uint64_t last;            /* where its last read started */
  uint64_t next;            /* where a read continuing it would start */
  unsigned in_flight;       /* its reads in flight */
  unsigned alone_run;       /* reads in a row that came with no other */
  unsigned streak;          /* reads in a row near each other, up to
                               STREAK */
  bool pipelined;           /* it ever had reads in flight together */
  uint64_t latency;         /* ns, the stream's fastest direct read */
  uint64_t run_lo, run_hi;  /* its last run of grains; equal: none */
};

extern void stream_init (struct stream *s);
extern void stream_destroy (struct stream *s);

/* A fetch of the stream's next run of grains, due after a read served
 * from the cache: begun in the cache by stream_pread, made by
 * stream_fetch_ahead once the read has let go of what it holds (its
 * write-back claim).
 */
struct stream_ahead {
  bool due;
  struct cache_fill f;
};

/* stream_pread did not serve the read: it is not a stream read (a
 * request of the optimal size or larger, with nothing to learn), and
 * goes down as it is.
 */
#define STREAM_PASS 1

/* Serve a read from the stream: from the cache, by grains filling it, or below (io->pread_below) when neither pays.  0, or -1
 * with *err set, or STREAM_PASS.
 */
extern int stream_pread (struct stream *s, struct cache *cache,
                         const struct io *io, void *buf, uint32_t count,
                         uint64_t offset, struct stream_ahead *ahead,
                         int *err);
extern void stream_fetch_ahead (struct stream *s, struct cache *cache,
                                const struct io *io,
                                struct stream_ahead *ahead);

/* A client's cache request (NBD_CMD_CACHE, as nbdkit's scan and
 * readahead filters send ahead of their clients): its range read into
 * the cache, in fills of reshape-readahead, as far as the budget allows.  It is advice:
 * what is not read, or fails, costs the client nothing.
 */
extern void stream_prefetch (struct cache *cache, const struct io *io,
                          uint32_t count, uint64_t offset);

#endif /* NBDKIT_RESHAPE_STREAM_H */
