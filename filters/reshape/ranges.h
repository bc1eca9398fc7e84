/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * A small set of byte ranges within one block: sorted, disjoint and
 * never touching (touching ranges are one).  Write-back keeps the
 * staged bytes of a block this way.  Pure: no nbdkit dependency.
 */

#ifndef NBDKIT_RESHAPE_RANGES_H
#define NBDKIT_RESHAPE_RANGES_H

#include <stdbool.h>
#include <stdint.h>

#include "tunables.h"

struct range {
  uint32_t lo, hi;                /* [lo, hi), lo < hi */
};

struct ranges {
  unsigned nr;
  struct range r[RANGES_MAX];
};

/* Add [lo, hi) (lo < hi), absorbing what it touches.  False, with the
 * set unchanged, if that would need more than RANGES_MAX ranges.
 */
extern bool ranges_add (struct ranges *s, uint32_t lo, uint32_t hi);

/* Is the set exactly [0, len)? */
static inline bool
ranges_whole (const struct ranges *s, uint32_t len)
{
  return s->nr == 1 && s->r[0].lo == 0 && s->r[0].hi == len;
}

/* The first byte and the end of the last range (nr > 0). */
static inline uint32_t
ranges_first (const struct ranges *s)
{
  return s->r[0].lo;
}

static inline uint32_t
ranges_end (const struct ranges *s)
{
  return s->r[s->nr - 1].hi;
}

#endif /* NBDKIT_RESHAPE_RANGES_H */
