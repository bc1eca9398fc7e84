/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * The filter's numbers, in one place: the limits of NBD and nbdkit
 * (facts), then the heuristics (choices), each with what it decides.
 * docs/design.md's Thresholds table says where each was measured.
 */

#ifndef NBDKIT_RESHAPE_TUNABLES_H
#define NBDKIT_RESHAPE_TUNABLES_H

#include <stdint.h>

/* The largest request nbdkit accepts; the largest minimum block. */
#define CLIENT_MAX (64 * 1024 * 1024)
#define BLOCK_MIN_MAX (64 * 1024)
/* The preferred sizes told: NBD's smallest, nbdcopy's largest. */
#define NBD_PREFERRED_MIN 512
#define NBD_PREFERRED_MAX (32 * 1024 * 1024)

/* Parameters' defaults and bounds. */
#define DEFAULT_SIZE (256 * 1024)
#define DEFAULT_POOL (64 * 1024 * 1024)
#define DEFAULT_PARALLEL 16
#define PARALLEL_MAX 64
#define DEFAULT_READAHEAD (8 * 1024 * 1024)
/* The send buffer raised by default, from replies of LARGE_REPLY. */
#if defined (__linux__) || defined (__APPLE__)
#define DEFAULT_SNDBUF (2 * 1024 * 1024)
#else
#define DEFAULT_SNDBUF 0
#endif
#define LARGE_REPLY (256 * 1024)

/* A plugin call faster than this has no latency worth hiding. */
#define PLUGIN_SLOW_NS (50 * 1000)

/* Streams: reads in a row that each came alone make a waiting client;
 * how far out of order a pipelining client's reads arrive, in reads;
 * reads in a row near each other before grains serve a stream.
 */
#define ALONE_RUN 4
#define REORDER 64
#define STREAK 4

/* The read-ahead budget: unasked bytes, at most 1/BUDGET_SHARE of
 * what clients read plus BUDGET_BASE; a range's read bytes are counted
 * in CACHE_CHUNKS chunks.
 */
#define BUDGET_SHARE 20
#define BUDGET_BASE (16 * 1024 * 1024)
#define CACHE_CHUNKS 512

/* The pool: of the cap less a bounce reserve, 1/STAGING_SHARE (at most
 * STAGING_MAX: the bytes acknowledged but not in the plugin) stages
 * writes; of the rest the cache keeps CACHE_SHARE_NUM/DEN.
 */
#define STAGING_SHARE 4
#define STAGING_MAX (64 * 1024 * 1024)
#define CACHE_SHARE_NUM 2
#define CACHE_SHARE_DEN 3

/* reshape-size=auto:
 *   AGE           the table forgets calls older than 2 AGE calls
 *   GUESS_CALLS   grains of GUESS_PREFERRED timed before the line
 *   KNEE          a GUESS_PREFERRED grain under KNEE reads stays whole;
 *                 calls whose mean is KNEE times their fastest queue
 *   CUT_GAIN      a cut the model promises this much faster is made
 *   PIECE_MIN     the smallest piece without a stream's line
 *   EXPORTS_MAX   export names whose learning is remembered
 */
#define AGE 32
#define GUESS_CALLS 4
#define KNEE 1.5
#define CUT_GAIN 1.25
#define PIECE_MIN (256 * 1024)
#define EXPORTS_MAX 64

/* Before anything is learnt: a plugin's preferred size above HINT_SIZE
 * is told and cut at; else clients are told GUESS_PREFERRED.
 */
#define HINT_SIZE (4 * 1024)
#define GUESS_PREFERRED (2 * 1024 * 1024)

/* reshape-stats: the report is rewritten this often while nbdkit runs. */
#define REPORT_NS (5 * UINT64_C (1000000000))

/* Write-back: gaps a staging page may have (clients keep up to 64
 * writes in flight); tries per page at a close, and how long the
 * export's last close retries what the plugin refuses.
 */
#define RANGES_MAX 64
#define CLOSE_TRIES 8
#define CLOSE_RETRY_NS (5 * UINT64_C (1000000000))

#endif /* NBDKIT_RESHAPE_TUNABLES_H */
