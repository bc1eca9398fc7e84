/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * SO_SNDBUF on unix-socket client connections.  nbdkit hands filters
 * no socket, so when a client connects the process's descriptors are
 * scanned for the connections nbdkit accepted: unix stream sockets
 * not listening whose local name is that of one of nbdkit's listening
 * unix sockets (the plugin's outgoing sockets have no local name, and
 * TCP is no AF_UNIX); with no unix listener (-s), the unnamed one whose
 * peer is the connecting client's process (SO_PEERCRED).
 *
 * Each gets the size asked for if it has less: at once when the user
 * gave reshape-sndbuf, else at the connection's first read reply of
 * LARGE_REPLY or more (the scan cannot tell whose socket is whose, so
 * that raises every client socket open then).  A larger buffer pays
 * for replies that do not fit the kernel's default (208K) and costs
 * small ones (tunables.h).  A size the kernel caps (Linux:
 * net.core.wmem_max) is warned of once if the user gave it.
 */

#include <config.h>

#include <dirent.h>
#include <stddef.h>
#include <inttypes.h>
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

/* Set at configuration, read-only after. */
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

/* nbdkit listens on one socket per -U path and systemd socket.
 * Without /proc descriptors are probed up to FALLBACK_MAX_FD.
 */
enum { MAX_LISTENERS = 16, FALLBACK_MAX_FD = 4096 };

struct unix_name {
  socklen_t len;
  struct sockaddr_un addr;
};

struct scan {
  struct unix_name listeners[MAX_LISTENERS];
  unsigned nr_listeners;
  uint32_t want;
  int64_t client_pid;             /* -s */
};

/* A unix stream socket: its local name, and whether it listens. */
static bool
unix_stream (int fd, struct unix_name *name, bool *listening)
{
  struct stat st;
  int type = 0, acc = 0;
  socklen_t len = sizeof type;

  name->len = sizeof name->addr;
  if (fstat (fd, &st) == -1 || !S_ISSOCK (st.st_mode) ||
      getsockopt (fd, SOL_SOCKET, SO_TYPE, &type, &len) == -1 ||
      type != SOCK_STREAM ||
      getsockname (fd, (struct sockaddr *) &name->addr, &name->len) == -1 ||
      name->addr.sun_family != AF_UNIX)
    return false;
  len = sizeof acc;
#ifdef SO_ACCEPTCONN
  if (getsockopt (fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &len) == -1)
    acc = 0;
#endif
  *listening = acc != 0;
  return true;
}

static bool
sockbuf_named (const struct unix_name *n)
{
  return n->len > offsetof (struct sockaddr_un, sun_path);
}

static void
for_each_fd (void (*fn) (int fd, struct scan *s), struct scan *s)
{
  DIR *dir = opendir ("/proc/self/fd");
  struct dirent *d;
  int fd, maxfd = FALLBACK_MAX_FD;

  if (dir) {
    while ((d = readdir (dir)) != NULL)
      if (d->d_name[0] >= '0' && d->d_name[0] <= '9' &&
          (fd = atoi (d->d_name)) != dirfd (dir))
        fn (fd, s);
    closedir (dir);
    return;
  }
#ifdef HAVE_GETRLIMIT
  struct rlimit rl;
  if (getrlimit (RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (rlim_t) maxfd)
    maxfd = rl.rlim_cur;
#endif
  for (fd = 0; fd < maxfd; fd++)
    fn (fd, s);
}

static void
find_listener (int fd, struct scan *s)
{
  struct unix_name n;
  bool listening;

  if (s->nr_listeners < MAX_LISTENERS &&
      unix_stream (fd, &n, &listening) && listening && sockbuf_named (&n))
    s->listeners[s->nr_listeners++] = n;
}

static bool
is_client (const struct scan *s, int fd)
{
  struct unix_name n;
  bool listening;
  unsigned i;

  if (!unix_stream (fd, &n, &listening) || listening)
    return false;
  if (!sockbuf_named (&n)) {
#ifdef SO_PEERCRED
    struct ucred cred;
    socklen_t len = sizeof cred;

    return s->nr_listeners == 0 && s->client_pid > 0 &&
      getsockopt (fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 &&
      cred.pid == s->client_pid;
#else
    return false;
#endif
  }
  for (i = 0; i < s->nr_listeners; i++)
    if (s->listeners[i].len == n.len &&
        memcmp (s->listeners[i].addr.sun_path, n.addr.sun_path,
                n.len - offsetof (struct sockaddr_un, sun_path)) == 0)
      return true;
  return false;
}

static void
raise_one (int fd, struct scan *s)
{
  static int warned, capped;
  /* Linux doubles what it is given (socket(7)) and reports that. */
#ifdef __linux__
  const int target = s->want > INT32_MAX / 2 ? INT32_MAX : (int) s->want * 2;
#else
  const int target = s->want > INT32_MAX ? INT32_MAX : (int) s->want;
#endif
  int cur = 0, val = s->want;
  socklen_t len = sizeof cur;

  if (!is_client (s, fd) ||
      getsockopt (fd, SOL_SOCKET, SO_SNDBUF, &cur, &len) == -1)
    return;
  /* Once the kernel capped it, a socket at the cap is done: not set
   * (and counted) again at every new connection.
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
  struct scan s = { .want = want };

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
  sc->pending = conf.size && !conf.given;
  if (conf.size && conf.given)
    raise_all (conf.size);
}

void
sockbuf_reply (struct sockbuf_conn *sc, uint32_t count)
{
  if (count >= LARGE_REPLY &&
      __atomic_load_n (&sc->pending, __ATOMIC_RELAXED) &&
      __atomic_exchange_n (&sc->pending, false, __ATOMIC_RELAXED))
    raise_all (conf.size);
}
