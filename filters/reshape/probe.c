/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * reshape-size=auto: the probe, which learns what tune.c keeps.
 *
 * When the first client connects to an export, before it is told
 * the preferred block size, the filter times single reads of
 * growing size (4K, 16K, 64K, ... up to 16M, each at a fresh offset),
 * stopping as soon as the shape is clear (the flat cost the others
 * are held to is the fastest read of the flat part):
 *
 *   - a 4K read answered in under PLUGIN_SLOW_NS, at once or when
 *     read again at the same place (first_touch): no latency to
 *     amortize (memory, the page cache); nothing more to learn;
 *   - otherwise the cost stays flat while the size grows, up to the
 *     grain G (a per-call cost: latency, or a cluster decoded whole),
 *     then grows; one more read halfway finds the knee.  The smallest
 *     read's time is the per-call cost L, and the knee's time beyond
 *     it gives the bandwidth B of one stream (L + s/B for s > G).
 *     A read that looks above the flat cost is checked against a
 *     base read and read again (more often if the base reads vary),
 *     so that a busy machine's slow reads or a plugin's jitter are
 *     not taken for the knee; a probe whose base reads slow down
 *     while the filter has other calls in flight to the plugin (for
 *     clients, readahead, write-back: queued in front of its own)
 *     gives up (see above_flat).
 *
 * That costs ten to fifteen reads, most of them small (20 ms at 1 ms
 * and 400 MB/s, 0.1 s for 2M clusters decoded in 8 ms).  A plugin
 * whose 4K read takes BESIDE_NS or more would hold the handshake for
 * half a second or more (20 ms and 100 MB/s): if it takes requests in
 * parallel, the probe goes on in a thread, reading through the first
 * connection's plugin context, and the connections made meanwhile
 * start with the static sizes, but told a preferred size from one 1M
 * read more, and their large requests cut by what that read and the
 * first show (go_beside, beside_hint, tune_start_sizes, model_for).
 */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>

#include <nbdkit-filter.h>

#include "common.h"
#include "params.h"
#include "probe.h"
#include "profile.h"
#include "tune.h"

#define KNEE 1.5                        /* "costs more" */
#define FAST_RETRY_NS (1000 * 1000)     /* a 4K read this fast ... */
#define FAST_RETRIES 10                 /* ... is tried this often */
#define BESIDE_NS (15 * 1000 * 1000)    /* a 4K read this slow: beside */
#define SLOW_PREFERRED (256 * 1024)     /* ... told meanwhile, at least */
#define HINT_READ (1024 * 1024)         /* ... at most, read to know */
#define WAIT_S 10                       /* for another's probe, at most */

/* One probe: the plugin, a buffer for its largest read, the next
 * fresh place to read, and the flat cost found so far.
 */
struct probe {
  nbdkit_next *next;
  struct tune *beside;                  /* set: a probe beside, cancelable */
  const struct geometry *geo;
  char *buf;
  uint32_t base;                        /* the smallest read */
  double flat;                          /* its fastest time so far */
  double base_max;                      /* its slowest, nothing beside */
  unsigned place;                       /* the next fresh place */
  unsigned reads;                       /* reads made */
  bool loaded;                          /* plugin calls beside the last */
  bool loaded_any;                      /* ... beside any read so far */
  unsigned busy;                        /* checks the plugin was busy for */
  double floor;                         /* t->floor_ns then, 0: none */
};

/* Each place is its own part of the export, so that no read finds
 * what an earlier one brought into a cache below the filter (a cache
 * would make a slow plugin look fast).  A probe reads at most about
 * thirty places (beyond PLACES, it reads them again).
 */
#define PLACES 32

static uint64_t
probe_offset (const struct geometry *geo, uint32_t len, unsigned place)
{
  uint64_t room = geo->exportsize - len;

  return round_down (room / PLACES * (place % PLACES),
                     max_u64 (len, geo->min));
}

/* Is the connection whose plugin context a probe beside reads ending? */
static bool
cancelled (struct tune *t)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);
  return t->cancel;
}

/* Time a read of len bytes at a place; -1 on error.  The buffer is
 * touched first: the read times the plugin, not page faults.
 */
static double
time_read (struct probe *p, uint32_t len, unsigned place)
{
  uint64_t start;
  int err;

  if (p->beside && cancelled (p->beside))
    return -1;
  memset (p->buf, 0, len);
  p->reads++;
  p->loaded = tune_plugin_busy ();
  start = now_ns ();
  if (p->next->pread (p->next, p->buf, len,
                      probe_offset (p->geo, len, place), 0, &err) == -1)
    return -1;
  p->loaded |= tune_plugin_busy ();
  p->loaded_any |= p->loaded;
  return now_ns () - start;
}

static double
time_fresh (struct probe *p, uint32_t len)
{
  return time_read (p, len, p->place++);
}

/* Does a read of s bytes cost more than the flat part?  One read can
 * be slowed by anything (a busy machine, a page fault), and one slow
 * read taken for the knee would cut requests for as long as the
 * filter runs, so a read that looks above the flat cost is checked,
 * twice: a read of the base size, then a read of s again, each at a
 * fresh place.  A check holds if the repeat is above both the flat
 * cost and the base read next to it.  s is above only if both checks
 * hold: on a loaded machine (a CI run beside other tests) two slow
 * reads in a row were seen to pass one check about once in twenty
 * probes.  A repeat that looks flat settles it the other way.
 *
 * A base read above the flat cost while the filter's other calls to
 * the plugin were in flight settles nothing: the plugin is busier than
 * when the flat cost was found, and a repeat slowed alike would pass
 * for flat.  Every size would then look flat up to the largest read,
 * and clients would be told 8M for good (seen beside a client keeping
 * 8 reads in flight over a plugin that decodes one cluster at a time:
 * every probe read waited 0.18 s behind the client's).  Such checks do
 * not count; the BUSY_CHECKS'th makes the probe give up, and the next
 * connection probes anew.  (With no other call in flight, a slow base
 * read is the plugin's own variance, a disk's seek or a network's
 * jitter, and counts as doubt, so as flat.)  1 above, 0 flat, -1 error
 * or busy; *ts is the fastest read of s.
 */
#define CHECKS 2
#define NOISY_CHECKS 5
#define BUSY_CHECKS 4

/* A plugin's own variance (a network's jitter): the base reads made
 * with nothing else in flight differ by more than KNEE (not counting
 * a fresh place's first, which may pay for the process warming up,
 * or for the plugin faulting memory in: first_touch).  A repeat of a
 * small read is then above the base read next to it by chance, often
 * enough to pass both checks (over 2 ms of latency and up to 8 ms of
 * jitter, 4 probes in 120 found a knee at 64K and told clients 32K:
 * the bandwidth was 200 MB/s, 64K costs 0.3 ms more than 4K).  Such a
 * plugin's knee must pass NOISY_CHECKS: a knee a real bandwidth makes
 * passes any number, and only grows with the size.
 */
static void
note_base (struct probe *p, double tb, bool loaded)
{
  if (!loaded && tb > p->base_max)
    p->base_max = tb;
}

static unsigned
checks (const struct probe *p)
{
  return p->base_max > KNEE * p->flat ? NOISY_CHECKS : CHECKS;
}

/* Did a base read of tb, made while the filter's calls were in flight
 * (loaded), wait behind them?  Judged by the fastest base read of
 * this probe or of an earlier one of the export (one that gave up:
 * this probe's own reads may all have waited in the same queue).
 */
static bool
busy (const struct probe *p, double tb, bool loaded)
{
  const double lowest = p->floor > 0 && p->floor < p->flat ?
    p->floor : p->flat;

  return loaded && tb > KNEE * lowest;
}

static int
above_flat (struct probe *p, uint32_t s, double *ts)
{
  unsigned k;

  if ((*ts = time_fresh (p, s)) < 0)
    return -1;
  if (*ts <= KNEE * p->flat) {
    p->flat = *ts < p->flat ? *ts : p->flat;
    return 0;
  }
  k = 0;
  while (k < checks (p)) {
    double tb = time_fresh (p, p->base);
    const bool loaded = p->loaded;
    double again = tb < 0 ? -1 : time_fresh (p, s);
    if (again < 0)
      return -1;
    note_base (p, tb, loaded);
    *ts = again < *ts ? again : *ts;
    p->flat = tb < p->flat ? tb : p->flat;
    if (again <= KNEE * p->flat)
      return 0;
    if (busy (p, tb, loaded)) {         /* no check */
      if (++p->busy >= BUSY_CHECKS)
        return -1;
      continue;
    }
    if (again <= KNEE * tb)
      return 0;
    k++;
  }
  return 1;
}

/* A knee found at a small size is read once more, at four times the
 * size: a real cost per byte, or per cluster, makes that read cost at
 * least the knee's excess over the flat cost four times over (KNEE
 * spare); jitter that passed the checks of a small read by chance does
 * not.  Over 2 ms of latency and up to 8 ms of jitter, one seed's
 * probe found a knee at 64K in about 3 runs in 100 (a read's time near
 * a threshold sent it down a path whose base reads did not vary enough
 * to count as noisy) and told clients 32K: that knee predicted 18 ms
 * for a 256K read, which the plugin never takes.  Telling clients less
 * than 64K is the costly mistake (every request pays the latency), and
 * a knee that small is cheap to confirm: one read of at most 256K.
 * 1 it grows, 0 noise, -1 error.
 */
#define CONFIRM_MAX (64 * 1024)

static int
knee_grows (struct probe *p, uint64_t s, double ts, uint64_t limit)
{
  double t4;

  if (s > CONFIRM_MAX || 4 * s > limit)
    return 1;
  if ((t4 = time_fresh (p, 4 * s)) < 0)
    return -1;
  return t4 >= p->flat + 4 * (ts - p->flat) / KNEE;
}

/* Find the knee: the grain G where the cost starts growing, and the
 * cost beyond it.  Sizes grow by 4; once a size costs more than the
 * flat cost, the size halfway is read too.
 */
static void
probe_shape (struct tune *t, struct probe *p, uint32_t limit)
{
  uint64_t s, knee = 0;
  double tk = 0;

  t->grain = p->base;
  for (s = p->base * 4; s <= limit; s *= 4) {
    double ts;
    int above = above_flat (p, s, &ts);
    if (above < 0)
      return;
    t->probe_ns[class_of (s)] = ts;
    if (above) {
      int grows = knee_grows (p, s, ts, limit);
      if (grows < 0)
        return;
      if (!grows)                       /* noise: flat */
        above = 0;
    }
    if (!above) {
      t->grain = s;
      continue;
    }
    /* The bandwidth comes from this read, the largest; the halfway
     * read only places the grain (and costs no more than this one:
     * more is noise).
     */
    knee = s;
    tk = ts;
    if (s / 2 > t->grain) {
      double th;
      above = above_flat (p, s / 2, &th);
      if (above < 0)
        return;
      t->probe_ns[class_of (s / 2)] = th < ts ? th : ts;
      if (!above)
        t->grain = s / 2;
    }
    break;
  }
  /* The smallest read is all per-call cost: L is its time, and the
   * knee's time beyond L is its transfer, s / B.  (A line through the
   * two reads either side of the knee tilts with a millisecond of
   * noise; this uses the widest span the probe has, and no read past
   * the knee, the probe's most costly.)  For clusters, L is one
   * cluster's cost and s / B what the others add.  The flat cost is
   * the fastest read of the flat part: the first reads of a process
   * may pay for its warming up.
   */
  if (knee && tk > p->flat) {
    t->lat_ns = p->flat;
    t->ns_per_byte = (tk - p->flat) / knee;
  }
  t->measured = true;
}

/* The base read.  A plugin without latency answers in microseconds,
 * but a busy machine or a first touch of memory may hold such reads
 * up; they are cheap to repeat, the fastest counting.  A read of a
 * millisecond or more is not repeated: it is a plugin with latency,
 * and every flat read of the probe lowers the flat cost if this one
 * was slow.  -1 on error.
 *
 * A read slow at a fresh place (but not slow enough to go beside) is
 * also read again at the same place (first_touch): one read more for
 * a plugin with latency.  If that is fast, what the first paid was bringing
 * the bytes in: a plugin's memory faulted in (a huge page zeroed at
 * first touch takes 0.1 ms; on a VM compacting memory, milliseconds).
 * Every request pays that once per region, whatever its size: it is
 * no per-call cost, and larger requests would not amortize it (they
 * cost the server and the client buffers instead: over such a plugin,
 * nbdcopy told 2M ran a third slower than at its own 256K).  A plugin
 * with latency pays it again.  A cache below the filter, over a plugin
 * with latency, looks the same, and is then passed requests as they
 * come, as without the filter: the safe side of the two mistakes.
 */
static double
first_touch (struct probe *p, double ts, unsigned place)
{
  double again;

  if (ts < PLUGIN_SLOW_NS || ts >= BESIDE_NS)
    return ts;
  again = time_read (p, p->base, place);
  if (again < 0)
    return -1;
  if (again < PLUGIN_SLOW_NS)
    return again;
  note_base (p, again, p->loaded);
  return ts;
}

static double
time_base (struct probe *p)
{
  double t0 = -1;

  do {
    const unsigned place = p->place;
    double ts = first_touch (p, time_fresh (p, p->base), place);
    if (ts < 0)
      return -1;
    t0 = t0 < 0 || ts < t0 ? ts : t0;
  } while (t0 >= PLUGIN_SLOW_NS && t0 < FAST_RETRY_NS &&
           p->reads < FAST_RETRIES);
  return t0;
}

/* One probe on its way: what it found so far (a scratch copy of the
 * export's learning, published whole at the end), where it reads, and
 * the context it reads through.  On the heap: it may go on in a thread
 * of its own, beside the connections.
 */
struct prober {
  struct tune *t;
  struct tune found;
  struct probe p;
  struct geometry geo;
  uint64_t limit;                       /* its largest read */
  uint32_t hint;                        /* told while it goes on beside */
  struct cut_model early;               /* cut by meanwhile */
  bool first_loaded;                    /* plugin calls beside p.flat */
};

/* The probe's buffer, of up to PROBE_MAX bytes, is mapped, not taken
 * from malloc.  glibc raises its mmap threshold to the size of the
 * largest mapped block freed (up to 32M): freeing a malloc'd 16M
 * buffer moved every later buffer of the process, nbdkit's own
 * per-thread request buffers among them, from maps of their own into
 * the heap, and with that changed their alignment.  On an AMD EPYC a
 * copy into a buffer 16 bytes past a 32-byte boundary runs about 8
 * times slower than into an aligned one, so that a whole nbdkit ran
 * twice as fast after a probe as without one, whatever the filter did.
 *
 * The probe reads at PROBE_SKEW past the page, where nbdkit 1.32's
 * request buffers of 128K and more sit (a malloc'd block with a map of
 * its own: 16 bytes past a page, on 64-bit glibc) until nbdkit itself
 * frees one (a connection's thread ending) and raises the threshold:
 * then later connections' buffers come from the heap, aligned as it
 * happens.  The pool, which frees idle buffers of 128K and more only
 * when it is at its cap, may do the same.
 */
#define PROBE_SKEW 16

static char *
probe_buffer (size_t len)
{
  char *p = mmap (NULL, len + PROBE_SKEW, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

  return p == MAP_FAILED ? NULL : p + PROBE_SKEW;
}

static void
probe_buffer_free (char *buf, size_t len)
{
  munmap (buf - PROBE_SKEW, len + PROBE_SKEW);
}

static struct prober *
prober_new (struct tune *t, nbdkit_next *next, const struct geometry *geo)
{
  struct prober *pr = calloc (1, sizeof *pr);

  if (pr == NULL)
    return NULL;
  pr->t = t;
  pr->geo = *geo;
  pr->limit = min_u64 (min_u64 (geo->exportsize, geo->max), PROBE_MAX);
  pr->p = (struct probe) {
    .next = next, .geo = &pr->geo, .base = max_u64 (4096, geo->min),
    .flat = -1,
  };
  if (pr->limit < pr->p.base ||
      (pr->p.buf = probe_buffer (pr->limit)) == NULL) {
    free (pr);
    return NULL;
  }
  return pr;
}

static void
prober_free (struct prober *pr)
{
  probe_buffer_free (pr->p.buf, pr->limit);
  free (pr);
}

/* The probe after its first reads (p.flat, -1 if they failed). */
static void
probe_rest (struct prober *pr)
{
  struct tune *found = &pr->found;
  struct probe *p = &pr->p;

  if (p->flat >= 0 && busy (p, p->flat, pr->first_loaded))
    p->busy = BUSY_CHECKS;              /* slower than an earlier probe */
  else if (p->flat >= 0) {
    if (p->flat >= PLUGIN_SLOW_NS)
      probe_shape (found, p, pow2_floor (pr->limit));
    /* Fast, or a first read slowed by warming up that a later flat
     * read belies: what the reads of other sizes found is noise.
     */
    if (p->flat < PLUGIN_SLOW_NS) {
      memset (found->probe_ns, 0, sizeof found->probe_ns);
      found->fast = found->measured = true;
      found->grain = 0;
      found->lat_ns = p->flat;
      found->ns_per_byte = 0;
    }
    found->probe_ns[class_of (p->base)] = p->flat;
  }
  found->probe_reads = p->reads;
}

/* What a probe found (in a scratch copy) becomes t's.  Lock held. */
static void
publish (struct tune *t, const struct tune *found)
{
  memcpy (t->probe_ns, found->probe_ns, sizeof t->probe_ns);
  t->probe_reads = found->probe_reads;
  t->fast = found->fast;
  t->grain = found->grain;
  t->lat_ns = found->lat_ns;
  t->ns_per_byte = found->ns_per_byte;
  tune_choose_sizes (t);
  t->measured = true;
}

/* The probe is over: what it found becomes the export's (or, if it
 * got no numbers, the next connection probes again).  Frees pr.
 */
static void
probe_done (struct prober *pr)
{
  struct tune *t = pr->t;
  const struct tune *found = &pr->found;
  bool measured = found->measured;
  unsigned c;

  if (reshape_debug_tune)
    for (c = 0; c < NCLASSES; c++)
      if (found->probe_ns[c])
        nbdkit_debug ("reshape: tune: export '%s': probe read %" PRIu64
                      "K in %.3f ms", t->name, class_bytes (c) / 1024,
                      found->probe_ns[c] / 1e6);
  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);
    t->exportsize = pr->geo.exportsize;
    t->min = pr->geo.min;
    t->max = pr->geo.max;
    if (pr->p.flat > 0 && (t->floor_ns == 0 || pr->p.flat < t->floor_ns))
      t->floor_ns = pr->p.flat;
    if (measured)
      publish (t, found);
    /* What the bandits measured under beside_hint's model was cut at
     * other sizes: they start anew with the probe's.
     */
    if (measured && pr->p.beside)
      memset (t->bandits, 0, sizeof t->bandits);
    if (!measured)
      snprintf (t->why, sizeof t->why, "not measured%s: static sizes",
                pr->p.busy >= BUSY_CHECKS ? " (the plugin was busy: "
                "its smallest reads slowed down)" :
                t->cancel ? " (the connection the probe read through "
                "ended first)" : "");
    if (measured && pr->p.beside) {
      size_t n = strlen (t->why);
      snprintf (t->why + n, sizeof t->why - n, " (from the next "
                "connection on: probed beside the first)");
    }
    if (reshape_debug_tune)
      nbdkit_debug ("reshape: tune: export '%s': %s", t->name, t->why);
    t->state = measured ? TUNE_KNOWN : TUNE_UNKNOWN;
    t->beside = false;
    pthread_cond_broadcast (&t->known);
  }
  prober_free (pr);
  if (measured)
    profile_save ();
}

/* Probe threads beside the connections not yet ended: the filter's
 * unload waits for them (probe_stop_all), even those whose
 * connection is still joining them as nbdkit unloads.
 */
static struct {
  pthread_mutex_t lock;
  pthread_cond_t ended;
  unsigned live;
} threads = {
  .lock = PTHREAD_MUTEX_INITIALIZER, .ended = PTHREAD_COND_INITIALIZER,
};

static void
threads_add (int n)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&threads.lock);

  threads.live += n;
  if (threads.live == 0)
    pthread_cond_broadcast (&threads.ended);
}

static void *
beside_thread (void *arg)
{
  struct prober *pr = arg;

  probe_rest (pr);
  probe_done (pr);
  threads_add (-1);                     /* done with the export's */
  return NULL;
}

/* A plugin whose smallest read is this slow would hold the handshake
 * for a dozen such reads or more (half a second at 20 ms): the probe
 * goes on in a thread, through the plugin context of the connection
 * that started it (which carries its export name, as a context of the
 * filter's own would not), and the connections made meanwhile keep the
 * static sizes (clients are told beside_hint's size, and requests are
 * cut only by what beside_hint's reads show) until the model is there:
 * then their requests are cut and their streams fetched by it, and
 * later connections are told its sizes.
 * Only a stack that takes requests in parallel may be read beside its
 * connection.  The connection's end stops the probe (tune_release).
 */
static bool
beside_ok (const struct prober *pr, const void *lender)
{
  return reshape_cfg.parallel_ok && lender != NULL &&
    pr->p.flat >= BESIDE_NS;
}

/* What clients are told while the probe goes on beside them.  Telling
 * them 4K would leave one that raises its requests to the hint
 * (nbdcopy --request-size=4096) paying the plugin's latency for every
 * 4K: over 20 ms and 100 MB/s, 16384 requests for 64M, 1.2 s against
 * 0.47 s told 256K.  The size choose_sizes would pick is L B / 2, and
 * the probe's first reads gave L: one read of HINT_READ more gives B,
 * or, if it cost no more than the flat part (s / B <= L / 2), shows
 * that L B / 2 is HINT_READ or more.  Told at least SLOW_PREFERRED,
 * which costs no more than twice a 4K request unless the plugin moves
 * less than 17 MB/s; at most HINT_READ, which this read shows is worth
 * it (over 20 ms and 100 MB/s, nbdcopy told 1M ran in 0.67 s, told
 * 256K in 0.94 s).  Costs one read of the handshake (30 ms there).
 */
static void
beside_hint (struct prober *pr)
{
  struct probe *p = &pr->p;
  const uint64_t s = min_u64 (HINT_READ, pow2_floor (pr->limit));
  double ts;

  pr->hint = min_u64 (SLOW_PREFERRED, s);
  if (s <= SLOW_PREFERRED || (ts = time_fresh (p, s)) < 0)
    return;
  if (ts <= KNEE * p->flat)
    pr->hint = s;
  else
    pr->hint = pow2_nearest (pr->hint, p->flat * s / (ts - p->flat) / 2,
                             s);
  if (ts <= p->flat || p->loaded_any)
    return;
  /* The same two reads give L + s / B: clients' requests of twice the
   * hint or more are weighed by it until the probe is over (cut no
   * smaller than the hint: where the cost stops being flat below it is
   * not known yet), tried cut where the model promises a gain, and
   * kept cut only where cutting is measured to be faster
   * (cut_begin).  Over 20 ms and 100 MB/s, qemu-img's 2M reads
   * would otherwise go whole for the half second the probe takes, most
   * of a copy of 256M.  Not from reads that other calls to the plugin
   * may have slowed (busy).
   */
  pr->early = (struct cut_model) {
    .grain = pr->hint, .lat_ns = p->flat,
    .ns_per_byte = (ts - p->flat) / s,
  };
  pr->early.flat_ns = p->flat + pr->hint * pr->early.ns_per_byte;
}

/* The probe goes on beside (false: it could not, and goes on here). */
static bool
go_beside (struct prober *pr, const void *lender)
{
  struct tune *t = pr->t;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);

  t->hint = pr->hint;
  t->early = pr->early;
  pr->p.beside = t;
  threads_add (1);
  if (pthread_create (&t->thread, NULL, beside_thread, pr) != 0) {
    threads_add (-1);
    pr->p.beside = NULL;
    return false;
  }
  t->joinable = true;
  t->lender = lender;
  t->beside = true;
  /* Connections waiting for the first read go on now. */
  pthread_cond_broadcast (&t->known);
  if (reshape_debug_tune)
    nbdkit_debug ("reshape: tune: export '%s': a %" PRIu32 "K read took "
                  "%.1f ms: the probe goes on beside the connections, "
                  "told %" PRIu32 "K meanwhile%s", t->name,
                  pr->p.base / 1024, pr->p.flat / 1e6, t->hint / 1024,
                  t->early.grain ? ", cut by these reads" : "");
  return true;
}

/* Take t's probe thread to join, if lender is whose context it reads
 * (NULL: any), and tell it to stop.  Lock held.
 */
static bool
take_thread (struct tune *t, const void *lender, pthread_t *th)
{
  if (!t->joinable || (lender && t->lender != lender))
    return false;
  *th = t->thread;
  t->joinable = false;
  t->lender = NULL;
  t->cancel = true;
  return true;
}

/* The thread of an earlier probe beside the connections, which has
 * ended (t->state is no longer TUNE_PROBING): joined before another starts.
 * Lock held on entry and on return.
 */
static void
join_ended (struct tune *t)
{
  pthread_t th;

  if (!take_thread (t, NULL, &th))
    return;
  /* It may be saving the profile, which takes t->lock. */
  pthread_mutex_unlock (&t->lock);
  pthread_join (th, NULL);
  pthread_mutex_lock (&t->lock);
}

/* The first read, which decides whether the probe holds the handshake:
 * one slow enough to go beside is read again (a first read may pay for
 * the plugin's or the process's warming up).
 */
static void
probe_first (struct prober *pr)
{
  struct probe *p = &pr->p;

  p->flat = time_base (p);
  if (p->flat >= BESIDE_NS) {
    double again = time_fresh (p, p->base);
    if (again >= 0 && again < p->flat)
      p->flat = again;
  }
}

/* Wait while another connection's handshake probes, or a cancelled
 * probe stops, but WAIT_S at most: a plugin read may never return (a
 * stalled network backend), and one read that no client asked for
 * must not keep every client of the export out.  After that the
 * connection goes on with the static sizes, as beside a probe.  Lock
 * held.
 */
static void
wait_probe (struct tune *t)
{
  struct timespec end;

  clock_gettime (CLOCK_MONOTONIC, &end);
  end.tv_sec += WAIT_S;
  while (t->state == TUNE_PROBING && (!t->beside || t->cancel))
    if (pthread_cond_timedwait (&t->known, &t->lock, &end) == ETIMEDOUT) {
      if (reshape_debug_tune)
        nbdkit_debug ("reshape: tune: export '%s': no probe result after "
                      "%d s: static sizes for this connection", t->name,
                      WAIT_S);
      return;
    }
}

void
probe_start (struct tune *t, nbdkit_next *next, const struct geometry *geo,
             const void *lender)
{
  struct prober *pr;
  double floor;

  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);
    for (;;) {
      /* A probe beside whose connection ended stops at its next read:
       * this connection waits for that (one plugin read at most), then
       * probes itself, rather than keep the static sizes for good.
       */
      wait_probe (t);
      /* A profile is checked against the first connection's geometry
       * only: once a connection uses what it says, nothing may change
       * under it (the sizes are read without a lock).
       */
      if (t->state == TUNE_KNOWN &&
          (!t->from_profile || profile_fits (t, geo))) {
        /* Sizes from a profile are chosen now: they depend on the
         * thread model, which is known only after the profile is read.
         */
        if (t->from_profile)
          tune_choose_sizes (t);
        t->from_profile = false;
        return;
      }
      if (t->state == TUNE_PROBING)     /* beside: static sizes for now */
        return;
      if (!t->joinable)
        break;
      join_ended (t);                   /* then look again */
    }
    t->state = TUNE_PROBING;
    t->cancel = false;
    floor = t->floor_ns;
  }
  pr = prober_new (t, next, geo);
  if (pr == NULL) {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);
    snprintf (t->why, sizeof t->why, "not measured: static sizes");
    t->state = TUNE_UNKNOWN;
    pthread_cond_broadcast (&t->known);
    return;
  }
  /* The probe fills a scratch copy: connections that kept the static
   * sizes after an earlier probe failed read t without the lock.
   */
  pr->p.floor = floor;
  probe_first (pr);
  pr->first_loaded = pr->p.loaded_any;
  if (beside_ok (pr, lender)) {
    beside_hint (pr);
    if (go_beside (pr, lender))
      return;
  }
  probe_rest (pr);
  probe_done (pr);
}

/* tune_each: take the first probe thread beside the connections that
 * is left to join.
 */
struct left { bool found; pthread_t th; };

static void
take_left (struct tune *t, void *opaque)
{
  struct left *k = opaque;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);

  if (!k->found)
    k->found = take_thread (t, NULL, &k->th);
}

void
probe_stop_all (void)
{
  for (;;) {
    struct left k = { .found = false };
    tune_each (take_left, &k);
    if (!k.found)
      break;
    /* Not under the list's lock: the thread may be saving the
     * profile, which takes it.
     */
    pthread_join (k.th, NULL);
  }
  /* Threads a closing connection took to join (told to stop). */
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&threads.lock);
  while (threads.live > 0)
    pthread_cond_wait (&threads.ended, &threads.lock);
}

void
probe_release (struct tune *t, const void *lender)
{
  pthread_t th;
  bool took, probing;

  if (t == NULL)
    return;
  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);
    took = take_thread (t, lender, &th);
    probing = t->state == TUNE_PROBING;
  }
  if (!took)
    return;
  if (reshape_debug_tune && probing)
    nbdkit_debug ("reshape: tune: export '%s': the connection the probe "
                  "reads through is ending: the probe stops", t->name);
  pthread_join (th, NULL);
}
