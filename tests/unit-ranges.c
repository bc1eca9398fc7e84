/* nbdkit-reshape-filter: unit test of ranges.c (write-back's staged
 * byte ranges).
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Random additions to a set, against a bitmap: the set stays sorted,
 * disjoint and never touching, holds exactly the bytes added, and an
 * addition refused for want of ranges changes nothing.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ranges.h"

#define LEN 1024

static void
check (const struct ranges *s, const unsigned char *model, unsigned seed)
{
  unsigned char got[LEN] = { 0 };
  unsigned i;

  if (s->nr > RANGES_MAX)
    goto bad;
  for (i = 0; i < s->nr; i++) {
    if (s->r[i].lo >= s->r[i].hi || s->r[i].hi > LEN)
      goto bad;
    if (i > 0 && s->r[i - 1].hi >= s->r[i].lo)    /* touching is one */
      goto bad;
    memset (got + s->r[i].lo, 1, s->r[i].hi - s->r[i].lo);
  }
  if (memcmp (got, model, LEN) == 0)
    return;
 bad:
  fprintf (stderr, "unit-ranges: seed %u: set broken:", seed);
  for (i = 0; i < s->nr; i++)
    fprintf (stderr, " [%u,%u)", s->r[i].lo, s->r[i].hi);
  fprintf (stderr, "\n");
  exit (EXIT_FAILURE);
}

int
main (int argc, char *argv[])
{
  unsigned seed = argc > 1 ? atoi (argv[1]) : 1, round, refused = 0;

  printf ("unit-ranges: seed %u\n", seed);
  srand (seed);
  for (round = 0; round < 20000; round++) {
    struct ranges s = { .nr = 0 };
    unsigned char model[LEN] = { 0 };
    unsigned n = 1 + rand () % (4 * RANGES_MAX);
    const unsigned longest = rand () % 2 ? 3 : 24;

    while (n--) {
      uint32_t lo = rand () % LEN, hi = lo + 1 + rand () % longest;
      struct ranges before = s;
      if (hi > LEN)
        hi = LEN;
      if (ranges_add (&s, lo, hi))
        memset (model + lo, 1, hi - lo);
      else {
        refused++;
        if (memcmp (&before, &s, sizeof s) != 0) {
          fprintf (stderr, "unit-ranges: seed %u: a refused add changed "
                   "the set\n", seed);
          return EXIT_FAILURE;
        }
      }
      check (&s, model, seed);
    }
    if (ranges_whole (&s, LEN) != (memchr (model, 0, LEN) == NULL)) {
      fprintf (stderr, "unit-ranges: seed %u: ranges_whole wrong\n", seed);
      return EXIT_FAILURE;
    }
  }
  if (refused == 0) {
    fprintf (stderr, "unit-ranges: no add was ever refused: the limit of "
             "%d ranges is untested\n", RANGES_MAX);
    return EXIT_FAILURE;
  }
  printf ("unit-ranges: ok, %u adds refused at the limit\n", refused);
  return EXIT_SUCCESS;
}
