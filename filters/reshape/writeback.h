/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Write-back combining (reshape-writeback=true): small writes staged
 * into whole pages, with the semantics of a disk's volatile write
 * cache.
 */

#ifndef NBDKIT_RESHAPE_WRITEBACK_H
#define NBDKIT_RESHAPE_WRITEBACK_H

#include <stdbool.h>
#include <stdint.h>

#include "split.h"

struct writeback;               /* one export's staged pages */
struct wb_page;

/* The plugin's thread model: whether one connection's context may
 * serve another's request (write-back across export names).
 */
extern void writeback_thread_model (int model);

/* One export's staging, kept by its export (reshape.c finds it by
 * name); NULL with errno on failure.  Dropped when no connection uses
 * it (its last close left nothing staged).
 */
extern struct writeback *writeback_new (const char *name);
extern void writeback_drop (struct writeback *wb);

/* One connection's part: its identity as the owner of the pages only
 * its flush covers (shared false: the plugin does not allow
 * multi-conn; every request of the export still sees them), and
 * whether it may stage at all (not over a plugin that cannot flush:
 * its clients could never ask for durability).  A connection that may
 * not stage still passes its writes through here, so that they are
 * ordered with what others staged.
 */
struct wb_conn {
  struct writeback *wb;
  bool shared;
  bool may_stage;
  struct io door;               /* for other exports' writes (borrow) */
  unsigned borrowers;           /* requests using door, under wb's lock */
  struct wb_conn *next_open;    /* the export's open connections */
};
/* door: the connection's way to the plugin, valid until close, for
 * other exports' writes; NULL if it cannot write (read-only).
 */
extern void writeback_open (struct wb_conn *wc, struct writeback *wb,
                            bool shared, bool may_stage,
                            const struct io *door);
/* The connection is closing: its pages become the export's, and
 * what it can see is written back, retrying.  What the plugin still
 * refuses stays staged for the export's other connections; the last
 * one's close retries for CLOSE_RETRY_NS, then gives it up (one error
 * line, counted in the statistics).
 */
extern void writeback_close (struct wb_conn *wc, const struct io *io);

/* A write: staged when small, else (and when staging is full) passed
 * down after the staged pages it overlaps.  0, or -1 with *err set.
 */
extern int writeback_pwrite (struct wb_conn *wc, const struct io *io,
                             const void *buf, uint32_t count,
                             uint64_t offset, uint32_t flags, int *err);

/* Before a write (of any kind) to [lo, hi): what other export names
 * staged there is written back first.  0, or -1 with *err set when
 * that fails (the write must then fail).
 */
extern int writeback_order (struct wb_conn *wc, uint64_t lo, uint64_t hi,
                            int *err);

/* Flush: everything this connection can see that was staged before
 * now, into the plugin.  0, or -1 with *err set while the plugin
 * refuses some of it (it stays staged).
 */
extern int writeback_flush (struct wb_conn *wc, const struct io *io,
                            int *err);

/* Around any other request on [lo, hi): begin writes back the staged
 * pages there; those the plugin refuses stay staged, held by the
 * claim until the request is done.  Then end_read lays their bytes
 * over what a read got (ok: the read succeeded), end_write copies
 * what was sent through into them (src NULL: zeros), release just
 * lets them go (a trim, or a request that only looked).  c->held says
 * whether any are held, c->err is the plugin's first error.
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

/* Is nothing staged in [lo, hi) any more, after writing back what no
 * request holds?  Never waits (the caller may hold pages there).
 */
extern bool writeback_clean (struct wb_conn *wc, const struct io *io,
                             uint64_t lo, uint64_t hi);

#endif /* NBDKIT_RESHAPE_WRITEBACK_H */
