/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Merging of concurrent small requests (reshape-merge=true), per
 * export.
 */

#ifndef NBDKIT_RESHAPE_MERGE_H
#define NBDKIT_RESHAPE_MERGE_H

#include <stdint.h>

#include "split.h"

struct merge;

/* One export's groups; NULL with errno on failure. */
extern struct merge *merge_new (void);
extern void merge_free (struct merge *m);

/* A read or write that may be merged with concurrent ones of the same
 * conn (NULL: of any connection, when the plugin allows multi-conn),
 * then sent through split.c.  0, or -1 with *err set.
 */
extern int merge_pread (struct merge *m, const struct io *io, void *conn,
                        void *buf, uint32_t count, uint64_t offset,
                        int *err);
extern int merge_pwrite (struct merge *m, const struct io *io, void *conn,
                         const void *buf, uint32_t count, uint64_t offset,
                         uint32_t flags, int *err);

#endif /* NBDKIT_RESHAPE_MERGE_H */
