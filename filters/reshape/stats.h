/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Statistics: what clients asked for beside what the plugin was sent,
 * and counters of each mechanism.  Relaxed atomics: no lock on the
 * data path.
 */

#ifndef NBDKIT_RESHAPE_STATS_H
#define NBDKIT_RESHAPE_STATS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

enum stats_op {
  OP_PREAD, OP_PWRITE, OP_ZERO, OP_TRIM, OP_CACHE, OP_EXTENTS, OP_FLUSH,
  OP_COUNT
};

/* Each counter: its name, its label in the text report, its key in
 * the JSON, and whether it counts bytes.
 */
#define STATS_COUNTERS(C)                                                \
  C (SPLITS, "requests split", "requests_split", 0)                      \
  C (PARALLEL_READS, "split reads run in parallel",                      \
     "split_reads_parallel", 0)                                          \
  C (PARALLEL_WRITES, "split writes run in parallel",                    \
     "split_writes_parallel", 0)                                         \
  C (RMW_READS, "partial blocks read", "partial_blocks_read", 0)         \
  C (RMW_WRITES, "read-modify-writes", "read_modify_writes", 0)          \
  C (PAD_BYTES, "partial block padding read", "padding_bytes", 1)        \
  C (LOCK_WAITS, "range lock waits", "range_lock_waits", 0)              \
  C (FUA_FLUSHES, "flushes standing in for FUA", "fua_flushes", 0)       \
  C (RA_HITS, "readahead hits", "readahead_hits", 0)                     \
  C (RA_MISSES, "readahead fills", "readahead_fills", 0)                 \
  C (RA_FILLED, "read ahead", "readahead_bytes", 1)                      \
  C (RA_AHEAD, "readahead fills made ahead", "readahead_fills_ahead", 0) \
  C (RA_LOST, "readahead fills not kept", "readahead_fills_lost", 0)     \
  C (RA_UNREAD, "read ahead, never read", "readahead_unread_bytes", 1)   \
  C (RA_REFUSED, "readahead fills over budget",                          \
     "readahead_fills_refused", 0)                                       \
  C (RA_CACHED, "cached for cache requests", "cached_bytes", 1)          \
  C (WB_STAGED, "staged (write-back)", "staged_bytes", 1)                \
  C (WB_WRITTEN, "staged, written back", "written_back_bytes", 1)        \
  C (WB_FAILED, "write-backs failed (kept staged)",                      \
     "write_backs_failed", 0)                                            \
  C (WB_LOST, "staged, lost at a last close", "staged_lost_bytes", 1)    \
  C (POOL_ALLOCS, "pool buffers allocated", "pool_allocs", 0)            \
  C (POOL_REUSES, "pool buffers reused", "pool_reuses", 0)               \
  C (POOL_WAITS, "pool waits at the cap", "pool_waits", 0)               \
  C (POOL_HIGH, "pool high-water", "pool_high_bytes", 1)                 \
  C (SOCK_RAISED, "client sockets raised", "sockets_raised", 0)          \
  C (SOCK_OBTAINED, "socket send buffer obtained",                       \
     "socket_sndbuf_bytes", 1)
#define STATS_ENUM(name, label, key, bytes) C_##name,
enum stats_counter { STATS_COUNTERS (STATS_ENUM) C_COUNTERS };

/* The server's start, for the report's elapsed times. */
extern void stats_start (void);
extern void stats_client (enum stats_op op, uint64_t bytes);
/* What clients have read, all exports' (the read-ahead budget's base). */
extern uint64_t stats_client_read (void);
extern void stats_plugin (enum stats_op op, uint64_t bytes);
extern void stats_add (enum stats_counter c, uint64_t n);
extern void stats_max (enum stats_counter c, uint64_t v);

/* The learning's part of the report (reshape-size=auto): a line per
 * export in the summary, their tables, a JSON array.
 */
enum stats_part { STATS_SUMMARY, STATS_TABLES, STATS_JSON };
typedef void stats_learning (FILE *fp, enum stats_part part);

/* At start-up: -1 with the error reported if the report could not be
 * written to file (a symlink, not a regular file, an unwritable
 * directory).  Nothing is written.
 */
extern int stats_check (const char *file);

/* Write the report to file if given, replaced whole (JSON if its name
 * ends in .json), and at exit (final) as debug lines too (-v).
 * fixed_size is reshape-size when given, and then learning is NULL.
 */
extern void stats_report (const char *file, uint32_t fixed_size,
                          stats_learning *learning, bool final);

/* The same, rewritten every REPORT_NS while the server runs (after
 * nbdkit forks; stopped at cleanup): -1 with the error reported.
 */
extern int stats_live_start (const char *file, uint32_t fixed_size,
                             stats_learning *learning);
extern void stats_live_stop (void);

/* For the learning's part: "4K", "1.5M"; a JSON string, each byte
 * that is not printable ASCII as \u00XX (valid JSON for any bytes:
 * decoded as Latin-1 they are the bytes again); a name quoted for the
 * text report, the same bytes as \xNN, so that none adds a line.
 */
extern const char *stats_human (uint64_t v, char *buf, size_t len);
extern void stats_json_string (FILE *fp, const char *s);
extern void stats_text_name (FILE *fp, const char *s);
/* The same quoted name, for log lines (malloc'd; NULL on failure). */
extern char *stats_log_name (const char *s);

#endif /* NBDKIT_RESHAPE_STATS_H */
