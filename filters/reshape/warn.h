/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 */

#ifndef NBDKIT_RESHAPE_WARN_H
#define NBDKIT_RESHAPE_WARN_H

/* "nbdkit: warning: " and the message (printf's format, with %m), not
 * read as an error.
 */
extern void reshape_warning (const char *fs, ...)
  __attribute__ ((format (printf, 1, 2)));

#endif /* NBDKIT_RESHAPE_WARN_H */
