/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * The exit status after acknowledged writes were lost.  nbdkit returns
 * success from main once it has served, whatever a filter reports, so
 * the status can only change after main returns, and only by ending
 * the process.  The filter does that last of all: from the flush of a
 * stdio stream of its own, which exit makes after every atexit handler
 * and every library destructor has run (glibc's _IO_cleanup, musl's
 * __stdio_exit).  So nbdkit, the plugin, the other filters and the
 * libraries finish their own exit first, and all other streams are
 * flushed before the process ends.  The filter stays mapped for it
 * (nbdkit unloads it before main returns).  An exit handler that
 * itself flushes every stream ends the process there instead.
 */

#include <config.h>

#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "exitcode.h"

static FILE *last_word;
static bool ending;

static void
end_now (void)
{
  ending = true;
  fflush (NULL);
  _exit (EXIT_FAILURE);
}

#ifdef HAVE_FOPENCOOKIE
static ssize_t
end_at_flush (void *cookie, const char *buf, size_t len)
{
  if (!ending)                  /* not the flush just below */
    end_now ();
  return len;
}

/* One byte left in a fully buffered stream whose flush ends the
 * process: false if that cannot be set up.
 */
static bool
leave_last_word (void)
{
  cookie_io_functions_t io = { .write = end_at_flush };

  last_word = fopencookie (NULL, "w", io);
  return last_word &&
    setvbuf (last_word, NULL, _IOFBF, BUFSIZ) == 0 &&
    fputc ('\n', last_word) != EOF;
}
#else
static bool
leave_last_word (void)
{
  return atexit (end_now) == 0;  /* after handlers registered later */
}
#endif

void
exitcode_fail (void)
{
  Dl_info info;

  if (dladdr ((void *) exitcode_fail, &info) == 0 ||
      dlopen (info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE) == NULL ||
      !leave_last_word ())
    end_now ();                 /* the status matters more than tidying */
}
