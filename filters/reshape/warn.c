/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * nbdkit 1.32 gives filters nbdkit_error, which says "error:", and
 * nbdkit_debug, seen only with -v.  A warning goes where nbdkit's
 * errors go: stderr in the foreground, in nbdkit's form; syslog once
 * nbdkit is in the background (stderr is /dev/null then, and nbdkit
 * has opened syslog under its name).
 */

#include <config.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <syslog.h>
#include <unistd.h>
#include <sys/stat.h>

#include "warn.h"

void
reshape_warning (const char *fs, ...)
{
  const int saved = errno;              /* for %m */
  struct stat err, null;
  va_list args;

  va_start (args, fs);
  if (fstat (STDERR_FILENO, &err) == -1 ||
      (S_ISCHR (err.st_mode) && stat ("/dev/null", &null) == 0 &&
       err.st_rdev == null.st_rdev)) {
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
