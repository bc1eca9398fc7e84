/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Readahead windows.  A client that waits for each read before it
 * sends the next pays the plugin's latency once per read; a window
 * read ahead into the cache pays it once per window.  The window
 * starts at the request size and doubles while the stream goes on, up
 * to reshape-readahead, and collapses at the first read elsewhere, so
 * random reads are never amplified.  It is read as one request cut
 * into pieces that run in parallel (split.c).
 *
 * Only where a call costs time: the stream's reads that go straight to
 * the plugin are timed, and a plugin that answered any of them faster
 * than PLUGIN_SLOW_NS (memory, or files in the page cache, which the
 * kernel reads ahead already) gets no window.  A client that keeps
 * several reads in flight hides the latency itself (readahead.c sends
 * its reads to grain.c instead).
 */

#include <config.h>

#include <nbdkit-filter.h>

#include "cache.h"
#include "common.h"
#include "fill.h"
#include "stats.h"
#include "tune.h"
#include "window.h"

void
window_init (struct window *w)
{
  pthread_mutex_init (&w->lock, NULL);
  w->size = 0;
  w->latency = UINT64_MAX;
}

void
window_destroy (struct window *w)
{
  pthread_mutex_destroy (&w->lock);
}

uint32_t
window_next (struct window *w, const struct geometry *geo, uint32_t count,
             bool continues, bool sync)
{
  const uint32_t cap = fill_cap (geo);
  uint32_t size = 0;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&w->lock);

  if (!continues)
    w->latency = UINT64_MAX;            /* a new stream: time it anew */
  else if (count < geo->size && sync && w->latency != UINT64_MAX &&
           w->latency >= PLUGIN_SLOW_NS)
    size = min_u64 (w->size ? w->size * 2 : geo->size, cap);
  w->size = size;
  if (size < geo->size)
    return 0;
  stats_max (C_RA_WINDOW, size);
  return size;
}

void
window_timed (struct window *w, uint64_t ns)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&w->lock);

  /* The fastest decides: one read delayed by the scheduler does not
   * start a window.
   */
  if (ns && ns < w->latency)
    w->latency = ns;
}

/* The window [offset, offset+size) from the grain holding the read
 * (reshape-size=auto: a grain costs what any part of it costs) or else
 * the block, rounded out to whole blocks and clipped at the end of the
 * export.
 */
static void
window_range (const struct io *io, uint32_t size, const struct read_req *rq,
              uint64_t *lo, uint64_t *hi)
{
  const struct geometry *geo = io->geo;
  struct tune_sizes s = { 0 };

  if (io->tune)
    tune_get_sizes (io->tune, &s);
  *lo = round_down (rq->offset, max_u64 (geo->min, s.grain));
  *hi = max_u64 (*lo + size, round_up (rq->offset + rq->count, geo->min));
  *hi = min_u64 (*hi, geo->exportsize);
}

int
window_read (struct window *w, struct cache *cache, const struct io *io,
             const struct down *down, uint32_t size,
             const struct read_req *rq, int *err)
{
  enum fill_result result;
  uint64_t lo, hi;
  int r;

  stats_add (C_RA_MISSES, 1);
  window_range (io, size, rq, &lo, &hi);
  r = fill_range (cache, io, down, lo, hi, rq, &result, err);
  if (result == FILL_FAILED) {
    /* Else every read after would try the same failing fill first. */
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&w->lock);
    w->size = 0;
    w->latency = UINT64_MAX;
  }
  return r;
}
