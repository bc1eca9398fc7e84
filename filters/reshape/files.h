/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Replacing the file the filter writes (the statistics report) whole:
 * see files.c.
 */

#ifndef NBDKIT_RESHAPE_FILES_H
#define NBDKIT_RESHAPE_FILES_H

#include <stdio.h>

/* A new temporary file beside path, open for writing; its name in
 * *tmp (to free).  NULL with errno set if it cannot be made.
 */
extern FILE *replace_open (const char *path, char **tmp);

/* Write out and close fp, then rename tmp over path, and free tmp.
 * 0, or -1 with errno set and tmp removed.
 */
extern int replace_commit (FILE *fp, char *tmp, const char *path);

/* The file path names once symlinks are followed, even if it does not
 * exist yet (a link to a file not yet made); NULL with errno set.
 */
extern char *resolve_links (const char *path);

/* Whether path's directory can be written (a file made, renamed):
 * 0, or -1 with errno set.
 */
extern int dir_writable (const char *path);

#endif /* NBDKIT_RESHAPE_FILES_H */
