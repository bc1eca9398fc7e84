/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Parameters, parsed and checked, and the geometry each connection
 * settles from them and from what its plugin advertises.
 */

#ifndef NBDKIT_RESHAPE_PARAMS_H
#define NBDKIT_RESHAPE_PARAMS_H

#include <stdbool.h>
#include <stdint.h>

#include <nbdkit-filter.h>

#include "tunables.h"
#include "walk.h"

/* As given on the command line: written while nbdkit configures the
 * filter (parallel_ok at get_ready), read-only once clients connect.
 */
struct params {
  uint32_t size;            /* reshape-size, 0: auto */
  uint32_t min;             /* reshape-min, 0: the plugin's */
  uint32_t maxdata;         /* reshape-maxdata (or -max), 0: the plugin's */
  uint32_t maxlen;          /* reshape-maxlen (or -max), 0: ditto */
  bool sndbuf_set;          /* reshape-sndbuf given ... */
  uint32_t sndbuf;          /* ... its size, 0: off */
  uint64_t pool;            /* reshape-pool */
  unsigned parallel;        /* reshape-parallel */
  uint32_t readahead;       /* reshape-readahead, 0: off */
  bool writeback;           /* reshape-writeback */
  char *stats_file;         /* reshape-stats, an absolute path, or NULL */
  bool parallel_ok;         /* the stack's thread model is parallel */
};
extern struct params reshape_cfg;

/* 1 if the key was ours, 0 if not, -1 on error. */
extern int params_key (const char *key, const char *value);
/* Another layer's parameter: a file it names is remembered, so that
 * reshape-stats does not replace it.
 */
extern void params_other (const char *key, const char *value);
/* The parameters checked together; -1 on error. */
extern int params_complete (void);
extern void params_set_thread_model (int thread_model);
extern void params_free (void);

/* A connection's geometry, in two steps.  params_limits settles the
 * export size, min and the caps from the parameters and what the
 * plugin advertises (its preferred size in *ppref); -1 with the error
 * reported if no request fits.  params_sizes then settles the size cut
 * at and the size told.
 */
extern int params_limits (nbdkit_next *next, struct geometry *geo,
                          uint32_t *ppref);
extern void params_sizes (struct geometry *geo, uint32_t ppref,
                          uint32_t *preferred);

/* --help: every default given (params.c checks them). */
#if DEFAULT_SNDBUF
#define PARAMS_HELP_SNDBUF "(default: 2M)"
#else
#define PARAMS_HELP_SNDBUF "(default: off)"
#endif
#define PARAMS_HELP \
  "reshape-size=auto|<SIZE>      " \
    "Request size, learnt or SIZE (default: auto).\n" \
  "reshape-min=<SIZE>            " \
    "Alignment the plugin needs (default: the plugin's).\n" \
  "reshape-max=<SIZE>            " \
    "Sets both caps below (default: the plugin's).\n" \
  "reshape-maxdata=<SIZE>        " \
    "Largest read or write (default: the plugin's).\n" \
  "reshape-maxlen=<SIZE>         " \
    "Largest zero/trim/cache/extents (default: ditto).\n" \
  "reshape-readahead=<SIZE>|off  " \
    "Largest readahead fill (default: 8M).\n" \
  "reshape-writeback=<BOOL>      " \
    "Stage small writes (default: false).\n" \
  "reshape-parallel=<N>          " \
    "Pieces of one request at once (default: 16).\n" \
  "reshape-pool=<SIZE>           " \
    "Cap on the filter's buffers (default: 64M).\n" \
  "reshape-sndbuf=<SIZE>|off     " \
    "Unix socket clients' send buffer " PARAMS_HELP_SNDBUF ".\n" \
  "reshape-stats=<FILE>          " \
    "Statistics report at exit (default: none)."

#endif /* NBDKIT_RESHAPE_PARAMS_H */
