/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Warnings: see warn.c.
 */

#ifndef NBDKIT_RESHAPE_WARN_H
#define NBDKIT_RESHAPE_WARN_H

/* "nbdkit: warning: " and the message (printf's format, with %m). */
extern void reshape_warning (const char *fs, ...)
  __attribute__ ((format (printf, 1, 2)));

#endif /* NBDKIT_RESHAPE_WARN_H */
