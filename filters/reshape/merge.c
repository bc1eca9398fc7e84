/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Merging of concurrent small requests.  A small read or write (below
 * reshape-size) that continues a stream whose plugin requests are
 * already busy is held in a group; requests that touch the group join
 * it, and the group goes to the plugin as one request of up to
 * reshape-size as soon as fewer than MERGE_INFLIGHT groups of the
 * export are at the plugin.  Nothing waits on a timer:
 *
 *   - a request with nothing to join and no busy neighbour goes to the
 *     plugin at once, from its own buffer (a lone synchronous client,
 *     random requests);
 *   - only a request near a busy one (a stream) waits, and only until
 *     fewer than MERGE_INFLIGHT groups are at the plugin.
 *
 * A merged write is acknowledged to each client only after the plugin
 * request holding it succeeded; a group carries FUA when any member
 * asked for it.  Groups mix connections only when the plugin allows
 * multi-conn, so that a flush on any connection covers what it wrote.
 */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <nbdkit-filter.h>

#include "reshape.h"

/* One group of a stream at the plugin per export while the next fills
 * up.  Measured (bench/results, man page): 64 in-flight sequential 4K
 * writes to a 1 ms parallel plugin became 1.8x to 7.9x fewer plugin
 * calls but took 2.3x to 6.9x as long: every held request keeps one of
 * nbdkit's threads (16 per connection), so fewer requests reach the
 * filter per plugin round trip.  Hence merging is opt-in
 * (reshape-merge=true), for plugins whose cost is per call rather
 * than per byte in flight.
 */
#define MERGE_INFLIGHT 1

struct member {
  uint64_t offset;
  uint32_t count;
  char *rbuf;                   /* pread */
  const char *wbuf;             /* pwrite */
  struct member *next;
};

struct group {
  bool write;
  bool launched;
  bool done;
  void *conn;                   /* NULL: any connection may join */
  uint32_t flags;
  uint64_t lo, hi;              /* union of the members: contiguous */
  struct member *members, **last;
  unsigned refs;                /* members still to read the result */
  int err;
  struct group *next;
};

static bool
touches (uint64_t lo, uint64_t hi, uint64_t offset, uint32_t count)
{
  return offset <= hi && lo <= offset + count;
}

static struct group *
find_group (struct merge *m, bool write, void *conn, uint64_t offset,
            uint32_t count, uint32_t size)
{
  struct group *g;

  for (g = m->groups; g; g = g->next) {
    uint64_t lo, hi;
    if (g->launched || g->write != write || (g->conn && g->conn != conn))
      continue;
    if (!touches (g->lo, g->hi, offset, count))
      continue;
    lo = g->lo < offset ? g->lo : offset;
    hi = g->hi > offset + count ? g->hi : offset + count;
    if (hi - lo <= size)
      return g;
  }
  return NULL;
}

/* Is this request part of a busy stream: another group (at the plugin
 * or filling) of its kind within reshape-size of it?  Requests of one
 * stream reach the filter slightly out of order, hence near, not next.
 */
static bool
busy_stream (struct merge *m, const struct group *self, uint64_t offset,
             uint32_t count, uint32_t size)
{
  struct group *g;

  for (g = m->groups; g; g = g->next)
    if (g != self && g->write == self->write &&
        touches (g->lo > size ? g->lo - size : 0, g->hi + size,
                 offset, count))
      return true;
  return false;
}

static void
join (struct group *g, struct member *mb, uint32_t flags)
{
  if (mb->offset < g->lo) g->lo = mb->offset;
  if (mb->offset + mb->count > g->hi) g->hi = mb->offset + mb->count;
  g->flags |= flags & NBDKIT_FLAG_FUA;
  mb->next = NULL;
  *g->last = mb;
  g->last = &mb->next;
  g->refs++;
}

static struct group *
new_group (struct merge *m, bool write, void *conn, struct member *mb,
           uint32_t flags)
{
  struct group *g = calloc (1, sizeof *g);

  if (g == NULL)
    return NULL;
  g->write = write;
  g->conn = conn;
  g->lo = mb->offset;
  g->hi = mb->offset;
  g->last = &g->members;
  join (g, mb, flags);
  g->next = m->groups;
  m->groups = g;
  return g;
}

static void
unlink_group (struct merge *m, struct group *g)
{
  struct group **pp;

  for (pp = &m->groups; *pp != g; pp = &(*pp)->next)
    ;
  *pp = g->next;
}

/* Send one group to the plugin as one request (outside the lock). */
static int
send_group (nbdkit_next *next, struct reshape_handle *h, struct group *g,
            int *err)
{
  const uint32_t len = g->hi - g->lo;
  struct member *mb;
  unsigned n = 0;
  char *buf;
  int r;

  for (mb = g->members; mb; mb = mb->next)
    n++;
  if (n == 1) {                         /* alone: no copy */
    mb = g->members;
    return g->write
      ? reshape_split_pwrite (next, h, mb->wbuf, mb->count, mb->offset,
                              g->flags, err)
      : reshape_split_pread (next, h, mb->rbuf, mb->count, mb->offset, err);
  }
  reshape_stats_add (C_MERGES, n);
  buf = reshape_pool_get (len);
  if (buf == NULL) {
    *err = errno;
    nbdkit_error ("reshape: merge buffer: %m");
    return -1;
  }
  if (g->write) {
    /* Members in arrival order: a later write wins where they overlap. */
    for (mb = g->members; mb; mb = mb->next)
      memcpy (buf + (mb->offset - g->lo), mb->wbuf, mb->count);
    r = reshape_split_pwrite (next, h, buf, len, g->lo, g->flags, err);
  }
  else {
    r = reshape_split_pread (next, h, buf, len, g->lo, err);
    for (mb = g->members; r == 0 && mb; mb = mb->next)
      memcpy (mb->rbuf, buf + (mb->offset - g->lo), mb->count);
  }
  reshape_pool_put (buf, len);
  return r;
}

/* Take this member's result; the last one out frees the group. */
static int
leave (struct merge *m, struct group *g, int *err)
{
  int r = g->err ? -1 : 0;

  if (g->err)
    *err = g->err;
  if (--g->refs == 0)
    free (g);
  return r;
}

static int
merged (nbdkit_next *next, struct reshape_handle *h, bool write,
        struct member *mb, uint32_t flags, int *err)
{
  struct merge *m = &h->exp->merge;
  void *conn = h->multi_conn ? NULL : h;
  struct group *g;
  int r, e = 0;

  pthread_mutex_lock (&m->lock);
  g = find_group (m, write, conn, mb->offset, mb->count, h->geo.size);
  if (g) {                              /* ride along */
    join (g, mb, flags);
    while (!g->done)
      pthread_cond_wait (&m->changed, &m->lock);
    r = leave (m, g, err);
    pthread_mutex_unlock (&m->lock);
    return r;
  }
  /* Every request at the plugin is a group, so that neighbours can see
   * it is busy; alone it is sent from the client's own buffer.
   */
  g = new_group (m, write, conn, mb, flags);
  if (g == NULL) {
    pthread_mutex_unlock (&m->lock);
    *err = ENOMEM;
    return -1;
  }
  if (busy_stream (m, g, mb->offset, mb->count, h->geo.size))
    while (m->inflight >= MERGE_INFLIGHT)  /* others join meanwhile */
      pthread_cond_wait (&m->changed, &m->lock);
  g->launched = true;
  m->inflight++;
  pthread_mutex_unlock (&m->lock);

  r = send_group (next, h, g, &e);

  pthread_mutex_lock (&m->lock);
  m->inflight--;
  g->err = r == -1 ? e : 0;
  g->done = true;
  unlink_group (m, g);
  pthread_cond_broadcast (&m->changed);
  r = leave (m, g, err);
  pthread_mutex_unlock (&m->lock);
  return r;
}

void
reshape_merge_init (struct merge *m)
{
  pthread_mutex_init (&m->lock, NULL);
  pthread_cond_init (&m->changed, NULL);
  m->groups = NULL;
  m->inflight = 0;
}

void
reshape_merge_destroy (struct merge *m)
{
  pthread_cond_destroy (&m->changed);
  pthread_mutex_destroy (&m->lock);
}

/* Not with a minimum block size: a merged request could then need a
 * bounce buffer while holding its merge buffer, and two buffers held
 * at once could starve each other in a small pool.
 */
static bool
mergeable (const struct reshape_handle *h, uint32_t count)
{
  return reshape_cfg.merge && reshape_parallel_ok && h->geo.min == 1 &&
    count < h->geo.size;
}

int
reshape_merge_pread (nbdkit_next *next, struct reshape_handle *h,
                     void *buf, uint32_t count, uint64_t offset, int *err)
{
  struct member mb = { .offset = offset, .count = count, .rbuf = buf };

  if (!mergeable (h, count))
    return reshape_split_pread (next, h, buf, count, offset, err);
  return merged (next, h, false, &mb, 0, err);
}

int
reshape_merge_pwrite (nbdkit_next *next, struct reshape_handle *h,
                      const void *buf, uint32_t count, uint64_t offset,
                      uint32_t flags, int *err)
{
  struct member mb = { .offset = offset, .count = count, .wbuf = buf };

  if (!mergeable (h, count))
    return reshape_split_pwrite (next, h, buf, count, offset, flags, err);
  return merged (next, h, true, &mb, flags, err);
}
