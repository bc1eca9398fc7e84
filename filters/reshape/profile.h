/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * reshape-profile=FILE (see profile.c).
 */

#ifndef NBDKIT_RESHAPE_PROFILE_H
#define NBDKIT_RESHAPE_PROFILE_H

#include <stdbool.h>

#include "tune.h"
#include "walk.h"

/* What was learnt of each export, kept across restarts.  profile_load
 * reads it at start-up (a missing file is made later; a corrupt or
 * foreign one is ignored with a warning); -1 only if it cannot be read
 * at all.  profile_save writes it (atomically) after every probe and
 * at exit; nothing without reshape-profile.
 */
extern int profile_load (const char *file);
extern void profile_save (void);

/* Does what a profile said of t hold for this geometry?  If not, t is
 * reset to be probed (with a warning).  t's lock held.
 */
extern bool profile_fits (struct tune *t, const struct geometry *geo);

#endif /* NBDKIT_RESHAPE_PROFILE_H */
