/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * The export registry.  Its lock is taken only when a connection opens
 * or closes.
 */

#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

#include <nbdkit-filter.h>

#include "cache.h"
#include "common.h"
#include "cut.h"
#include "export.h"
#include "tune.h"
#include "writeback.h"

static struct {
  pthread_mutex_t lock;
  struct export *list;
} registry = { .lock = PTHREAD_MUTEX_INITIALIZER };

static void
export_free (struct export *exp)
{
  if (exp->cache)
    cache_free (exp->cache);
  if (exp->wb)
    writeback_put (exp->wb);
  if (exp->tune)
    tune_put (exp->tune);
  if (exp->cut)
    cut_free (exp->cut);
  free (exp->name);
  free (exp);
}

static struct export *
export_new (const char *name, bool tls)
{
  struct export *exp = calloc (1, sizeof *exp);

  if (exp == NULL)
    return NULL;
  exp->name = strdup (name);
  exp->tls = tls;
  exp->cache = cache_new ();
  exp->wb = writeback_get (name, tls);
  exp->tune = tune_get (name);
  exp->cut = cut_new ();
  if (!exp->name || !exp->cache || !exp->wb || !exp->tune || !exp->cut) {
    export_free (exp);
    return NULL;
  }
  return exp;
}

struct export *
export_get (const char *name, bool tls)
{
  struct export *exp;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&registry.lock);

  for (exp = registry.list; exp != NULL; exp = exp->next)
    if (strcmp (exp->name, name) == 0 && exp->tls == tls)
      break;
  if (exp == NULL) {
    exp = export_new (name, tls);
    if (exp == NULL) {
      nbdkit_error ("reshape: export state: %m");
      return NULL;
    }
    exp->next = registry.list;
    registry.list = exp;
  }
  exp->refs++;
  return exp;
}

void
export_put (struct export *exp)
{
  struct export **pp;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&registry.lock);

  if (--exp->refs > 0)
    return;
  for (pp = &registry.list; *pp != exp; pp = &(*pp)->next)
    ;
  *pp = exp->next;
  export_free (exp);
}
