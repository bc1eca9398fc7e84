/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * A file is replaced by writing a temporary beside it and renaming it
 * over the old one: a reader sees the old file or the new one, never
 * half of either, and nothing is truncated until the new one is
 * whole.  The temporary is made with O_EXCL, so a symlink planted in
 * its place is never followed, and rename replaces a name, never what
 * a symlink points to.
 */

#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "files.h"

FILE *
replace_open (const char *path, char **tmp)
{
  FILE *fp;
  int fd, err;

  if (asprintf (tmp, "%s.tmp.%ld", path, (long) getpid ()) == -1) {
    *tmp = NULL;                        /* undefined after a failure */
    return NULL;
  }
  /* Left behind by a process of the same pid that died: stale. */
  unlink (*tmp);
  fd = open (*tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd == -1 || (fp = fdopen (fd, "w")) == NULL) {
    err = errno;
    if (fd >= 0) {
      close (fd);
      unlink (*tmp);
    }
    free (*tmp);
    *tmp = NULL;
    errno = err;
    return NULL;
  }
  return fp;
}

int
replace_commit (FILE *fp, char *tmp, const char *path)
{
  bool ok = fflush (fp) == 0 && fsync (fileno (fp)) == 0;
  int err = errno;

  if (fclose (fp) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (ok && rename (tmp, path) == -1) {
    ok = false;
    err = errno;
  }
  if (!ok)
    unlink (tmp);
  free (tmp);
  errno = err;
  return ok ? 0 : -1;
}

/* Each link in turn, as the kernel would, up to its own limit; a
 * relative link is taken from its own directory.
 */
char *
resolve_links (const char *path)
{
  char *cur = strdup (path), *next, *dir;
  char target[PATH_MAX];
  struct stat st;
  ssize_t n;
  int hops;

  for (hops = 0; cur != NULL; hops++) {
    if (lstat (cur, &st) == -1 || !S_ISLNK (st.st_mode))
      return cur;                       /* the file, or a name to make */
    if (hops == 40 ||
        (n = readlink (cur, target, sizeof target - 1)) == -1) {
      if (hops == 40)
        errno = ELOOP;
      free (cur);
      return NULL;
    }
    target[n] = '\0';
    dir = strdup (cur);
    if (dir == NULL ||
        (target[0] == '/' ? (next = strdup (target)) == NULL
         : asprintf (&next, "%s/%s", dirname (dir), target) == -1))
      next = NULL;
    free (dir);
    free (cur);
    cur = next;
  }
  return NULL;
}

int
dir_writable (const char *path)
{
  char *copy = strdup (path);
  int r;

  if (copy == NULL)
    return -1;
  r = access (dirname (copy), W_OK | X_OK);
  free (copy);
  return r;
}
