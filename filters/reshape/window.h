/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Readahead windows, for a client that waits for each read before it
 * sends the next (see window.c).
 */

#ifndef NBDKIT_RESHAPE_WINDOW_H
#define NBDKIT_RESHAPE_WINDOW_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "cache.h"
#include "fill.h"
#include "split.h"
#include "stage.h"

/* One connection's window. */
struct window {
  pthread_mutex_t lock;
  uint32_t size;            /* the last window filled, 0: none */
  uint64_t latency;         /* ns, the stream's fastest direct read */
};

extern void window_init (struct window *w);
extern void window_destroy (struct window *w);

/* A read of count bytes: the window to fill for it (0: none).  A read
 * that does not continue the stream starts it anew; one that does, in
 * a stream of reads that each came alone (sync), over a plugin whose
 * direct reads in this stream took PLUGIN_SLOW_NS or more, gets a
 * window twice the last, from the request size up to fill_cap.
 */
extern uint32_t window_next (struct window *w, const struct geometry *geo,
                             uint32_t count, bool continues, bool sync);
/* A direct read of the stream took ns (0: it failed). */
extern void window_timed (struct window *w, uint64_t ns);

/* Fill the window of size bytes from the block (or the learnt grain)
 * holding rq, and serve rq.  A window that fails starts the stream's
 * windows again from the smallest.
 */
extern int window_read (struct window *w, struct cache *cache,
                        const struct io *io, const struct down *down,
                        uint32_t size, const struct read_req *rq, int *err);

#endif /* NBDKIT_RESHAPE_WINDOW_H */
