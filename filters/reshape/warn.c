/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * nbdkit 1.32 gives filters nbdkit_error, which prefixes "error:", and
 * nbdkit_debug, seen only with -v: neither suits what the user should
 * see but that stops nothing.  A warning goes where nbdkit's errors go
 * by default: stderr in the foreground, in nbdkit's form; syslog once
 * nbdkit is in the background (it points stderr at /dev/null then, and
 * has opened syslog under its own name).  With --log=syslog in the
 * foreground a warning still goes to stderr: a filter cannot tell.
 */

#include <config.h>

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <syslog.h>
#include <unistd.h>
#include <sys/stat.h>

#include "warn.h"

/* Is stderr nowhere (closed, or /dev/null)? */
static bool
stderr_lost (void)
{
  struct stat err, null;

  if (fstat (STDERR_FILENO, &err) == -1)
    return true;
  return S_ISCHR (err.st_mode) && stat ("/dev/null", &null) == 0 &&
    err.st_rdev == null.st_rdev;
}

void
reshape_warning (const char *fs, ...)
{
  const int saved = errno;              /* for %m, whatever stat did */
  va_list args;

  va_start (args, fs);
  if (stderr_lost ()) {
    errno = saved;
    vsyslog (LOG_WARNING, fs, args);
  }
  else {
    flockfile (stderr);
    fputs ("nbdkit: warning: ", stderr);
    errno = saved;
    vfprintf (stderr, fs, args);
    fputc ('\n', stderr);
    funlockfile (stderr);
  }
  va_end (args);
  errno = saved;
}
