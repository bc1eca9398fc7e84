/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * SO_SNDBUF on the unix-socket client connections (reshape-sndbuf).
 */

#ifndef NBDKIT_RESHAPE_SOCKBUF_H
#define NBDKIT_RESHAPE_SOCKBUF_H

#include <stdbool.h>
#include <stdint.h>

/* Once, at configuration: given says whether the user set a size
 * (0: off); when not, the platform's default applies.
 */
extern void sockbuf_configure (bool given, uint32_t size);

/* One connection's state. */
struct sockbuf_conn {
  bool pending;             /* default send buffer not raised yet */
};

/* The client connected; its socket exists by now. */
extern void sockbuf_open (struct sockbuf_conn *sc);
/* A read reply of count bytes is about to be sent. */
extern void sockbuf_reply (struct sockbuf_conn *sc, uint32_t count);

#endif /* NBDKIT_RESHAPE_SOCKBUF_H */
