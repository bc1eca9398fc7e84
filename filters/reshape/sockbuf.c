/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * SO_SNDBUF on unix-socket client connections.  nbdkit hands filters
 * no socket, so when a client connects we look through this process's
 * file descriptors for the connections nbdkit accepted:
 *
 *   - unix stream sockets that are not listening, whose local name is
 *     the name of one of our listening unix sockets (an accepted unix
 *     socket carries the listener's name; sockets the plugin connected
 *     out with have no local name, and TCP is not AF_UNIX);
 *   - with no unix listener (-s mode: nbdkit moved stdin/stdout to
 *     other descriptors), the unnamed connected unix socket whose peer
 *     is the process of the client now connecting (SO_PEERCRED).
 *
 * Each one gets the asked send buffer if that is larger than what it
 * has: at once when the user gave reshape-sndbuf, else (the default)
 * at the connection's first read reply of LARGE_REPLY or more.  (The
 * scan cannot tell whose socket is whose, so that raises every client
 * socket open at the time.)  A larger buffer pays for large replies,
 * which do not fit the kernel's default (208K for unix sockets), and
 * costs small ones (DEFAULT_SNDBUF and LARGE_REPLY in tunables.h, and
 * docs/design.md, say what was measured).
 *
 * The size the kernel actually grants is recorded, and a warning is
 * given once if the kernel capped a size the user gave (Linux:
 * net.core.wmem_max); a capped default is only a debug message.
 */

#include <config.h>

#include <dirent.h>
#include <stddef.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/types.h>
#ifdef HAVE_SYS_SOCKET_H
#include <sys/socket.h>
#endif
#ifdef HAVE_SYS_UN_H
#include <sys/un.h>
#endif
#ifdef HAVE_GETRLIMIT
#include <sys/resource.h>
#endif

#include <nbdkit-filter.h>

#include "sockbuf.h"
#include "stats.h"
#include "tunables.h"
#include "warn.h"

NBDKIT_DLL_PUBLIC int reshape_debug_sockbuf;


/* Set once at configuration, read-only after. */
static struct {
  bool given;                     /* reshape-sndbuf was set */
  uint32_t size;                  /* 0: off */
} conf;

void
sockbuf_configure (bool given, uint32_t size)
{
  conf.given = given;
  conf.size = given ? size : DEFAULT_SNDBUF;
}

#if defined (HAVE_SYS_SOCKET_H) && defined (HAVE_SYS_UN_H) && \
  defined (SO_SNDBUF)

/* nbdkit listens on one socket per -U path, address family and
 * systemd socket: MAX_LISTENERS is more than seen in practice.
 * Without /proc the descriptors are probed one by one: FALLBACK_MAX_FD
 * at most, whatever RLIMIT_NOFILE allows.
 */
enum { MAX_LISTENERS = 16, FALLBACK_MAX_FD = 4096 };

struct unix_name {
  socklen_t len;
  struct sockaddr_un addr;
};

struct scan {
  struct unix_name listeners[MAX_LISTENERS];
  unsigned nr_listeners;
  uint32_t want;                  /* reshape-sndbuf */
  int64_t client_pid;             /* -s mode only */
};

/* Unix stream socket?  Fills in its local name and whether it listens. */
static bool
unix_stream (int fd, struct unix_name *name, bool *listening)
{
  struct stat st;
  int type = 0, acc = 0;
  socklen_t len = sizeof type;

  if (fstat (fd, &st) == -1 || !S_ISSOCK (st.st_mode))
    return false;
  if (getsockopt (fd, SOL_SOCKET, SO_TYPE, &type, &len) == -1 ||
      type != SOCK_STREAM)
    return false;
  name->len = sizeof name->addr;
  if (getsockname (fd, (struct sockaddr *) &name->addr, &name->len) == -1 ||
      name->addr.sun_family != AF_UNIX)
    return false;
  *listening = false;
#ifdef SO_ACCEPTCONN
  len = sizeof acc;
  if (getsockopt (fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &len) == 0)
    *listening = acc != 0;
#endif
  return true;
}

static bool
named (const struct unix_name *n)
{
  return n->len > offsetof (struct sockaddr_un, sun_path);
}

static bool
same_name (const struct unix_name *a, const struct unix_name *b)
{
  return a->len == b->len &&
    memcmp (a->addr.sun_path, b->addr.sun_path,
            a->len - offsetof (struct sockaddr_un, sun_path)) == 0;
}

/* -s mode: is fd's peer the client connecting now? */
static bool
is_stdio_connection (const struct scan *s, int fd)
{
#ifdef SO_PEERCRED
  struct ucred cred;
  socklen_t len = sizeof cred;

  if (s->nr_listeners > 0 || s->client_pid <= 0)
    return false;
  return getsockopt (fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 &&
    cred.pid == s->client_pid;
#else
  return false;
#endif
}

/* Call fn on every open file descriptor. */
static void
for_each_fd (void (*fn) (int fd, void *opaque), void *opaque)
{
  DIR *dir = opendir ("/proc/self/fd");
  struct dirent *d;
  int maxfd = FALLBACK_MAX_FD;

  if (dir) {
    while ((d = readdir (dir)) != NULL) {
      int fd;
      if (d->d_name[0] < '0' || d->d_name[0] > '9')
        continue;
      fd = atoi (d->d_name);
      if (fd != dirfd (dir))
        fn (fd, opaque);
    }
    closedir (dir);
    return;
  }
  /* No /proc: try descriptors up to the limit (bounded). */
#ifdef HAVE_GETRLIMIT
  {
    struct rlimit rl;
    if (getrlimit (RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        rl.rlim_cur < (rlim_t) maxfd)
      maxfd = rl.rlim_cur;
  }
#endif
  for (int fd = 0; fd < maxfd; fd++)
    fn (fd, opaque);
}

static void
find_listener (int fd, void *opaque)
{
  struct scan *s = opaque;
  struct unix_name n;
  bool listening;

  if (s->nr_listeners < MAX_LISTENERS &&
      unix_stream (fd, &n, &listening) && listening && named (&n))
    s->listeners[s->nr_listeners++] = n;
}

static bool
is_client_connection (const struct scan *s, int fd)
{
  struct unix_name n;
  bool listening;
  unsigned i;

  if (!unix_stream (fd, &n, &listening) || listening)
    return false;
  if (!named (&n))
    return is_stdio_connection (s, fd);
  for (i = 0; i < s->nr_listeners; i++)
    if (same_name (&s->listeners[i], &n))
      return true;
  return false;
}

/* Linux doubles what it is given (socket(7)) and reports the double. */
static int
kernel_value (uint32_t want)
{
#ifdef __linux__
  return want > INT32_MAX / 2 ? INT32_MAX : (int) want * 2;
#else
  return want > INT32_MAX ? INT32_MAX : (int) want;
#endif
}

static void
raise_one (int fd, void *opaque)
{
  const struct scan *s = opaque;
  static int warned, capped;
  int cur = 0, val = s->want, target = kernel_value (s->want);
  socklen_t len = sizeof cur;

  if (!is_client_connection (s, fd))
    return;
  if (getsockopt (fd, SOL_SOCKET, SO_SNDBUF, &cur, &len) == -1)
    return;
  /* Once the kernel capped us, a socket at the cap is as done as it
   * gets: do not set (and count) it again at every new connection.
   */
  if (__atomic_load_n (&capped, __ATOMIC_RELAXED) &&
      cur >= __atomic_load_n (&capped, __ATOMIC_RELAXED))
    return;
  if (cur < target) {
    if (setsockopt (fd, SOL_SOCKET, SO_SNDBUF, &val, sizeof val) == -1) {
      nbdkit_debug ("reshape: setsockopt SO_SNDBUF fd %d: %m", fd);
      return;
    }
    len = sizeof cur;
    if (getsockopt (fd, SOL_SOCKET, SO_SNDBUF, &cur, &len) == -1)
      return;
    stats_add (C_SOCK_RAISED, 1);
    if (cur < target)
      __atomic_store_n (&capped, cur, __ATOMIC_RELAXED);
    if (cur < target && !conf.given)
      nbdkit_debug ("reshape: default send buffer capped by the kernel "
                    "at %d bytes", cur);
    else if (cur < target &&
             __atomic_exchange_n (&warned, 1, __ATOMIC_RELAXED) == 0)
      reshape_warning ("reshape-sndbuf: the kernel capped the send "
                       "buffer at %d bytes (asked %" PRIu32 "); raise "
                       "net.core.wmem_max to allow more", cur, s->want);
  }
  stats_max (C_SOCK_OBTAINED, cur);
  if (reshape_debug_sockbuf)
    nbdkit_debug ("reshape: client socket fd %d: SO_SNDBUF %d", fd, cur);
}

static void
raise_all (uint32_t want)
{
  struct scan s = { .nr_listeners = 0, .want = want };

  if (want == 0)
    return;
  for_each_fd (find_listener, &s);
  if (s.nr_listeners == 0)
    s.client_pid = nbdkit_peer_pid ();
  for_each_fd (raise_one, &s);
}

#else /* no unix sockets */

static void
raise_all (uint32_t want)
{
}

#endif

void
sockbuf_open (struct sockbuf_conn *sc)
{
  sc->pending = false;
  if (conf.size == 0)
    return;
  if (conf.given)
    raise_all (conf.size);
  else
    sc->pending = true;
}

void
sockbuf_reply (struct sockbuf_conn *sc, uint32_t count)
{
  if (count >= LARGE_REPLY &&
      __atomic_load_n (&sc->pending, __ATOMIC_RELAXED) &&
      __atomic_exchange_n (&sc->pending, false, __ATOMIC_RELAXED))
    raise_all (conf.size);
}
