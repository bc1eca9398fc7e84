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

enum stats_counter {
  C_SPLITS,            /* client requests cut into more than one piece */
  C_PARALLEL_READS,    /* of those, reads run with helper threads */
  C_PARALLEL_WRITES,   /* and writes, zeroes, trims */
  C_RMW_READS,         /* partial blocks read through a bounce buffer */
  C_RMW_WRITES,        /* partial blocks written by read-modify-write */
  C_PAD_BYTES,         /* bytes of partial blocks no client asked for */
  C_LOCK_WAITS,        /* range lock acquisitions that had to wait */
  C_FUA_FLUSHES,       /* flushes standing in for FUA on split writes */
  C_RA_HITS,           /* small reads served from the cache */
  C_RA_MISSES,         /* fills of runs and grains for streams */
  C_RA_FILLED,         /* bytes read ahead */
  C_RA_AHEAD,          /* of them, made ahead of a pipelined stream */
  C_RA_LOST,           /* fills not kept or not made */
  C_RA_UNREAD,         /* bytes read ahead that no client read */
  C_RA_REFUSED,        /* fills the readahead budget refused */
  C_RA_CACHED,         /* bytes read into the cache for cache requests */
  C_WB_STAGED,         /* bytes of small writes staged */
  C_WB_WRITTEN,        /* staged bytes written back */
  C_WB_FAILED,         /* write-backs the plugin failed (kept staged) */
  C_WB_LOST,           /* staged bytes given up at a last close */
  C_POOL_ALLOCS,       /* buffers allocated by the pool */
  C_POOL_REUSES,       /* buffers handed out again from the pool */
  C_POOL_WAITS,        /* bounce buffers that waited at the cap */
  C_POOL_HIGH,         /* pool bytes high-water mark */
  C_SOCK_RAISED,       /* client sockets whose SO_SNDBUF was raised */
  C_SOCK_OBTAINED,     /* send buffer the kernel granted (bytes) */
  C_COUNTERS
};

/* The server's start, for the report's elapsed times. */
extern void stats_start (void);
extern void stats_client (enum stats_op op, uint64_t bytes);
/* The bytes clients have read, all exports' (the readahead budget's
 * measure).
 */
extern uint64_t stats_client_read (void);
extern void stats_plugin (enum stats_op op, uint64_t bytes);
extern void stats_add (enum stats_counter c, uint64_t n);
extern void stats_max (enum stats_counter c, uint64_t v);

/* The learning's part of the report (reshape-size=auto): a line per
 * export for the summary, its tables for the text, and a JSON array
 * of the exports.
 */
struct stats_learning {
  void (*summary) (FILE *fp);
  void (*tables) (FILE *fp);
  void (*json) (FILE *fp);
};

/* At start-up: -1 with the error reported if the report could not
 * be written to file at exit (a symlink, not a regular file, an
 * unwritable directory).  Nothing is written.
 */
extern int stats_check (const char *file);

/* Write the report to file if given (JSON if its name ends in .json),
 * and as debug lines (-v).  fixed_size is reshape-size when given, and
 * then learning is NULL.
 */
extern void stats_report (const char *file, uint32_t fixed_size,
                          const struct stats_learning *learning);

/* Helpers for the learning's part: "4K", "1.5M"; a JSON string
 * (false: bytes that are not UTF-8 were written as U+FFFD), and its
 * bytes in hex; an export name quoted for the text report.
 */
extern const char *stats_human (uint64_t v, char *buf, size_t len);
extern bool stats_json_string (FILE *fp, const char *s);
extern void stats_json_hex (FILE *fp, const char *s);
extern void stats_text_name (FILE *fp, const char *s);

/* The same quoted name, for log lines (malloc'd; NULL on failure). */
extern char *stats_log_name (const char *s);

#endif /* NBDKIT_RESHAPE_STATS_H */
