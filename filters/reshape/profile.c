/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * reshape-profile=FILE: what was learnt of each export (tune.c),
 * kept across restarts, so that the first connection of the next run
 * is told the right sizes without a probe.
 *
 * A text file, one line per export measured:
 *
 *   nbdkit-reshape-filter profile 1
 *   export HEXNAME exportsize N min N max N fast 0|1 grain N
 *     lat NS npb NS probe CLASS:NS ...        (all on one line)
 *
 * written whole to a temporary file and renamed over the old one, so
 * that a reader never sees half of it.  Anything unexpected makes the
 * whole file suspect: it is ignored with a warning, and every export
 * is probed.
 */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nbdkit-filter.h>

#include "common.h"
#include "profile.h"
#include "tune.h"

/* reshape-profile=FILE, NULL if not given. */
static struct {
  pthread_mutex_t lock;                 /* one save at a time */
  const char *file;
} profile = { .lock = PTHREAD_MUTEX_INITIALIZER };

#define PROFILE_HEADER "nbdkit-reshape-filter profile 1"

bool
profile_fits (struct tune *t, const struct geometry *geo)
{
  if (t->exportsize == geo->exportsize && t->min == geo->min &&
      t->max == geo->max)
    return true;
  nbdkit_error ("reshape-profile: warning: export '%s' is not what the "
                "profile was made on (size %" PRIu64 ", minimum %" PRIu32
                ", maximum %" PRIu32 " now; %" PRIu64 ", %" PRIu32 ", %"
                PRIu32 " then): probing it again", t->name,
                geo->exportsize, geo->min, geo->max, t->exportsize, t->min,
                t->max);
  memset (t->probe_ns, 0, sizeof t->probe_ns);
  t->measured = t->fast = t->from_profile = false;
  t->grain = 0;
  t->lat_ns = t->ns_per_byte = 0;
  t->sizes = (struct tune_sizes) { 0 };
  return false;
}

/* t's line, if a probe measured it (or a profile told). */
static void
write_entry (struct tune *t, void *fpv)
{
  FILE *fp = fpv;
  const char *n;
  unsigned c;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);

  if (t->state != TUNE_KNOWN || !t->measured)
    return;

  fprintf (fp, "export ");
  for (n = t->name; *n; n++)
    fprintf (fp, "%02x", (unsigned char) *n);
  if (*t->name == '\0')
    fprintf (fp, "-");
  fprintf (fp, " exportsize %" PRIu64 " min %" PRIu32 " max %" PRIu32
           " fast %d grain %" PRIu32 " lat %.0f npb %.6f probe",
           t->exportsize, t->min, t->max, t->fast, t->grain, t->lat_ns,
           t->ns_per_byte);
  for (c = 0; c < NCLASSES; c++)
    if (t->probe_ns[c])
      fprintf (fp, " %u:%.0f", c, t->probe_ns[c]);
  fprintf (fp, "\n");
}

void
profile_save (void)
{
  CLEANUP_FREE char *tmp = NULL;
  FILE *fp;
  bool ok;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&profile.lock);

  if (profile.file == NULL)
    return;
  if (asprintf (&tmp, "%s.tmp.%ld", profile.file, (long) getpid ()) == -1)
    tmp = NULL;                 /* undefined after a failure */
  if (tmp == NULL || (fp = fopen (tmp, "w")) == NULL) {
    nbdkit_error ("reshape-profile: warning: cannot write %s: %m",
                  profile.file);
    return;
  }
  fprintf (fp, "%s\n", PROFILE_HEADER);
  tune_each (write_entry, fp);
  ok = fflush (fp) == 0 && fsync (fileno (fp)) == 0;
  if (fclose (fp) != 0 || !ok || rename (tmp, profile.file) == -1) {
    nbdkit_error ("reshape-profile: warning: cannot write %s: %m",
                  profile.file);
    unlink (tmp);
  }
}

/* Decode HEXNAME ("-": the empty name) into name (len bytes). */
static bool
unhex (const char *hex, char *name, size_t len)
{
  size_t i, n = strlen (hex);

  if (strcmp (hex, "-") == 0) {
    *name = '\0';
    return true;
  }
  if (n % 2 || n / 2 >= len)
    return false;
  for (i = 0; i < n / 2; i++) {
    unsigned v;
    if (sscanf (hex + 2 * i, "%2x", &v) != 1 || v == 0 ||
        !strchr ("0123456789abcdef", hex[2 * i]) ||
        !strchr ("0123456789abcdef", hex[2 * i + 1]))
      return false;
    name[i] = v;
  }
  name[i] = '\0';
  return true;
}

/* One export line into t (not yet shared); false if it is not one. */
static bool
parse_entry (char *line, char *name, size_t len, struct tune *t)
{
  char hex[2 * 4096 + 2], *p;
  int fast, used = -1;          /* %n is not reached if " probe" is missing */

  if (sscanf (line, "export %8193s exportsize %" SCNu64 " min %" SCNu32
              " max %" SCNu32 " fast %d grain %" SCNu32 " lat %lf npb %lf"
              " probe%n", hex, &t->exportsize, &t->min, &t->max, &fast,
              &t->grain, &t->lat_ns, &t->ns_per_byte, &used) != 8 ||
      used < 0 ||
      !unhex (hex, name, len) || t->exportsize == 0 ||
      !is_power_of_2 (t->min) || t->min > 64 * 1024 || t->max < t->min ||
      (fast != 0 && fast != 1) ||
      (!fast && (!is_power_of_2 (t->grain) || t->grain < 4096 ||
                 t->grain > PROBE_MAX)) ||
      !(t->lat_ns >= 0 && t->lat_ns < 1e11) ||
      !(t->ns_per_byte >= 0 && t->ns_per_byte < 1e6))
    return false;
  t->fast = fast;
  for (p = line + used; *p && *p != '\n'; ) {
    unsigned c;
    double ns;
    int n;
    if (sscanf (p, " %u:%lf%n", &c, &ns, &n) != 2 || c >= NCLASSES ||
        !(ns > 0 && ns < 1e11))
      return false;
    t->probe_ns[c] = ns;
    p += n;
  }
  return t->fast || t->probe_ns[class_of (t->grain)] > 0;
}

/* Read the whole file; false (nothing taken) if any line is wrong. */
static bool
load (FILE *fp, const char *file)
{
  struct entry { char name[4097]; struct tune t; } *e = NULL;
  CLEANUP_FREE char *line = NULL;
  size_t cap = 0, n = 0, i;
  unsigned lineno = 1;
  ssize_t r;

  if ((r = getline (&line, &cap, fp)) == -1)
    return true;                        /* empty: nothing learnt yet */
  if (strcmp (line, PROFILE_HEADER "\n") != 0) {
    nbdkit_error ("reshape-profile: warning: %s is not a profile of this "
                  "filter; ignored, and left as it is (nothing learnt "
                  "will be kept)", file);
    profile.file = NULL;
    return false;
  }
  while ((r = getline (&line, &cap, fp)) != -1) {
    struct entry *ne = realloc (e, (n + 1) * sizeof *e);
    lineno++;
    if (ne == NULL) {
      free (e);
      return false;
    }
    e = ne;
    memset (&e[n], 0, sizeof e[n]);
    if (!parse_entry (line, e[n].name, sizeof e[n].name, &e[n].t)) {
      nbdkit_error ("reshape-profile: warning: %s line %u is corrupt; "
                    "the profile is ignored", file, lineno);
      free (e);
      return false;
    }
    n++;
  }
  for (i = 0; i < n; i++) {
    struct tune *t = tune_get (e[i].name);
    if (t == NULL)
      break;
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);
    t->exportsize = e[i].t.exportsize;
    t->min = e[i].t.min;
    t->max = e[i].t.max;
    t->fast = e[i].t.fast;
    t->grain = e[i].t.grain;
    t->lat_ns = e[i].t.lat_ns;
    t->ns_per_byte = e[i].t.ns_per_byte;
    memcpy (t->probe_ns, e[i].t.probe_ns, sizeof t->probe_ns);
    t->measured = t->from_profile = true;
    t->state = TUNE_KNOWN;
    tune_choose_sizes (t);
  }
  free (e);
  return true;
}

int
profile_load (const char *file)
{
  FILE *fp;

  profile.file = file;
  fp = fopen (file, "r");
  if (fp == NULL) {
    if (errno == ENOENT)
      return 0;                         /* made at the first probe */
    nbdkit_error ("reshape-profile: %s: %m", file);
    return -1;
  }
  load (fp, file);
  fclose (fp);
  return 0;
}
