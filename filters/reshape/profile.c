/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * reshape-profile=FILE: what reshape-size=auto learnt of each export
 * (tune.c), kept across restarts, so that the first connection of the
 * next run is told the learnt sizes at once.
 *
 * A text file, one line per export learnt:
 *
 *   nbdkit-reshape-filter profile 3
 *   entry STACK HEXNAME size N min N max N fast 0|1
 *     grain N flat NS lat NS npb NS          (all on one line)
 *
 * STACK identifies what lies below the filter: a hash of the
 * parameters nbdkit passed through it (the plugin's and those of the
 * filters below; the plugin's name is not told to filters, but its
 * parameters tell one plugin from another).  A line applies only to
 * the same stack, export name, size and block sizes.
 *
 * Saving merges: under a lock on the file's directory, the file is
 * read again, this process's lines replace those with the same key
 * and the others are kept (another nbdkit's), and the result is
 * written whole to a temporary file renamed over the old one, so that
 * a reader never sees half of it (a symlink's target is replaced, the
 * link kept).  Saved at exit, and when a
 * connection closes if something new was learnt and the last save is
 * SAVE_EVERY_NS old.  A file that is not a profile of this filter is
 * never written (a warning, and the filter learns without it); a
 * corrupt line is skipped with a warning, and left out of the next
 * save; a profile of an older format is read as empty and rewritten.
 *
 * Lock order.  This file owns the filter's outermost lock, so the
 * order of all of them is stated here.  A thread holding a lock takes
 * only locks further down this list:
 *
 *   profile.lock (here; with the flock on the profile's directory)
 *   registry.lock (export.c)
 *   staging.lock, then one export's writeback lock (writeback.c)
 *   one connection's stream lock (stream.c)
 *   live.lock, then one cache's lock (cache.c)
 *   pool.lock (pool.c)
 *
 * Leaves, under which nothing is taken: a tune's lock (tune.c), the
 * cut choices' (cut.c), a shared walk's (split.c), the helper team's
 * (helpers.c), the range lock (rangelock.c), the last refusal's
 * (params.c).  No mutex is held across a plugin call: pool_get lets
 * pool.lock go before it asks the caches for memory back.  Claims on
 * staged pages and range locks are held across plugin calls and
 * above all of these; a claim is never waited for while another is
 * held, and a range lock is taken before its bounce buffer.
 */

#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/file.h>
#include <sys/stat.h>

#include <nbdkit-filter.h>

#include "common.h"
#include "files.h"
#include "profile.h"
#include "tunables.h"
#include "tune.h"
#include "warn.h"

/* The first line: MAGIC and the format's version. */
static const char MAGIC[] = "nbdkit-reshape-filter profile ";
enum { FORMAT = 3 };

struct saved {
  uint64_t stack;
  char name[NBD_NAME_MAX + 1];
  struct geometry geo;
  struct learnt l;
};

struct saved_set {
  struct saved *v;
  size_t n;
};

static struct {
  pthread_mutex_t lock;                 /* one save at a time */
  char *file;                           /* NULL: no profile */
  bool foreign;                         /* never to be written */
  uint64_t stack;                       /* this process's */
  struct saved_set loaded;
  unsigned saved_generation;
  uint64_t saved_ns;
} profile = {
  .lock = PTHREAD_MUTEX_INITIALIZER,
  .stack = UINT64_C (0xcbf29ce484222325),   /* FNV-1a's offset basis */
};

static void
hash_bytes (uint64_t *h, const char *s, size_t len)
{
  size_t i;

  for (i = 0; i < len; i++) {
    *h ^= (unsigned char) s[i];
    *h *= UINT64_C (0x100000001b3);
  }
}

void
profile_note_param (const char *key, const char *value)
{
  hash_bytes (&profile.stack, key, strlen (key) + 1);
  hash_bytes (&profile.stack, value, strlen (value) + 1);
}

/* Decode HEXNAME ("-": the empty name) into name. */
static bool
unhex (const char *hex, char *name)
{
  size_t i, n = strlen (hex);

  if (strcmp (hex, "-") == 0) {
    *name = '\0';
    return true;
  }
  if (n % 2 || n / 2 > NBD_NAME_MAX)
    return false;
  for (i = 0; i < n / 2; i++) {
    unsigned v;
    if (!strchr ("0123456789abcdef", hex[2 * i]) ||
        !strchr ("0123456789abcdef", hex[2 * i + 1]) ||
        sscanf (hex + 2 * i, "%2x", &v) != 1 || v == 0)
      return false;
    name[i] = v;
  }
  name[i] = '\0';
  return true;
}

/* One "entry" line into e; false if it is not one. */
static bool
parse_saved (const char *line, struct saved *e)
{
  char hex[2 * NBD_NAME_MAX + 2];
  int fast, end = -1;
  struct learnt *l = &e->l;

  if (sscanf (line, "entry %" SCNx64 " %8193s size %" SCNu64 " min %"
              SCNu32 " max %" SCNu32 " fast %d grain %" SCNu32
              " flat %lf lat %lf npb %lf%n", &e->stack, hex,
              &e->geo.exportsize, &e->geo.min, &e->geo.max, &fast,
              &l->grain, &l->flat_ns, &l->lat_ns, &l->ns_per_byte,
              &end) != 10 || end < 0 ||
      (line[end] != '\n' && line[end] != '\0') ||
      !unhex (hex, e->name) || e->geo.exportsize == 0 ||
      !is_power_of_2 (e->geo.min) || e->geo.max < e->geo.min ||
      (fast != 0 && fast != 1) ||
      (!fast && (!is_power_of_2 (l->grain) || l->grain < 4096)) ||
      !(l->flat_ns >= 0 && l->flat_ns < 1e11) ||
      !(l->lat_ns >= 0 && l->lat_ns < 1e11) ||
      !(l->ns_per_byte >= 0 && l->ns_per_byte < 1e6))
    return false;
  l->fast = fast;
  return true;
}

static void
write_saved (FILE *fp, const struct saved *e)
{
  const char *n;

  fprintf (fp, "entry %016" PRIx64 " ", e->stack);
  for (n = e->name; *n; n++)
    fprintf (fp, "%02x", (unsigned char) *n);
  if (*e->name == '\0')
    fprintf (fp, "-");
  fprintf (fp, " size %" PRIu64 " min %" PRIu32 " max %" PRIu32
           " fast %d grain %" PRIu32 " flat %.0f lat %.0f"
           " npb %.6f\n", e->geo.exportsize, e->geo.min, e->geo.max,
           e->l.fast, e->l.grain, e->l.flat_ns, e->l.lat_ns,
           e->l.ns_per_byte);
}

static bool
same_key (const struct saved *a, const struct saved *b)
{
  return a->stack == b->stack && strcmp (a->name, b->name) == 0 &&
    a->geo.exportsize == b->geo.exportsize && a->geo.min == b->geo.min &&
    a->geo.max == b->geo.max;
}

/* Add e, or replace the line with its key. */
static int
put_saved (struct saved_set *es, const struct saved *e)
{
  struct saved *nv;
  size_t i;

  for (i = 0; i < es->n; i++)
    if (same_key (&es->v[i], e)) {
      es->v[i] = *e;
      return 0;
    }
  nv = realloc (es->v, (es->n + 1) * sizeof *nv);
  if (nv == NULL)
    return -1;
  es->v = nv;
  es->v[es->n++] = *e;
  return 0;
}

/* Corrupt lines are told of once: a save reads the file again, and
 * would repeat what the load said.  (The save leaves them out, so
 * more can come only from another process.)
 */
static void
tell_corrupt (const char *file, unsigned first, unsigned n)
{
  static bool told;

  if (n == 0 || told)
    return;
  told = true;
  if (n == 1)
    reshape_warning ("reshape-profile: %s line %u is corrupt: skipped",
                     file, first);
  else
    reshape_warning ("reshape-profile: %s line %u and %u more are "
                     "corrupt: skipped", file, first, n - 1);
}

/* Read fp's lines into es.  false if fp is not a profile of this
 * filter (or of a newer one), or could not be read whole (then it is
 * never written).  Corrupt lines are skipped (tell_corrupt).
 */
static bool
read_saved (FILE *fp, const char *file, struct saved_set *es)
{
  CLEANUP_FREE char *line = NULL;
  size_t cap = 0;
  unsigned lineno = 1, first = 0, corrupt = 0;
  int version;
  struct saved e;

  if (getline (&line, &cap, fp) == -1)
    return true;                        /* empty: nothing learnt yet */
  if (strncmp (line, MAGIC, strlen (MAGIC)) != 0 ||
      sscanf (line + strlen (MAGIC), "%d", &version) != 1)
    return false;
  if (version > FORMAT)
    return false;                       /* a newer filter's: foreign */
  if (version < FORMAT)
    return true;                        /* an older filter's: rewritten */
  while (getline (&line, &cap, fp) != -1) {
    lineno++;
    memset (&e, 0, sizeof e);
    if (!parse_saved (line, &e)) {
      if (corrupt++ == 0)
        first = lineno;
    }
    else if (put_saved (es, &e) == -1) {
      /* Saving what was read would drop the rest: never overwrite. */
      reshape_warning ("reshape-profile: %s: %m: not saved", file);
      return false;
    }
  }
  tell_corrupt (file, first, corrupt);
  return true;
}

/* Can file be a profile?  -1 with the error reported if not.  A
 * symlink is followed: its target is what is saved (see write_file).
 */
static int
check_file (const char *file)
{
  CLEANUP_FREE char *target = resolve_links (file);
  struct stat st;

  if (target == NULL) {
    nbdkit_error ("reshape-profile: %s: %m", file);
    return -1;
  }
  if (stat (target, &st) == 0) {
    if (!S_ISREG (st.st_mode)) {
      nbdkit_error ("reshape-profile: %s is not a regular file", file);
      return -1;
    }
    if (access (target, R_OK | W_OK) == -1) {
      nbdkit_error ("reshape-profile: cannot read and write %s: %m", file);
      return -1;
    }
  }
  else if (errno != ENOENT) {
    nbdkit_error ("reshape-profile: %s: %m", file);
    return -1;
  }
  /* Saved by a rename in its directory. */
  if (dir_writable (target) == -1) {
    nbdkit_error ("reshape-profile: cannot write in the directory of "
                  "%s: %m", target);
    return -1;
  }
  return 0;
}

int
profile_load (const char *file)
{
  FILE *fp;

  if (check_file (file) == -1)
    return -1;
  profile.file = strdup (file);
  if (profile.file == NULL) {
    nbdkit_error ("reshape-profile: %m");
    return -1;
  }
  fp = fopen (file, "r");
  if (fp == NULL)
    return 0;                           /* made at the first save */
  if (!read_saved (fp, file, &profile.loaded)) {
    reshape_warning ("reshape-profile: %s is not a profile of this "
                     "filter: it is left as it is, and nothing learnt "
                     "is kept", file);
    profile.foreign = true;
  }
  fclose (fp);
  return 0;
}

void
profile_apply (struct tune *t, const struct geometry *geo)
{
  struct saved want = { .stack = profile.stack, .geo = *geo };
  size_t i;

  if (profile.file == NULL || strlen (tune_name (t)) > NBD_NAME_MAX)
    return;
  strcpy (want.name, tune_name (t));
  for (i = 0; i < profile.loaded.n; i++)
    if (same_key (&profile.loaded.v[i], &want)) {
      tune_teach (t, &profile.loaded.v[i].l);
      return;
    }
}

/* Add t's learning, if any, to the lines (opaque). */
static void
merge_one (struct tune *t, void *opaque)
{
  struct saved e = { .stack = profile.stack };

  if (strlen (tune_name (t)) > NBD_NAME_MAX ||
      !tune_get_learnt (t, &e.geo, &e.l))
    return;
  strcpy (e.name, tune_name (t));
  put_saved (opaque, &e);
}

/* Write es to target (the profile, its symlinks followed, so that a
 * link is kept), atomically.  Directory lock held.
 */
static bool
write_file (const struct saved_set *es, const char *target)
{
  char *tmp;
  FILE *fp = replace_open (target, &tmp);
  size_t i;

  if (fp == NULL)
    return false;
  fprintf (fp, "%s%d\n", MAGIC, FORMAT);
  for (i = 0; i < es->n; i++)
    write_saved (fp, &es->v[i]);
  return replace_commit (fp, tmp, target) == 0;
}

/* Merge and write, under a lock on the target's directory: other
 * nbdkits may save to the same file, by the same name or another
 * link.  The link is followed at each save, as a reader would.
 * Profile lock held.
 */
static void
merge_and_write (tune_walk *each)
{
  CLEANUP_FREE char *target = resolve_links (profile.file);
  CLEANUP_FREE char *copy = target ? strdup (target) : NULL;
  struct saved_set es = { NULL, 0 };
  int dirfd = copy ? open (dirname (copy), O_RDONLY | O_DIRECTORY) : -1;
  FILE *fp;
  bool ok = false;

  if (dirfd == -1 || flock (dirfd, LOCK_EX) == -1)
    goto out;
  fp = fopen (target, "r");
  if (fp) {
    profile.foreign = !read_saved (fp, profile.file, &es);
    fclose (fp);
  }
  if (profile.foreign) {                /* replaced by something else */
    reshape_warning ("reshape-profile: %s is no longer a profile of "
                     "this filter: not saved", profile.file);
    ok = true;
    goto out;
  }
  each (merge_one, &es);
  ok = write_file (&es, target);
 out:
  if (!ok)
    reshape_warning ("reshape-profile: cannot save %s: %m", profile.file);
  if (dirfd >= 0)
    close (dirfd);                      /* and the lock with it */
  free (es.v);
}

void
profile_save (bool at_exit, tune_walk *each)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&profile.lock);
  const unsigned generation = tune_generation ();

  if (profile.file == NULL || profile.foreign ||
      generation == profile.saved_generation)
    return;
  if (!at_exit && profile.saved_ns &&
      now_ns () - profile.saved_ns < SAVE_EVERY_NS)
    return;
  merge_and_write (each);
  profile.saved_generation = generation;
  profile.saved_ns = now_ns ();
}

void
profile_free (void)
{
  free (profile.file);
  free (profile.loaded.v);
  profile.file = NULL;
  profile.loaded = (struct saved_set) { NULL, 0 };
}
