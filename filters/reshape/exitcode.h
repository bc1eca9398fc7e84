/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 */

#ifndef RESHAPE_EXITCODE_H
#define RESHAPE_EXITCODE_H

/* Make the process exit with failure, once everything else in it has
 * finished its own exit.  Called once the server has stopped.
 */
extern void exitcode_fail (void);

#endif /* RESHAPE_EXITCODE_H */
