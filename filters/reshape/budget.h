/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * The readahead budget: see budget.c.
 */

#ifndef NBDKIT_RESHAPE_BUDGET_H
#define NBDKIT_RESHAPE_BUDGET_H

#include <stdbool.h>
#include <stdint.h>

/* Charge n bytes read that no client asked for; false if over. */
extern bool budget_charge (uint64_t n);
/* n charged bytes were read by a client, or never read. */
extern void budget_refund (uint64_t n);
/* n bytes read will never be read by a client, charged of them. */
extern void budget_waste (uint64_t n, uint64_t charged);

#endif /* NBDKIT_RESHAPE_BUDGET_H */
