/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * Merging of concurrent small requests.  A small read or write (below
 * reshape-size) joins a filling group that it touches; a group goes to
 * the plugin as one request of up to reshape-size.  When a group goes
 * is clocked by its own stream, never by a timer:
 *
 *   - a request with no neighbour at the plugin (a lone synchronous
 *     client, random requests) goes at once, from its own buffer;
 *   - otherwise the group goes once it holds as many requests as its
 *     neighbours at the plugin held when it was formed, or when those
 *     are all back.
 *
 * So a client keeping N adjacent requests in flight settles into two
 * groups of N/2 that overlap at the plugin.  A waiting request waits
 * at most one plugin round trip of its neighbours.
 *
 * Groups join only requests of connections that see the same export
 * size and request size.  When a group of several fails, each member
 * sends its own range again from its own connection, so that one
 * member's bad range, or the close of the leader's connection, never
 * fails another member.
 *
 * A merged write is acknowledged to each client only after the plugin
 * request holding it succeeded; a group carries FUA when any member
 * asked for it.  Groups mix connections only when the plugin allows
 * multi-conn, so that a flush on any connection covers what it wrote.
 *
 * Measured (bench/results): QEMU keeps 16 of its 64 queued 4K writes
 * in flight, scattered over the queue's 256K, so few of them touch:
 * 1.36x fewer plugin calls, 1.75x as long.  Hence merging is opt-in
 * (reshape-merge=true); write-back (writeback.c) is what combines
 * such writes.
 *
 * The lock of an export's groups is never held across I/O: a leader
 * drops it to send its group, and retakes it to mark the group done.
 */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <nbdkit-filter.h>

#include "common.h"
#include "params.h"
#include "merge.h"
#include "pool.h"
#include "split.h"
#include "stats.h"

struct merge {
  pthread_mutex_t lock;
  pthread_cond_t changed;
  struct group *groups;     /* filling or at the plugin */
  uint64_t launches;        /* groups sent so far */
};

struct member {
  uint64_t offset;
  uint32_t count;
  char *rbuf;                   /* pread */
  const char *wbuf;             /* pwrite */
  uint32_t flags;               /* pwrite: the client's flags */
  struct group *group;          /* changes when its group is absorbed */
  struct member *next;
};

struct group {
  bool write;
  bool launched;
  bool done;
  void *conn;                   /* NULL: any connection may join */
  const struct geometry *geo;   /* the leader's: joiners must match */
  uint64_t born;                /* launches when it was formed */
  uint64_t seq;                 /* its launch number, once launched */
  uint32_t flags;
  uint64_t lo, hi;              /* union of the members: contiguous */
  struct member *leader;        /* the member that sends the group */
  struct member *members, **last;
  unsigned n;                   /* members */
  unsigned refs;                /* members still to read the result */
  int err;
  struct group *next;
};

static bool
touches (uint64_t lo, uint64_t hi, uint64_t offset, uint64_t end)
{
  return offset <= hi && lo <= end;
}

static bool
same_geometry (const struct geometry *a, const struct geometry *b)
{
  return a->exportsize == b->exportsize && a->size == b->size;
}

/* Could [offset, end) of a connection with geometry geo share filling
 * group g?
 */
static bool
fits (const struct group *g, bool write, void *conn,
      const struct geometry *geo, uint64_t offset, uint64_t end)
{
  const uint32_t size = geo->size;
  uint64_t lo, hi;

  if (g->launched || g->write != write || g->conn != conn ||
      !same_geometry (g->geo, geo) || !touches (g->lo, g->hi, offset, end))
    return false;
  lo = g->lo < offset ? g->lo : offset;
  hi = g->hi > end ? g->hi : end;
  return hi - lo <= size;
}

static struct group *
find_group (struct merge *m, const struct group *self, bool write,
            void *conn, const struct geometry *geo, uint64_t offset,
            uint64_t end)
{
  struct group *g;

  for (g = m->groups; g; g = g->next)
    if (g != self && fits (g, write, conn, geo, offset, end))
      return g;
  return NULL;
}

static void
join (struct group *g, struct member *mb)
{
  if (mb->offset < g->lo) g->lo = mb->offset;
  if (mb->offset + mb->count > g->hi) g->hi = mb->offset + mb->count;
  g->flags |= mb->flags & NBDKIT_FLAG_FUA;
  mb->group = g;
  mb->next = NULL;
  *g->last = mb;
  g->last = &mb->next;
  g->n++;
  g->refs++;
}

static struct group *
new_group (struct merge *m, bool write, void *conn,
           const struct geometry *geo, struct member *mb)
{
  struct group *g = calloc (1, sizeof *g);

  if (g == NULL)
    return NULL;
  g->write = write;
  g->conn = conn;
  g->geo = geo;
  g->born = m->launches;
  g->lo = g->hi = mb->offset;
  g->leader = mb;
  g->last = &g->members;
  join (g, mb);
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

/* Requests of one stream reach the filter out of order, so two filling
 * groups can meet once the request between them arrives: the other
 * group then moves into g and its leader becomes a member.  Members
 * are all in flight at once, so their order does not matter.
 */
static void
absorb_neighbours (struct merge *m, struct group *g)
{
  struct group *o;

  while ((o = find_group (m, g, g->write, g->conn, g->geo, g->lo, g->hi))
         != NULL) {
    struct member *mb, *next;

    unlink_group (m, o);
    if (o->born < g->born)      /* the older waiter's bound holds */
      g->born = o->born;
    for (mb = o->members; mb; mb = next) {
      next = mb->next;
      join (g, mb);
    }
    free (o);
  }
}

/* Requests that this group's stream had at the plugin when the group
 * was formed and still has: groups of its kind and connection within
 * reshape-size of it.  Groups launched later do not count, so steady
 * traffic nearby cannot hold a group back for more than one round
 * trip.
 */
static unsigned
busy_neighbours (struct merge *m, const struct group *self)
{
  const uint32_t size = self->geo->size;
  const uint64_t lo = self->lo > size ? self->lo - size : 0;
  const uint64_t hi = self->hi + size;
  unsigned busy = 0;
  struct group *g;

  for (g = m->groups; g; g = g->next)
    if (g->launched && g->seq <= self->born && g->write == self->write &&
        g->conn == self->conn && touches (g->lo, g->hi, lo, hi))
      busy += g->n;
  return busy;
}

static bool
may_launch (struct merge *m, const struct group *g)
{
  return g->hi - g->lo >= g->geo->size || g->n >= busy_neighbours (m, g);
}

/* One member on its own, from its own buffer and connection. */
static int
send_alone (const struct io *io, bool write, const struct member *mb,
            int *err)
{
  return write
    ? split_pwrite (io, mb->wbuf, mb->count, mb->offset, mb->flags, err)
    : split_pread (io, mb->rbuf, mb->count, mb->offset, err);
}

/* Send one group to the plugin as one request (outside the lock). */
static int
send_group (const struct io *io, struct group *g, int *err)
{
  const uint32_t len = g->hi - g->lo;
  struct member *mb;
  char *buf;
  int r;

  if (g->n == 1)                        /* alone: no copy */
    return send_alone (io, g->write, g->members, err);
  buf = pool_get (POOL_REQUEST, len);
  if (buf == NULL) {
    /* No memory to spare: each member goes alone (see merged). */
    *err = ENOMEM;
    return -1;
  }
  stats_add (C_MERGES, g->n);
  if (g->write) {
    for (mb = g->members; mb; mb = mb->next)
      memcpy (buf + (mb->offset - g->lo), mb->wbuf, mb->count);
    r = split_pwrite (io, buf, len, g->lo, g->flags, err);
  }
  else {
    r = split_pread (io, buf, len, g->lo, err);
    for (mb = g->members; r == 0 && mb; mb = mb->next)
      memcpy (mb->rbuf, buf + (mb->offset - g->lo), mb->count);
  }
  pool_put (POOL_REQUEST, buf, len);
  return r;
}

/* The leader sends its group; called and returns with the lock held. */
static void
launch (const struct io *io, struct merge *m, struct group *g)
{
  int r, e = 0;

  g->launched = true;
  g->seq = ++m->launches;
  pthread_mutex_unlock (&m->lock);
  r = send_group (io, g, &e);
  pthread_mutex_lock (&m->lock);
  g->err = r == -1 ? e : 0;
  g->done = true;
  unlink_group (m, g);
  pthread_cond_broadcast (&m->changed);
}

static int
merged (struct merge *m, const struct io *io, void *conn, bool write,
        struct member *mb, int *err)
{
  struct group *g;
  bool again;
  int e;

  pthread_mutex_lock (&m->lock);       /* dropped to wait and to send */
  g = find_group (m, NULL, write, conn, io->geo, mb->offset,
                  mb->offset + mb->count);
  if (g)
    join (g, mb);
  else if ((g = new_group (m, write, conn, io->geo, mb)) == NULL) {
    pthread_mutex_unlock (&m->lock);
    *err = ENOMEM;
    return -1;
  }
  absorb_neighbours (m, g);
  pthread_cond_broadcast (&m->changed);    /* leaders recount */

  /* Every member waits for its group; the leader of a filling group
   * launches it when its stream allows.  Groups at the plugin only
   * come back, so every wait ends.
   */
  for (;;) {
    g = mb->group;
    if (g->done)
      break;
    if (g->leader == mb && !g->launched && may_launch (m, g))
      launch (io, m, g);
    else
      pthread_cond_wait (&m->changed, &m->lock);
  }
  e = g->err;
  again = e && g->n > 1;
  if (--g->refs == 0)
    free (g);
  pthread_mutex_unlock (&m->lock);

  if (again)
    return send_alone (io, write, mb, err);
  if (e) {
    *err = e;
    return -1;
  }
  return 0;
}

struct merge *
merge_new (void)
{
  struct merge *m = calloc (1, sizeof *m);

  if (m == NULL)
    return NULL;
  pthread_mutex_init (&m->lock, NULL);
  pthread_cond_init (&m->changed, NULL);
  return m;
}

void
merge_free (struct merge *m)
{
  pthread_cond_destroy (&m->changed);
  pthread_mutex_destroy (&m->lock);
  free (m);
}

/* Small requests only, with threads to hold them (a fully parallel
 * stack), and a merge buffer the pool can lend.  Not with a minimum
 * block size: merged requests then need no bounce buffers and no
 * read-modify-write of blocks they share.
 */
static bool
mergeable (const struct io *io, uint32_t count)
{
  return reshape_cfg.parallel_ok && io->geo->min == 1 &&
    count < io->geo->size && io->geo->size <= pool_largest (POOL_REQUEST);
}

int
merge_pread (struct merge *m, const struct io *io, void *conn,
             void *buf, uint32_t count, uint64_t offset, int *err)
{
  struct member mb = { .offset = offset, .count = count, .rbuf = buf };

  if (!mergeable (io, count))
    return split_pread (io, buf, count, offset, err);
  return merged (m, io, conn, false, &mb, err);
}

int
merge_pwrite (struct merge *m, const struct io *io, void *conn,
              const void *buf, uint32_t count, uint64_t offset,
              uint32_t flags, int *err)
{
  struct member mb = { .offset = offset, .count = count, .wbuf = buf,
                       .flags = flags };

  if (!mergeable (io, count))
    return split_pwrite (io, buf, count, offset, flags, err);
  return merged (m, io, conn, true, &mb, err);
}
