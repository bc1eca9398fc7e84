/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * A connection's stream of reads.  Each connection watches whether its
 * reads follow each other (within REORDER reads of where the last one
 * ended: a pipelining client's replies come out of order), and how:
 *
 *   - reads that each come alone (ALONE_RUN in a row) are a client
 *     that waits for each read: windows serve it (window.c);
 *   - a stream that ever had reads in flight together is a pipelining
 *     client's for good (once the cache serves it, its reads come and
 *     go one at a time and would look alone): grains serve it
 *     (grain.c), and while the export is learnt (reshape-size=auto),
 *     the learning's samples.
 *
 * A read the cache holds is served from it, whoever filled it; one a
 * fill in progress holds waits for it.  Anything else, and reads that
 * are not part of a stream (also one that repeats the last read),
 * go to the plugin as they are, timed (the window needs the plugin's
 * latency).  Whether readahead runs at all
 * (reshape-readahead, write-back without multi-conn) is reshape.c's
 * decision.
 */

#include <config.h>

#include <nbdkit-filter.h>

#include "cache.h"
#include "common.h"
#include "fill.h"
#include "grain.h"
#include "readahead.h"
#include "stats.h"
#include "tune.h"
#include "window.h"

void
readahead_init (struct readahead *ra)
{
  pthread_mutex_init (&ra->lock, NULL);
  ra->last = ra->next = UINT64_MAX;
  ra->in_flight = 0;
  ra->alone_run = 0;
  ra->pipelined = false;
  window_init (&ra->window);
  grains_init (&ra->grains);
}

void
readahead_destroy (struct readahead *ra)
{
  grains_destroy (&ra->grains);
  window_destroy (&ra->window);
  pthread_mutex_destroy (&ra->lock);
}

/* What the stream says of a read (stream_begin). */
struct stream_read {
  bool in_stream;           /* near where the stream was */
  bool continues;           /* exactly where it was */
  bool waits;               /* its client waits for each read */
  bool pipelined;           /* its client keeps reads in flight */
  unsigned in_flight;       /* the stream's reads in flight, with it */
};

/* Does rq lie within the stream's last read?  Then it reads the same
 * place again, which is no stream (a client polling one place), even
 * though it is near where the stream was.  Lock held.
 */
static bool
repeats_last (const struct readahead *ra, const struct read_req *rq)
{
  return rq->offset >= ra->last && rq->offset + rq->count <= ra->next;
}

/* Record rq as in flight in the stream; stream_end must follow. */
static void
stream_begin (struct readahead *ra, const struct read_req *rq,
              struct stream_read *s)
{
  const uint64_t reach = (uint64_t) REORDER * rq->count;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&ra->lock);

  s->in_stream = ra->next != UINT64_MAX && !repeats_last (ra, rq) &&
    rq->offset + reach >= ra->next && rq->offset <= ra->next + reach;
  if (!s->in_stream)                    /* the stream broke off */
    ra->pipelined = false;
  /* A pipelining client's queue runs empty now and then (between its
   * work chunks): only a run of reads that each came alone counts.
   */
  if (++ra->in_flight > 1)
    ra->alone_run = 0, ra->pipelined = true;
  else if (ra->alone_run < ALONE_RUN)
    ra->alone_run++;
  s->continues = rq->offset == ra->next;
  s->waits = ra->alone_run >= ALONE_RUN && !ra->pipelined;
  s->pipelined = ra->pipelined;
  s->in_flight = ra->in_flight;
  ra->last = rq->offset;
  ra->next = rq->offset + rq->count;
}

static void
stream_end (struct readahead *ra)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&ra->lock);

  ra->in_flight--;
}

/* A read that misses the cache, in the stream or not. */
static int
read_missed (struct readahead *ra, struct cache *cache, const struct io *io,
             const struct down *down, const struct stream_read *s,
             const struct read_req *rq, int *err)
{
  struct tune_fetch tf = { .size = 0 };
  uint64_t start, took = 0;
  int r;

  if (s->in_stream && fill_wait (cache, false, rq))
    return 0;                           /* a fill in progress held it */
  if (s->in_stream)
    grains_plan (io, rq->count, s->in_flight, &tf);
  if (tf.size)
    return grains_read (&ra->grains, cache, io, down, &tf, rq, err);
  start = now_ns ();
  r = fill_direct (down, rq, err);
  if (r == 0)
    took = now_ns () - start;
  window_timed (&ra->window, took);
  if (tf.rung)                          /* the base of a learning pair */
    tune_sample_done (io->tune, &tf, took);
  return r;
}

int
readahead_pread (struct readahead *ra, struct cache *cache,
                 const struct io *io, const struct down *down,
                 void *buf, uint32_t count, uint64_t offset,
                 struct ra_ahead *ahead, int *err)
{
  const struct read_req rq = { .buf = buf, .count = count,
                               .offset = offset };
  struct stream_read s;
  uint32_t window;
  int r;

  ahead->due = false;
  /* Requests of the optimal size or larger are already what the plugin
   * wants: no copy through the cache for them (reshape-size=SIZE; auto
   * learns what that size is from them too).
   */
  if (count >= io->geo->size && io->tune == NULL)
    return fill_direct (down, &rq, err);
  stream_begin (ra, &rq, &s);
  if (!s.in_stream)
    grains_reset (&ra->grains);
  window = window_next (&ra->window, io->geo, count, s.continues, s.waits);
  if (cache_read (cache, offset, count, buf)) {
    stats_add (C_RA_HITS, 1);
    r = 0;
    ahead->due = s.in_stream && s.pipelined && !window &&
      grains_ahead_due (&ra->grains, cache, io, &rq, &ahead->f);
  }
  else if (window)
    r = window_read (&ra->window, cache, io, down, window, &rq, err);
  else
    r = read_missed (ra, cache, io, down, &s, &rq, err);
  stream_end (ra);
  return r;
}

void
readahead_fetch_ahead (struct readahead *ra, struct cache *cache,
                       const struct io *io, const struct down *down,
                       struct ra_ahead *ahead)
{
  if (ahead->due)
    grains_fetch_ahead (&ra->grains, cache, io, down, &ahead->f);
}

int
readahead_cache (struct cache *cache, const struct io *io,
                 const struct down *down, uint32_t count, uint64_t offset)
{
  fill_cache_request (cache, io, down, fill_cap (io->geo), count, offset);
  return 0;
}
