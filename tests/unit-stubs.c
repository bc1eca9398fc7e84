/* nbdkit-reshape-filter: what the unit tests need of nbdkit.
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * The modules under test call nbdkit's logging; the unit tests run
 * without nbdkit, so errors go to stderr and debug messages nowhere.
 * What else the filter calls of nbdkit, no unit test uses.
 */

#include <config.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

char *
nbdkit_absolute_path (const char *path)
{
  return strdup (path);
}

int64_t
nbdkit_peer_pid (void)
{
  return -1;
}

struct nbdkit_extents *
nbdkit_extents_new (uint64_t start, uint64_t end)
{
  return NULL;
}

void
nbdkit_extents_free (struct nbdkit_extents *e)
{
}

size_t
nbdkit_extents_count (const struct nbdkit_extents *e)
{
  return 0;
}

struct nbdkit_extent
nbdkit_get_extent (const struct nbdkit_extents *e, size_t i)
{
  abort ();
}

int
nbdkit_add_extent (struct nbdkit_extents *e, uint64_t offset,
                   uint64_t length, uint32_t type)
{
  return -1;
}
