/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * State shared by the connections of one export, found by its name,
 * so that what one export's clients do never touches another export.
 */

#ifndef NBDKIT_RESHAPE_EXPORT_H
#define NBDKIT_RESHAPE_EXPORT_H

struct cache;
struct merge;
struct tune;
struct writeback;

struct export {
  char *name;
  unsigned refs;              /* connections using it */
  struct cache *cache;        /* readahead data */
  struct merge *merge;        /* groups of small requests */
  struct writeback *wb;       /* staged writes */
  struct tune *tune;          /* what is learnt (outlives the export) */
  struct export *next;
};

/* The export named name, created at its first connection; NULL with
 * the error reported.  Each get is matched by one put.
 */
extern struct export *export_get (const char *name);
extern void export_put (struct export *exp);

#endif /* NBDKIT_RESHAPE_EXPORT_H */
