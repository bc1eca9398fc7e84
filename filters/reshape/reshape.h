/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Declarations shared by the mechanisms of the filter.  Each mechanism
 * lives in its own file:
 *
 *   config.c     parameters and the per-connection geometry
 *   walk.c       the one way a range is cut into plugin requests
 *   split.c      runs the pieces of a request against the plugin
 *   align.c      read-modify-write of partial minimum blocks
 *   rangelock.c  block-range locks that make read-modify-write safe
 *   export.c     state shared by the connections of one export
 *   pool.c       recycled, capped buffer pool
 *   workers.c    helper threads: the pieces of a request in parallel
 *   readahead.c  sequential detection and the readahead window
 *   cache.c      per-export read cache, kept coherent with writes
 *   merge.c      concurrent small requests merged into one
 *   writeback.c  opt-in staging of small writes into whole blocks
 *   sockbuf.c    SO_SNDBUF on the unix-socket client connections
 *   stats.c      counters and the statistics report
 *   reshape.c    wires the nbdkit callbacks to the above
 */

#ifndef NBDKIT_RESHAPE_H
#define NBDKIT_RESHAPE_H

#include <stdbool.h>
#include <time.h>
#include <stdint.h>

#include <nbdkit-filter.h>

#include "walk.h"
#include "rangelock.h"
#include "cache.h"
#include "pool.h"

/* Largest payload the nbdkit server accepts from a client. */
#define RESHAPE_CLIENT_MAX (64 * 1024 * 1024)

/* Debug flags: -D reshape.split=1 and so on. */
extern NBDKIT_DLL_PUBLIC int reshape_debug_split;
extern NBDKIT_DLL_PUBLIC int reshape_debug_rmw;
extern NBDKIT_DLL_PUBLIC int reshape_debug_pool;
extern NBDKIT_DLL_PUBLIC int reshape_debug_sockbuf;

/* config.c: parameters as given on the command line. */
struct reshape_config {
  uint32_t size;            /* reshape-size, 0 = pick per export */
  uint32_t min;             /* reshape-min, 0 = the plugin's minimum */
  uint32_t max;             /* reshape-max, 0 = the plugin's maximum */
  bool sndbuf_set;          /* reshape-sndbuf given */
  uint32_t sndbuf;          /* 0 = off */
  uint64_t pool;            /* reshape-pool: buffer memory cap */
  unsigned parallel;        /* reshape-parallel: fan-out per request */
  uint32_t readahead;       /* reshape-readahead: largest window, 0 = off */
  bool merge;               /* reshape-merge */
  bool writeback;           /* reshape-writeback */
  char *stats_file;         /* reshape-stats, absolute path or NULL */
};
extern struct reshape_config reshape_cfg;
extern bool reshape_parallel_ok;    /* final thread model is PARALLEL */

extern int reshape_config_key (const char *key, const char *value);
extern int reshape_config_complete (void);
extern void reshape_config_free (void);
extern int reshape_geometry (nbdkit_next *next, struct geometry *geo);
#define RESHAPE_CONFIG_HELP \
  "reshape-size=SIZE    Optimal request size sent to the plugin.\n" \
  "reshape-min=SIZE     Alignment the plugin needs.\n" \
  "reshape-max=SIZE     Largest request sent to the plugin.\n" \
  "reshape-pool=SIZE    Cap on the filter's buffer memory (default 64M).\n" \
  "reshape-parallel=N   Pieces of one request run at once (default 16).\n" \
  "reshape-readahead=SIZE|off  Largest readahead window (default 8M).\n" \
  "reshape-merge=BOOL   Merge concurrent small requests (default false).\n" \
  "reshape-writeback=BOOL  Stage small writes (default false).\n" \
  "reshape-sndbuf=SIZE|off  Send buffer of unix-socket client connections.\n" \
  "reshape-stats=FILE   Write the statistics report to FILE at exit."

/* merge.c: groups of concurrent small requests, per export. */
struct group;
struct merge {
  pthread_mutex_t lock;
  pthread_cond_t changed;
  struct group *groups;     /* filling or at the plugin */
  uint64_t launches;        /* groups sent so far */
};
extern void reshape_merge_init (struct merge *m);
extern void reshape_merge_destroy (struct merge *m);

/* writeback.c: staged small writes, per export. */
struct wb_block;
struct writeback {
  pthread_mutex_t lock;
  pthread_cond_t changed;
  struct wb_block *blocks;  /* newest first */
  unsigned conns;           /* connections open to the export */
};
extern void reshape_writeback_init (struct writeback *wb);
extern void reshape_writeback_destroy (struct writeback *wb);

/* export.c: state shared by every connection to one export. */
struct reshape_export {
  char *name;
  unsigned refs;
  struct cache cache;
  struct merge merge;
  struct writeback wb;
  struct reshape_export *next;
};
extern struct reshape_export *reshape_export_get (const char *name);
extern void reshape_export_put (struct reshape_export *exp);
extern uint64_t reshape_export_shrink_caches (uint64_t want);
extern void reshape_export_invalidate (uint64_t lo, uint64_t hi);


/* Block-range locks, one table for the process: exports with different
 * names may still share storage.
 */
extern struct rangelock reshape_locks;

/* readahead.c: per-connection sequential detection. */
struct readahead {
  pthread_mutex_t lock;
  uint64_t next;            /* where a sequential read would start */
  uint32_t window;          /* current window, 0 = not sequential */
  unsigned reading;         /* small reads of this connection in flight */
  unsigned alone;           /* reads in a row that came with no other */
  uint64_t latency;         /* ns, fastest direct read of this stream */
};

/* The per-connection handle. */
struct reshape_handle {
  struct reshape_export *exp;
  struct geometry geo;
  struct readahead ra;
  bool multi_conn;          /* the plugin allows multi-conn */
  uint64_t piece_ns[2];     /* mean ns per piece of the last split
                               read [0] and write, zero, trim [1] */
  bool sndbuf_pending;      /* default send buffer not raised yet */
};

/* Plugin calls are timed to tell whether the plugin has latency worth
 * hiding by readahead (readahead.c) or overlapping with parallel
 * pieces (split.c).  A call answered faster than this (memory, a file
 * in the page cache) has none: copies and thread wake-ups would cost
 * more than they save.
 */
#define RESHAPE_SLOW_NS (50 * 1000)

static inline uint64_t
reshape_now_ns (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * UINT64_C(1000000000) + ts.tv_nsec;
}

extern int reshape_writeback_pwrite (nbdkit_next *next,
                                     struct reshape_handle *h,
                                     const void *buf, uint32_t count,
                                     uint64_t offset, uint32_t flags,
                                     int *err);

/* Around a request on [lo, hi): begin writes back the staged blocks
 * there; those that fail stay staged, held by the claim until the
 * request is done.  Then end_read lays their bytes over what a read
 * got (ok: it succeeded), end_write copies what a write sent through
 * into them (src NULL: zeros), release just lets them go (trim, or
 * nothing to do).  c.err is the first write-back error, c.list NULL
 * if nothing staged is left there.
 */
struct writeback_claim {
  struct writeback *wb;
  struct wb_block *list;
  int err;
};
extern void reshape_writeback_begin (nbdkit_next *next,
                                     struct reshape_handle *h,
                                     uint64_t lo, uint64_t hi,
                                     struct writeback_claim *c);
extern void reshape_writeback_end_read (struct writeback_claim *c,
                                        void *buf, uint32_t count,
                                        uint64_t offset, bool ok);
extern void reshape_writeback_end_write (struct writeback_claim *c,
                                         const void *src, uint32_t count,
                                         uint64_t offset, bool ok);
extern void reshape_writeback_release (struct writeback_claim *c);
/* Is nothing staged in [lo, hi) any more, after writing back what is
 * not held by anybody?  Never waits (readahead: a window may be
 * filled only where the plugin has everything).
 */
extern bool reshape_writeback_clean (nbdkit_next *next,
                                     struct reshape_handle *h,
                                     uint64_t lo, uint64_t hi);
extern int reshape_writeback_flush (nbdkit_next *next,
                                    struct reshape_handle *h, int *err);
extern void reshape_writeback_finalize (nbdkit_next *next,
                                        struct reshape_handle *h);
extern void reshape_writeback_open (struct reshape_handle *h);
extern int reshape_merge_pread (nbdkit_next *next, struct reshape_handle *h,
                                void *buf, uint32_t count, uint64_t offset,
                                int *err);
extern int reshape_merge_pwrite (nbdkit_next *next,
                                 struct reshape_handle *h,
                                 const void *buf, uint32_t count,
                                 uint64_t offset, uint32_t flags, int *err);

extern void reshape_readahead_init (struct readahead *ra);
extern void reshape_readahead_destroy (struct readahead *ra);
extern int reshape_readahead_pread (nbdkit_next *next,
                                    struct reshape_handle *h,
                                    void *buf, uint32_t count,
                                    uint64_t offset, int *err);

/* split.c: client operations cut into plugin requests (client
 * statistics are counted by the callers, in reshape.c).
 */
extern int reshape_split_pread (nbdkit_next *next, struct reshape_handle *h,
                                void *buf, uint32_t count, uint64_t offset,
                                int *err);
extern int reshape_split_pwrite (nbdkit_next *next, struct reshape_handle *h,
                                 const void *buf, uint32_t count,
                                 uint64_t offset, uint32_t flags, int *err);
extern int reshape_split_zero (nbdkit_next *next, struct reshape_handle *h,
                               uint32_t count, uint64_t offset,
                               uint32_t flags, int *err);
extern int reshape_split_trim (nbdkit_next *next, struct reshape_handle *h,
                               uint32_t count, uint64_t offset,
                               uint32_t flags, int *err);
extern int reshape_split_cache (nbdkit_next *next, struct reshape_handle *h,
                                uint32_t count, uint64_t offset,
                                uint32_t flags, int *err);
extern int reshape_split_extents (nbdkit_next *next, struct reshape_handle *h,
                                  uint32_t count, uint64_t offset,
                                  uint32_t flags,
                                  struct nbdkit_extents *extents, int *err);

/* align.c: partial minimum blocks by read-modify-write.  data == NULL
 * writes zeros.
 */
extern int reshape_align_read (nbdkit_next *next, const struct piece *p,
                               void *dst, int *err);
extern int reshape_align_write (nbdkit_next *next, const struct piece *p,
                                const void *src, uint32_t flags, int *err);


/* workers.c: helper threads for parallel pieces and background work. */
extern int reshape_workers_start (unsigned n);
extern void reshape_workers_stop (void);
extern unsigned reshape_workers_count (void);
extern void reshape_workers_share (void (*fn) (void *), void *opaque,
                                   unsigned helpers);
extern bool reshape_workers_submit (void (*fn) (void *), void *opaque);

/* sockbuf.c */
extern void reshape_sockbuf_default (struct reshape_config *cfg);
extern void reshape_sockbuf_open (struct reshape_handle *h);
extern void reshape_sockbuf_reply (struct reshape_handle *h, uint32_t count);

/* stats.c */
enum reshape_op {
  OP_PREAD, OP_PWRITE, OP_ZERO, OP_TRIM, OP_CACHE, OP_EXTENTS, OP_FLUSH,
  OP_COUNT
};
enum reshape_counter {
  C_SPLITS,            /* client requests cut into more than one piece */
  C_PARALLEL_READS,    /* of those, reads run with helper threads */
  C_PARALLEL_WRITES,   /* and writes, zeroes, trims */
  C_RMW_READS,         /* partial blocks read through a bounce buffer */
  C_RMW_WRITES,        /* partial blocks written by read-modify-write */
  C_LOCK_WAITS,        /* range lock acquisitions that had to wait */
  C_FUA_FLUSHES,       /* flushes standing in for FUA on split writes */
  C_MERGES,            /* requests sent merged with others */
  C_RA_HITS,           /* small reads served from the cache */
  C_RA_MISSES,         /* sequential reads that filled a window */
  C_RA_FILLED,         /* bytes read ahead */
  C_RA_WINDOW,         /* largest readahead window used */
  C_WB_STAGED,         /* bytes of small writes staged */
  C_WB_WRITTEN,        /* staged bytes written back */
  C_POOL_ALLOCS,       /* buffers allocated by the pool */
  C_POOL_REUSES,       /* buffers handed out again from the pool */
  C_POOL_WAITS,        /* waits for a buffer at the cap */
  C_POOL_HIGH,         /* pool bytes high-water mark */
  C_SOCK_RAISED,       /* client sockets whose SO_SNDBUF was raised */
  C_SOCK_OBTAINED,     /* send buffer the kernel granted (bytes) */
  C_COUNTERS
};
extern void reshape_stats_client (enum reshape_op op, uint64_t bytes);
extern void reshape_stats_plugin (enum reshape_op op, uint64_t bytes);
extern void reshape_stats_add (enum reshape_counter c, uint64_t n);
extern void reshape_stats_max (enum reshape_counter c, uint64_t v);
extern void reshape_stats_report (const char *file);

#endif /* NBDKIT_RESHAPE_H */
