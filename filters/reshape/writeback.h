/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Write-back (reshape-writeback=true): small writes staged into whole
 * pages, with the semantics of a disk's volatile write cache.
 */

#ifndef NBDKIT_RESHAPE_WRITEBACK_H
#define NBDKIT_RESHAPE_WRITEBACK_H

#include <stdbool.h>
#include <stdint.h>

#include "split.h"

struct writeback;               /* one export's staged pages */
struct wb_page;

/* The plugin's thread model: whether one connection's context may
 * serve another export name's request.
 */
extern void writeback_thread_model (int model);

/* One export's staging, made at its first connection, dropped at its
 * last close (which leaves nothing staged).  NULL with errno.
 */
extern struct writeback *writeback_new (const char *name);
extern void writeback_drop (struct writeback *wb);

/* One connection: whether it may stage (not over a plugin that cannot
 * flush), and its way to the plugin for other names' writes (door:
 * NULL if read-only), valid until its close.  A connection that may
 * not stage still passes its writes through here, ordered with what
 * others staged.
 */
struct wb_conn {
  struct writeback *wb;
  bool may_stage;
  struct io door;
  unsigned borrowers;           /* requests using door (wb's lock) */
  struct wb_conn *next_open;
};
extern void writeback_open (struct wb_conn *wc, struct writeback *wb,
                            bool may_stage, const struct io *door);
/* The connection closes: what is staged is written back; the export's
 * last connection retries for CLOSE_RETRY_NS, then gives up what the
 * plugin refuses, in one error line.
 */
extern void writeback_close (struct wb_conn *wc, const struct io *io);

/* A write: staged when small, else passed down after the staged pages
 * it overlaps.  0, or -1 with *err set.
 */
extern int writeback_pwrite (struct wb_conn *wc, const struct io *io,
                             const void *buf, uint32_t count,
                             uint64_t offset, uint32_t flags, int *err);
/* Before any write to [lo, hi): what other export names staged there
 * is written back first.  0, or -1 with *err set (the write fails).
 */
extern int writeback_order (struct wb_conn *wc, uint64_t lo, uint64_t hi,
                            int *err);
/* Everything the export has staged, into the plugin.  0, or -1 with
 * *err set while the plugin refuses some (it stays staged).
 */
extern int writeback_flush (struct wb_conn *wc, const struct io *io,
                            int *err);

/* Around any other request on [lo, hi): begin writes back the staged
 * pages there; those the plugin refuses stay held by the claim until
 * the request ends: end_read lays their bytes over what was read (ok:
 * the read succeeded), end_write copies into them what went through
 * (src NULL: zeros), release lets them go.  held: some are held; err:
 * the plugin's first error.
 */
struct wb_claim {
  struct writeback *wb;
  struct wb_page *list;
  bool held;
  int err;
};
extern void writeback_begin (struct wb_conn *wc, const struct io *io,
                             uint64_t lo, uint64_t hi, struct wb_claim *c);
extern void writeback_end_read (struct wb_claim *c, void *buf,
                                uint32_t count, uint64_t offset, bool ok);
extern void writeback_end_write (struct wb_claim *c, const void *src,
                                 uint32_t count, uint64_t offset, bool ok);
extern void writeback_release (struct wb_claim *c);

/* Is nothing staged in [lo, hi) after writing back what no request
 * holds?  Never waits (the caller may hold pages there).
 */
extern bool writeback_clean (struct wb_conn *wc, const struct io *io,
                             uint64_t lo, uint64_t hi);

#endif /* NBDKIT_RESHAPE_WRITEBACK_H */
