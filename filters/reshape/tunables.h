/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * The filter's numbers, in one place.  The limits come from the NBD
 * protocol and from nbdkit: facts, not choices.  The heuristics are
 * choices: each says what it decides, and [where] it was measured
 * (docs/design.md, "Thresholds", has the same list with the reasons;
 * bench/results the runs).
 */

#ifndef NBDKIT_RESHAPE_TUNABLES_H
#define NBDKIT_RESHAPE_TUNABLES_H

#include <stdint.h>

/* ---- Limits ---- */

/* The largest request nbdkit's server accepts from a client. */
#define CLIENT_MAX (64 * 1024 * 1024)
/* The largest minimum block size NBD and nbdkit allow a plugin. */
#define BLOCK_MIN_MAX (64 * 1024)
/* NBD's smallest preferred block size; the largest nbdcopy takes. */
#define NBD_PREFERRED_MIN 512
#define NBD_PREFERRED_MAX (32 * 1024 * 1024)

/* ---- Parameters' defaults and bounds ---- */

/* The request size until something is learnt, and the preferred size
 * told for a plugin without latency [seeds' sweep of nbdcopy
 * --request-size over sparse-random; nbdcopy's own default].
 */
#define DEFAULT_SIZE (256 * 1024)
/* reshape-pool: 8 of the largest fills, 256 staged pages. */
#define DEFAULT_POOL (64 * 1024 * 1024)
/* reshape-parallel: nbdkit's threads per connection [bench big: 8
 * left the plugin's streams a third short].
 */
#define DEFAULT_PARALLEL 16
#define PARALLEL_MAX 64
/* reshape-readahead: five doublings from 256K [bench naive]. */
#define DEFAULT_READAHEAD (8 * 1024 * 1024)
/* reshape-sndbuf: where the send buffer is raised by default, and from
 * which reply size [bench/sndbuf.sh: 1.28x at 256K replies, 0.93x at
 * 32K].
 */
#if defined (__linux__) || defined (__APPLE__)
#define DEFAULT_SNDBUF (2 * 1024 * 1024)
#else
#define DEFAULT_SNDBUF 0
#endif
#define LARGE_REPLY (256 * 1024)

/* ---- Heuristics ---- */

/* A plugin call faster than this has no latency worth hiding: no
 * helper threads, grains for it [memory and the page cache
 * against the 1 ms model].
 */
#define PLUGIN_SLOW_NS (50 * 1000)

/* Streams (readahead.c): reads in a row that each came alone make a
 * client that waits for each read; how far out of order a pipelining
 * client's reads arrive, in reads [nbdcopy keeps 64 in flight]; reads
 * in a row near each other before a stream's reads are served from
 * grains [tests/unit-sim rand32: random reads 32 at a time land near
 * each other now and then].
 */
#define ALONE_RUN 4
#define REORDER 64
#define STREAK 4

/* The readahead budget (readahead.c): unasked bytes, at most 1/SHARE of
 * what all clients of the process read, plus BASE.
 */
#define BUDGET_SHARE 20
#define BUDGET_BASE (16 * 1024 * 1024)
/* The read cache tracks which bytes of a range clients read in at
 * most this many chunks (4K each up to 2M ranges): the budget's count
 * of unread bytes is exact to a chunk.  A read that fills in progress
 * keep making stale is tried FILL_TRIES times before it goes to the
 * plugin as it is.
 */
#define CACHE_CHUNKS 512
#define FILL_TRIES 3

/* The buffer pool (pool.c): of the cap, less one largest minimum
 * block kept for bounce buffers, 1/STAGING_SHARE stages writes and
 * the rest serves requests, the read cache taking at most
 * CACHE_SHARE_NUM/CACHE_SHARE_DEN of that; so no use starves another.
 */
#define STAGING_SHARE 4

/* At most this much staged by write-back, whatever reshape-pool: the
 * bytes acknowledged but not in the plugin, which a plugin refusing
 * writes leaves held until exit.  A few pages per writer are all
 * that combining needs.
 */
#define STAGING_MAX (64 * 1024 * 1024)
#define CACHE_SHARE_NUM 2
#define CACHE_SHARE_DEN 3

/* reshape-size=auto (auto.c; EXPORTS_MAX: reshape.c) [tests/unit-sim;
 * bench/results/tune]:
 *   AGE            the table forgets calls older than 2 AGE calls of
 *                  the export (a plugin that changes is followed)
 *   GUESS_CALLS    grains of GUESS_PREFERRED timed before the line
 *                  through their cost and the reads' is drawn [test-
 *                  tune: one cluster decoder, 16 reads in flight];
 *                  streams of reads smaller than half a
 *                  GUESS_PREFERRED get grains
 *   KNEE           a GUESS_PREFERRED grain costing less than this many
 *                  reads is kept whole (clusters, or latency that
 *                  dwarfs the transfer); requests whose calls take
 *                  this many times their fastest on average queue at
 *                  the plugin, and are not cut
 *   CUT_GAIN       a cut the model promises this much faster is made
 *   PIECE_MIN      the smallest piece a request is cut to, without a
 *                  stream's line
 *   EXPORTS_MAX    exports whose measurements are remembered
 */
#define AGE 32
#define GUESS_CALLS 4
#define KNEE 1.5
#define CUT_GAIN 1.25
#define PIECE_MIN (256 * 1024)
#define EXPORTS_MAX 64

/* Before anything is learnt, a plugin's preferred size above this is
 * told to clients and cut at (params.c) [the seeds: 4K, the common
 * sector and page].
 */
#define HINT_SIZE (4 * 1024)

/* ... at or below it, clients are told this while requests are cut at
 * DEFAULT_SIZE or where auto.c finds it pays [tests/unit-sim: every
 * nbdcopy cell within 1.02x of the best fixed size but serial20 4K
 * and lanes4, the seed's 1.34x to 1.01x; 1M: seed 1.64x; nbdcopy
 * aborts above 32M].
 */
#define GUESS_PREFERRED (2 * 1024 * 1024)

/* Write-back's pages fill with up to this many gaps (ranges.h): a
 * client keeps up to 64 requests in flight (QEMU, nbdcopy) and they
 * reach the filter in any order [bench deep: 1M pages of 4K writes 64
 * deep].
 */
#define RANGES_MAX 64

/* Write-back (writeback.c): tries per page when a connection closes,
 * one after the other (a plugin failing at random then loses nothing
 * in practice); then the export name's last connection tries every
 * twentieth of CLOSE_RETRY_NS until that has passed, and gives up what
 * is left (a plugin that recovers within it loses nothing; one that
 * fails for good delays that close, and the server's exit, by so
 * much).
 */
#define CLOSE_TRIES 8
#define CLOSE_RETRY_NS (5 * UINT64_C (1000000000))

#endif /* NBDKIT_RESHAPE_TUNABLES_H */
