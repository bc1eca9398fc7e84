/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * The export registry: one record per export name, holding the name's
 * learning and what the connections of its plain and TLS clients
 * share.  It alone finds an export by name: writes staged under one
 * (writeback.c) are kept with it, so that a client that reconnects
 * sees them.  Its lock is taken only when a connection opens or
 * closes, and by the rare walks over every name (the report); never
 * on a request's path.
 */

#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

#include <nbdkit-filter.h>

#include "cache.h"
#include "common.h"
#include "auto.h"
#include "export.h"
#include "tunables.h"
#include "writeback.h"

/* One export name.  Kept while no connection holds it, for its
 * learning, and while writes staged under it wait for the plugin.
 */
struct record {
  char *name;
  struct auto_export *autoexp;
  struct export by_tls[2];              /* plain, TLS */
  struct record *next;                  /* most recently used first */
};

static struct {
  pthread_mutex_t lock;
  struct record *list;
  unsigned count;
} registry = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* What the export's connections share: made at the first. */
static int
export_open (struct export *exp, const char *name)
{
  exp->cache = cache_new ();
  exp->wb = writeback_new (name);
  return exp->cache && exp->wb ? 0 : -1;
}

/* And freed at the last close (or a failed open), the staged writes
 * only once the plugin has them all: until then they are the only
 * copy of acknowledged data.
 */
static void
export_close (struct export *exp)
{
  if (exp->cache)
    cache_free (exp->cache);
  if (exp->wb)
    writeback_drop (exp->wb);
  exp->wb = NULL;
  exp->cache = NULL;
}

static void
record_free (struct record *e)
{
  export_close (&e->by_tls[false]);
  export_close (&e->by_tls[true]);
  if (e->autoexp)
    auto_free (e->autoexp);
  free (e->name);
  free (e);
}

static bool
record_held (const struct record *e)
{
  return e->by_tls[false].refs || e->by_tls[true].refs;
}

/* Forget the least recently used name no connection holds, if the
 * registry is full.  Registry lock held.
 */
static void
forget_one (void)
{
  struct record **pp, **victim = NULL;

  if (registry.count < EXPORTS_MAX)
    return;
  for (pp = &registry.list; *pp; pp = &(*pp)->next)
    if (!record_held (*pp))
      victim = pp;
  if (victim) {
    struct record *e = *victim;
    *victim = e->next;
    registry.count--;
    record_free (e);
  }
}

static struct record *
record_new (const char *name)
{
  struct record *e = calloc (1, sizeof *e);

  if (e == NULL)
    return NULL;
  e->name = strdup (name);
  e->autoexp = e->name ? auto_new (e->name) : NULL;
  if (e->autoexp == NULL) {
    const int saved = errno;

    record_free (e);
    errno = saved;
    return NULL;
  }
  e->by_tls[false].autoexp = e->by_tls[true].autoexp = e->autoexp;
  return e;
}

/* The record of name, made if new, moved to the front.  Registry lock
 * held.
 */
static struct record *
record_get (const char *name)
{
  struct record **pp, *e;

  for (pp = &registry.list; (e = *pp) != NULL; pp = &e->next)
    if (strcmp (e->name, name) == 0) {
      *pp = e->next;
      break;
    }
  if (e == NULL) {
    forget_one ();
    e = record_new (name);
    if (e == NULL)
      return NULL;
    registry.count++;
  }
  e->next = registry.list;
  registry.list = e;
  return e;
}

struct export *
export_get (const char *name, bool tls)
{
  struct record *e;
  struct export *exp;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&registry.lock);

  e = record_get (name);
  exp = e ? &e->by_tls[tls] : NULL;
  if (exp && exp->refs == 0 && export_open (exp, e->name) == -1) {
    const int saved = errno;            /* for %m, whatever frees did */

    export_close (exp);
    errno = saved;
    exp = NULL;
  }
  if (exp == NULL) {
    nbdkit_error ("reshape: export state: %m");
    return NULL;
  }
  exp->refs++;
  return exp;
}

void
export_put (struct export *exp)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&registry.lock);

  if (--exp->refs == 0)
    export_close (exp);
}

void
export_each (auto_visit *fn, void *opaque)
{
  struct record *e;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&registry.lock);

  for (e = registry.list; e; e = e->next)
    fn (e->autoexp, opaque);
}

/* A connection may still be closing at unload (nbdkit quitting on a
 * signal with a client connected): its record stays for its close.
 * Nothing is staged any more (each export name's last close gives up
 * what it cannot write back).
 */
void
export_free_all (void)
{
  struct record **pp = &registry.list, *e;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&registry.lock);

  while ((e = *pp) != NULL) {
    if (record_held (e)) {
      pp = &e->next;
      continue;
    }
    *pp = e->next;
    registry.count--;
    record_free (e);
  }
}

static void
report_summary (FILE *fp)
{
  auto_summary (export_each, fp);
}

static void
report_tables (FILE *fp)
{
  auto_tables (export_each, fp);
}

static void
report_json (FILE *fp)
{
  auto_json (export_each, fp);
}

const struct stats_learning export_stats = {
  .summary = report_summary, .tables = report_tables, .json = report_json,
};
