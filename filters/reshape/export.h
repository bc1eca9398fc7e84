/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * State shared by the connections of one export, found by its name
 * and whether the client uses TLS (a plugin may serve TLS and plain
 * clients different data under one name: tls-fallback), so that what
 * one export's clients do never touches another export.
 */

#ifndef NBDKIT_RESHAPE_EXPORT_H
#define NBDKIT_RESHAPE_EXPORT_H

#include <stdbool.h>

struct cache;
struct cut;
struct tune;
struct writeback;

struct export {
  char *name;
  bool tls;
  unsigned refs;              /* connections using it */
  struct cache *cache;        /* readahead data (with multi-conn) */
  struct writeback *wb;       /* staged writes */
  struct tune *tune;          /* what is learnt (outlives the export) */
  struct cut *cut;            /* cut-or-whole choices */
  struct export *next;
};

/* The export named name, for clients with TLS or without, created at
 * its first connection; NULL with the error reported.  Each get is
 * matched by one put.
 */
extern struct export *export_get (const char *name, bool tls);
extern void export_put (struct export *exp);

#endif /* NBDKIT_RESHAPE_EXPORT_H */
