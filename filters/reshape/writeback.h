/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Write-back combining (reshape-writeback=true): small writes staged
 * into whole blocks, with the semantics of a disk's volatile write
 * cache.
 */

#ifndef NBDKIT_RESHAPE_WRITEBACK_H
#define NBDKIT_RESHAPE_WRITEBACK_H

#include <stdbool.h>
#include <stdint.h>

#include "split.h"
#include "stage.h"

struct writeback;               /* one export's staged blocks */
struct wb_block;

/* One export's staging; NULL with errno on failure. */
extern struct writeback *writeback_new (void);
/* Gives up (with an error naming the bytes) whatever is still staged. */
extern void writeback_free (struct writeback *wb);

/* One connection's part: its identity as the owner of the blocks only
 * it can see (shared false: the plugin does not allow multi-conn), and
 * whether it may stage at all (not over a plugin that cannot flush:
 * its clients could never ask for durability).  A connection that may
 * not stage still passes its writes through here, so that they are
 * ordered with what others staged.
 */
struct wb_conn {
  struct writeback *wb;
  bool shared;
  bool may_stage;
};
extern void writeback_open (struct wb_conn *wc, struct writeback *wb,
                            bool shared, bool may_stage);
/* The connection is closing: write back what it can see, retrying;
 * then give up what nobody else can see.
 */
extern void writeback_close (struct wb_conn *wc, const struct io *io);

/* A write: staged when small, else (and when staging is full) passed
 * down after the staged blocks it overlaps.  0, or -1 with *err set.
 */
extern int writeback_pwrite (struct wb_conn *wc, const struct io *io,
                             const struct down *down, const void *buf,
                             uint32_t count, uint64_t offset,
                             uint32_t flags, int *err);

/* Flush: everything this connection can see that was staged before
 * now, into the plugin.  0, or -1 with *err set while the plugin
 * refuses some of it (it stays staged).
 */
extern int writeback_flush (struct wb_conn *wc, const struct io *io,
                            int *err);

/* Around any other request on [lo, hi): begin writes back the staged
 * blocks there; those the plugin refuses stay staged, held by the
 * claim until the request is done.  Then end_read lays their bytes
 * over what a read got (ok: the read succeeded), end_write copies
 * what was sent through into them (src NULL: zeros), release just
 * lets them go (a trim, or a request that only looked).  c->held says
 * whether any are held, c->err is the plugin's first error.
 */
struct wb_claim {
  struct writeback *wb;
  struct wb_block *list;
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
 * request holds?  Never waits (the caller may hold blocks there).
 */
extern bool writeback_clean (struct wb_conn *wc, const struct io *io,
                             uint64_t lo, uint64_t hi);

#endif /* NBDKIT_RESHAPE_WRITEBACK_H */
