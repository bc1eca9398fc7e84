/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 */

#include <config.h>

#include <assert.h>
#include <string.h>

#include "ranges.h"

bool
ranges_add (struct ranges *s, uint32_t lo, uint32_t hi)
{
  struct range out[RANGES_MAX + 1];
  unsigned i, n = 0;
  bool placed = false;

  assert (lo < hi);
  for (i = 0; i < s->nr; i++) {
    const struct range x = s->r[i];
    if (x.hi < lo || hi < x.lo) {         /* apart: keep in order */
      if (!placed && hi < x.lo) {
        out[n++] = (struct range) { lo, hi };
        placed = true;
      }
      out[n++] = x;
    }
    else {                                /* touching: absorb */
      if (x.lo < lo) lo = x.lo;
      if (x.hi > hi) hi = x.hi;
    }
    if (n > RANGES_MAX)
      return false;
  }
  if (!placed)
    out[n++] = (struct range) { lo, hi };
  if (n > RANGES_MAX)
    return false;
  memcpy (s->r, out, n * sizeof out[0]);
  s->nr = n;
  return true;
}
