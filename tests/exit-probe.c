/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Preloaded into nbdkit by test-wb-kept.sh: an exit handler registered
 * before main and a library destructor, each appending a line to
 * $RESHAPE_EXIT_PROBE, and a stdio stream left with unflushed output.
 * They show that the filter's failing exit status lets the rest of
 * the process finish its own exit.
 */

#include <config.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void
mark (const char *what)
{
  const char *file = getenv ("RESHAPE_EXIT_PROBE");
  int fd;

  if (file == NULL)
    return;
  fd = open (file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd >= 0) {
    if (write (fd, what, strlen (what)) == -1)
      abort ();
    close (fd);
  }
}

static void
at_exit (void)
{
  mark ("atexit\n");
}

static void __attribute__ ((constructor))
probe_start (void)
{
  const char *file = getenv ("RESHAPE_EXIT_PROBE");
  char name[4096];
  FILE *fp;

  atexit (at_exit);
  if (file && snprintf (name, sizeof name, "%s.stdio", file) < sizeof name &&
      (fp = fopen (name, "w")) != NULL)
    fputs ("stdio\n", fp);      /* flushed only by exit */
}

static void __attribute__ ((destructor))
probe_end (void)
{
  mark ("destructor\n");
}
