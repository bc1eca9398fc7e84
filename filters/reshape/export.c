/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * State shared between connections is keyed by export name, so that
 * what one export's clients do never touches another export.  The
 * registry lock is taken only when a connection opens or closes.
 */

#include <config.h>

#include <stdlib.h>
#include <string.h>
#include <pthread.h>

#include <nbdkit-filter.h>

#include "reshape.h"

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct reshape_export *exports;

struct rangelock reshape_locks = {
  .lock = PTHREAD_MUTEX_INITIALIZER,
  .changed = PTHREAD_COND_INITIALIZER,
};

static struct reshape_export *
export_new (const char *name)
{
  struct reshape_export *exp = calloc (1, sizeof *exp);

  if (exp == NULL)
    return NULL;
  exp->name = strdup (name);
  if (exp->name == NULL) {
    free (exp);
    return NULL;
  }
  cache_init (&exp->cache);
  reshape_merge_init (&exp->merge);
  reshape_writeback_init (&exp->wb);
  return exp;
}

struct reshape_export *
reshape_export_get (const char *name)
{
  struct reshape_export *exp;

  pthread_mutex_lock (&registry_lock);
  for (exp = exports; exp != NULL; exp = exp->next)
    if (strcmp (exp->name, name) == 0)
      break;
  if (exp == NULL) {
    exp = export_new (name);
    if (exp == NULL) {
      pthread_mutex_unlock (&registry_lock);
      nbdkit_error ("reshape: export state: %m");
      return NULL;
    }
    exp->next = exports;
    exports = exp;
  }
  exp->refs++;
  pthread_mutex_unlock (&registry_lock);
  return exp;
}

void
reshape_export_put (struct reshape_export *exp)
{
  struct reshape_export **pp;

  pthread_mutex_lock (&registry_lock);
  if (--exp->refs == 0) {
    for (pp = &exports; *pp != exp; pp = &(*pp)->next)
      ;
    *pp = exp->next;
    cache_destroy (&exp->cache);
    reshape_merge_destroy (&exp->merge);
    reshape_writeback_destroy (&exp->wb);
    free (exp->name);
    free (exp);
  }
  pthread_mutex_unlock (&registry_lock);
}

/* Requests are short of memory: the caches give back at least want
 * bytes, the least recently used data of each first.
 */
uint64_t
reshape_export_shrink_caches (uint64_t want)
{
  struct reshape_export *exp;
  uint64_t freed = 0;

  pthread_mutex_lock (&registry_lock);
  for (exp = exports; exp != NULL && freed < want; exp = exp->next)
    freed += cache_shrink (&exp->cache, want - freed);
  pthread_mutex_unlock (&registry_lock);
  return freed;
}

/* A write touched [lo, hi): no export's cache may keep it. */
void
reshape_export_invalidate (uint64_t lo, uint64_t hi)
{
  struct reshape_export *exp;

  if (!cache_anything ())       /* the common case without readahead */
    return;
  pthread_mutex_lock (&registry_lock);
  for (exp = exports; exp != NULL; exp = exp->next)
    cache_invalidate (&exp->cache, lo, hi);
  pthread_mutex_unlock (&registry_lock);
}
