/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * reshape-profile=FILE: what reshape-size=auto learnt, kept across
 * restarts (see profile.c).  Nothing of it runs without the parameter.
 */

#ifndef NBDKIT_RESHAPE_PROFILE_H
#define NBDKIT_RESHAPE_PROFILE_H

#include "tune.h"
#include "walk.h"

/* A parameter nbdkit passed through the filter, to the plugin or a
 * filter below it: what identifies the stack a profile was learnt on.
 */
extern void profile_note_param (const char *key, const char *value);

/* At start-up: -1 with the error reported if file cannot be a profile
 * (a directory, a file or directory that cannot be written); else its
 * entries are read (a missing file is made at the first save; a
 * foreign or corrupt one is warned of, see profile.c).
 */
extern int profile_load (const char *file);

/* A connection to t's export settled its geometry (tune_connect): if
 * nothing is learnt yet, what the profile kept of this export on this
 * stack and geometry is.
 */
extern void profile_apply (struct tune *t, const struct geometry *geo);

/* Save what was learnt since the last save, of every export each
 * walks (export_each): at_exit, or when the last save is a few seconds
 * old (a connection closing).
 */
extern void profile_save (bool at_exit, tune_walk *each);

extern void profile_free (void);

#endif /* NBDKIT_RESHAPE_PROFILE_H */
