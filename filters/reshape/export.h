/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * The registry of exports.  What an export's connections share is
 * found by its name and whether the client uses TLS (a plugin may
 * serve TLS and plain clients different data under one name:
 * tls-fallback), so that what one export's clients do never touches
 * another export; what is learnt of the plugin is the name's, and is
 * remembered after its connections close, so that a client that
 * reconnects keeps it.
 */

#ifndef NBDKIT_RESHAPE_EXPORT_H
#define NBDKIT_RESHAPE_EXPORT_H

#include <stdbool.h>

#include "stats.h"
#include "auto.h"

struct cache;
struct writeback;

struct export {
  unsigned refs;              /* connections using it (registry lock) */
  struct cache *cache;        /* readahead data (with multi-conn) */
  struct writeback *wb;       /* staged writes: kept while any */
  struct auto_export *autoexp;   /* the name's measurements: outlive the above */
};

/* The export named name, for clients with TLS or without, its state
 * made at its first connection and freed at its last close (staged
 * writes once the plugin has them); NULL with the error reported.
 * Each get is matched by one put.  At most a few dozen names' learning
 * is remembered: beyond that the least recently used name no
 * connection holds and with nothing staged is forgotten.
 */
extern struct export *export_get (const char *name, bool tls);
extern void export_put (struct export *exp);

/* fn on the learning of every export name remembered, most recently
 * used first (an auto_walk).
 */
extern void export_each (auto_visit *fn, void *opaque);

/* At unload: every name no connection holds forgotten. */
extern void export_free_all (void);

/* The report's part on what was learnt (auto.c's), over every name. */
extern const struct stats_learning export_stats;

#endif /* NBDKIT_RESHAPE_EXPORT_H */
