/* nbdkit-reshape-filter: what the unit tests need of nbdkit.
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * The modules under test call nbdkit's logging; the unit tests run
 * without nbdkit, so errors go to stderr and debug messages nowhere.
 */

#include <config.h>

#include <stdarg.h>
#include <stdio.h>

#include <nbdkit-filter.h>

void
nbdkit_error (const char *fs, ...)
{
  va_list args;

  va_start (args, fs);
  vfprintf (stderr, fs, args);
  va_end (args);
  fputc ('\n', stderr);
}

void
nbdkit_debug (const char *fs, ...)
{
}
