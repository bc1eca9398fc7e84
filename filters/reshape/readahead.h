/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Read-ahead: each connection's stream of reads, served from runs of
 * grains kept in a read cache, within a budget of bytes no client
 * asked for.  See readahead.c.
 */

#ifndef NBDKIT_RESHAPE_READAHEAD_H
#define NBDKIT_RESHAPE_READAHEAD_H

#include <stdbool.h>
#include <stdint.h>

#include "split.h"

/* One cache: an export's, shared by its connections, or one
 * connection's (reshape.c decides).  Its data lives in readahead.c's
 * one list; this is what the list's ranges are keyed by, and the
 * cache's record of failed fills.  Under readahead.c's lock.
 */
struct readahead_cache {
  unsigned failed;              /* fills failed in a row */
  unsigned misses;              /* fills asked for since */
  bool failing;                 /* a fill ever failed */
};

/* One connection's stream.  Under readahead.c's lock, but for the
 * two fields updated atomically.
 */
struct readahead_stream {
  uint64_t last;            /* where its last read started */
  uint64_t next;            /* where a read continuing it would start */
  unsigned in_flight;       /* its reads in flight (atomic) */
  unsigned alone_run;       /* reads in a row that came with no other */
  unsigned streak;          /* reads in a row near each other */
  bool pipelined;           /* it had reads in flight together */
  uint64_t latency;         /* its fastest direct read, ns (atomic) */
  uint64_t run_lo, run_hi;  /* its last run of grains; equal: none */
};

extern void readahead_stream_init (struct readahead_stream *s);
/* The cache's last user is gone: what it holds is dropped. */
extern void readahead_cache_drop (struct readahead_cache *c);

/* readahead_pread did not serve the read: it goes down as it is. */
#define READAHEAD_PASS 1

/* Serve a read from the cache, or by a fill of grains that holds it,
 * or below (split_pread) when neither pays.  0, or -1 with *err set,
 * or READAHEAD_PASS.  *ahead is a fill of the stream's next run begun
 * for a read served from the cache: readahead_fetch_ahead makes it
 * once the read has let go of what it holds (its write-back claim).
 */
struct readahead_range;
extern int readahead_pread (struct readahead_cache *c,
                            struct readahead_stream *s,
                            const struct io *io, void *buf, uint32_t count,
                            uint64_t offset, struct readahead_range **ahead,
                            int *err);
extern void readahead_fetch_ahead (struct readahead_stream *s,
                                   const struct io *io,
                                   struct readahead_range *ahead);

/* A client's cache request (NBD_CMD_CACHE): its range read into the
 * cache as far as the budget allows.  Advice: what fails costs the
 * client nothing.
 */
extern void readahead_prefetch (struct readahead_cache *c,
                                const struct io *io, uint32_t count,
                                uint64_t offset);

/* A write, zero or trim touched [lo, hi): no cache keeps it (every
 * export's: names do not tell whether they share storage).  Called
 * before the request is acknowledged.
 */
extern void readahead_invalidate (uint64_t lo, uint64_t hi);

/* The pool's reclaim callback: gives back at least want bytes if the
 * caches hold that much, least recently used first.
 */
extern uint64_t readahead_reclaim (uint64_t want);

#endif /* NBDKIT_RESHAPE_READAHEAD_H */
