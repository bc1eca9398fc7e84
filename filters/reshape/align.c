/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Partial minimum blocks.  The plugin only takes whole blocks, so the
 * unaligned head or tail of a request goes through a bounce block from
 * the pool: read it whole, then copy out (reads) or patch and write it
 * back whole (writes).  Callers of reshape_align_write hold the block's
 * range lock exclusively (see split.c), so no other write to the block
 * can slip in between the read and the write back.
 */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include <nbdkit-filter.h>

#include "reshape.h"

/* Read the whole block of p into a pool buffer. */
static void *
read_block (nbdkit_next *next, const struct piece *p, int *err)
{
  void *blk = pool_get (POOL_BOUNCE, p->blk_count);

  if (blk == NULL) {
    *err = errno;
    nbdkit_error ("reshape: bounce buffer: %m");
    return NULL;
  }
  reshape_stats_plugin (OP_PREAD, p->blk_count);
  if (next->pread (next, blk, p->blk_count, p->blk_offset, 0, err) == -1) {
    pool_put (POOL_BOUNCE, blk, p->blk_count);
    return NULL;
  }
  return blk;
}

int
reshape_align_read (nbdkit_next *next, const struct piece *p,
                    void *dst, int *err)
{
  char *blk = read_block (next, p, err);

  if (blk == NULL)
    return -1;
  memcpy (dst, blk + (p->offset - p->blk_offset), p->count);
  pool_put (POOL_BOUNCE, blk, p->blk_count);
  reshape_stats_add (C_RMW_READS, 1);
  return 0;
}

int
reshape_align_write (nbdkit_next *next, const struct piece *p,
                     const void *src, uint32_t flags, int *err)
{
  char *blk = read_block (next, p, err);
  char *at;
  int r;

  if (blk == NULL)
    return -1;
  at = blk + (p->offset - p->blk_offset);
  if (src)
    memcpy (at, src, p->count);
  else
    memset (at, 0, p->count);
  if (reshape_debug_rmw)
    nbdkit_debug ("reshape: rmw block %" PRIu64 "+%" PRIu32
                  " for %" PRIu64 "+%" PRIu32,
                  p->blk_offset, p->blk_count, p->offset, p->count);
  reshape_stats_plugin (OP_PWRITE, p->blk_count);
  r = next->pwrite (next, blk, p->blk_count, p->blk_offset, flags, err);
  pool_put (POOL_BOUNCE, blk, p->blk_count);
  if (r == 0)
    reshape_stats_add (C_RMW_WRITES, 1);
  return r;
}
