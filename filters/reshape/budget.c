/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * The readahead budget: what the filter reads that no client asked
 * for.  Read caches (cache.c) charge the bytes a fill reads that no
 * read asks for, refund them as clients read them, and tell it of
 * every byte read from the plugin that no client read: what is
 * dropped unread (also when a cache is freed with its export's last
 * connection), whether charged or asked for by a read that then went
 * to the plugin on its own, and what a failed fill read.  No lock:
 * atomic counters.
 */

#include <config.h>

#include "budget.h"
#include "stats.h"
#include "tunables.h"

/* The readahead budget: the bytes fills read from the plugin that no
 * client asked for, while no client has read them (pending) and once
 * they are dropped unread (wasted), held to 1/BUDGET_SHARE of the
 * bytes clients read (stats_client_read) plus BUDGET_BASE.  Atomic
 * counters.  The budget is the process's, not an export's: a client
 * that reconnects, or opens many export names, gets no fresh one.
 */
static struct {
  uint64_t pending, wasted;
} budget;

/* Charge n unasked bytes, if they fit.  A compare-and-swap, so that
 * fills begun at once on many connections cannot all pass one check.
 */
bool
budget_charge (uint64_t n)
{
  const uint64_t allowed =
    stats_client_read () / BUDGET_SHARE +
    BUDGET_BASE;
  uint64_t pending = __atomic_load_n (&budget.pending, __ATOMIC_RELAXED);

  if (n == 0)
    return true;
  do {
    if (pending + __atomic_load_n (&budget.wasted, __ATOMIC_RELAXED) + n >
        allowed) {
      stats_add (C_RA_REFUSED, 1);
      return false;
    }
  } while (!__atomic_compare_exchange_n (&budget.pending, &pending,
                                         pending + n, true,
                                         __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  return true;
}

/* n charged bytes were read by a client, or never read from the
 * plugin.
 */
void
budget_refund (uint64_t n)
{
  __atomic_sub_fetch (&budget.pending, n, __ATOMIC_RELAXED);
}

/* n bytes were read from the plugin, and no client will read them;
 * charged of them leave pending.  Counted wasted before they leave
 * pending: a charge meanwhile sees them twice, never not at all.
 */
void
budget_waste (uint64_t n, uint64_t charged)
{
  __atomic_add_fetch (&budget.wasted, n, __ATOMIC_RELAXED);
  budget_refund (charged);
  stats_add (C_RA_UNREAD, n);
}
