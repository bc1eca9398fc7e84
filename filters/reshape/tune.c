/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * reshape-size=auto.  Per export, the filter learns the cost of a
 * plugin call by its size, and picks its sizes from that.
 *
 * The probe.  When the first client connects to an export, before it
 * is told the preferred block size, the filter times single reads of
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
 * From it:
 *
 *   - grain G: no request is cut into pieces smaller than G (each
 *     piece would cost a whole grain), and small sequential reads are
 *     fetched as the aligned G block that holds them (it costs no more
 *     than the small read);
 *   - preferred P, told to clients and used as the unit of staging and
 *     readahead: the power of 2 nearest L B / 2, where a call's
 *     transfer takes half its fixed cost (2 L B if the plugin
 *     serializes requests: nothing overlaps), at least G, at most 8M
 *     (clients size their buffers by it and keep many requests in
 *     flight, which overlap the latency: beyond that, larger requests
 *     only cost buffers and caches).  A plugin
 *     without latency is told 64K: below that, the server's and the
 *     client's cost per request dominates whatever the plugin does.
 *
 * Cutting large requests.  A request is sent whole (up to the
 * plugin's maximum) until cutting is measured to be faster.  For every
 * request larger than 2 G, the model L + s/B, run on the lanes the
 * large requests in flight leave it (lanes), proposes the best cut;
 * if it promises to be at least 25% faster, every 4th request of that
 * size class (every 2nd read if it promises twice as fast: a client
 * may send only a few such requests) is cut there until both options
 * have a few samples, then
 * every 16th tries
 * the option not in use, and the option measured faster (by 15%, end
 * to end) is kept.  So a request is never cut below its own size
 * unless the plugin's maximum demands it or cutting was measured to be
 * faster, and the choice follows the plugin if it changes.  An option
 * measured 30% worse, even once, is tried less and less often (down
 * to every 256th request), and more often again (up to every 16th)
 * once it measures no worse.
 *
 * Everything learnt is kept per export name until the filter is
 * unloaded, and shown in the statistics report.
 */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nbdkit-filter.h>

#include "common.h"
#include "params.h"
#include "tune.h"

/* -D reshape.tune=1: the probe and every decision that changes. */
NBDKIT_DLL_PUBLIC int reshape_debug_tune;

#define MIN_SHIFT 12                    /* classes from 4K ... */
#define NCLASSES 16                     /* ... to 128M */
#define PROBE_MAX (16 * 1024 * 1024)    /* largest read of the probe */
#define FLAT 1.25                       /* "as cheap", for choices */
#define KNEE 1.5                        /* "costs more", for the probe */
#define PREFERRED_CAP (8 * 1024 * 1024)
#define FAST_PREFERRED (64 * 1024)
#define EXPLORE_FIRST 4                 /* until both are measured */
#define EXPLORE_EAGER 2                 /* ... if the model promises */
#define BIG_GAIN 2.0                    /* ... twice as fast */
#define EXPLORE_EVERY 16
#define EXPLORE_RARELY 256
#define SWITCH 0.87                     /* the other option wins by 15% */
#define WORSE 1.3                       /* an exploration that lost */
#define MIN_SAMPLES 3
#define FAST_RETRY_NS (1000 * 1000)     /* a 4K read this fast ... */
#define FAST_RETRIES 10                 /* ... is tried this often */
#define BESIDE_NS (15 * 1000 * 1000)    /* a 4K read this slow: beside */
#define SLOW_PREFERRED (256 * 1024)     /* ... told meanwhile, at least */
#define HINT_READ (1024 * 1024)         /* ... at most, read to know */

enum state { UNKNOWN, PROBING, KNOWN };

/* What cutting goes by: a call of s bytes costs flat_ns up to grain,
 * then lat_ns + s * ns_per_byte (0: flat for good, never cut).
 */
struct cut_model {
  uint64_t grain;                       /* 0: no model */
  double flat_ns, lat_ns, ns_per_byte;
};

/* Plugin calls of one size class. */
struct cost {
  uint64_t calls, bytes, ns;            /* totals, atomic */
};

/* Cut or whole, for one direction and size class of requests. */
struct bandit {
  bool used;
  bool cut;                             /* the current choice */
  double ns_per_byte[2];                /* EWMA, [0] whole, [1] cut */
  unsigned samples[2];
  unsigned since;                       /* requests since exploring */
  unsigned every;                       /* explore every so many */
  unsigned switches;
};

struct tune {
  char *name;
  pthread_mutex_t lock;
  pthread_cond_t known;
  enum state state;
  bool beside;                          /* PROBING beside connections */
  bool joinable;                        /* thread: the last such probe */
  pthread_t thread;
  const void *lender;                   /* whose plugin context it reads */
  bool cancel;                          /* the lender is ending: stop */
  uint32_t hint;                        /* told meanwhile (beside_hint) */
  struct cut_model early;               /* cut by meanwhile (ditto) */
  double floor_ns;                      /* fastest 4K of any probe, 0: none */
  /* The probe's findings. */
  bool measured;                        /* the probe got numbers */
  bool fast;                            /* no latency worth hiding */
  double probe_ns[NCLASSES];            /* 0: not probed */
  unsigned probe_reads;                 /* 0: from a profile */
  uint32_t grain;                       /* G */
  double lat_ns;                        /* L */
  double ns_per_byte;                   /* 1 / B, 0 = no bandwidth cost */
  struct tune_sizes sizes;
  char why[200];
  /* The geometry the probe ran on (a profile must match it). */
  bool from_profile;
  uint64_t exportsize;
  uint32_t min, max;
  /* Live traffic. */
  struct cost table[TUNE_DIRS][NCLASSES];
  struct bandit bandits[TUNE_DIRS][NCLASSES];
  unsigned inflight;                    /* requests timed, atomic */
  struct tune *next;
};

static struct {
  pthread_mutex_t lock;
  struct tune *list;
} all = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* The filter's calls to the plugin in flight, every export's (exports
 * may share what the plugin serves from), atomic; the probe's own are
 * not counted.  Only reshape-size=auto probes: a fixed size skips the
 * counting (the setting never changes while calls are in flight, so
 * begin and end agree).
 */
static unsigned plugin_in_flight;

void
tune_plugin_begin (void)
{
  if (reshape_cfg.size == 0)
    __atomic_add_fetch (&plugin_in_flight, 1, __ATOMIC_RELAXED);
}

void
tune_plugin_end (void)
{
  if (reshape_cfg.size == 0)
    __atomic_sub_fetch (&plugin_in_flight, 1, __ATOMIC_RELAXED);
}

static bool
plugin_busy (void)
{
  return __atomic_load_n (&plugin_in_flight, __ATOMIC_RELAXED) > 0;
}

/* reshape-profile=FILE, NULL if not given. */
static struct {
  pthread_mutex_t lock;                 /* one save at a time */
  const char *file;
} profile = { .lock = PTHREAD_MUTEX_INITIALIZER };

static unsigned
class_of (uint64_t bytes)
{
  unsigned c = 0;

  while (c + 1 < NCLASSES && bytes >> (c + 1 + MIN_SHIFT))
    c++;
  return c;
}

static uint64_t
class_bytes (unsigned c)
{
  return UINT64_C (1) << (c + MIN_SHIFT);
}

struct tune *
tune_get (const char *exportname)
{
  struct tune *t;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&all.lock);

  for (t = all.list; t; t = t->next)
    if (strcmp (t->name, exportname) == 0)
      return t;
  t = calloc (1, sizeof *t);
  if (t == NULL || (t->name = strdup (exportname)) == NULL) {
    free (t);
    nbdkit_error ("reshape: tune: %m");
    return NULL;
  }
  pthread_mutex_init (&t->lock, NULL);
  pthread_cond_init (&t->known, NULL);
  t->next = all.list;
  all.list = t;
  return t;
}

void
tune_free_all (void)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&all.lock);

  while (all.list) {
    struct tune *t = all.list;
    all.list = t->next;
    pthread_cond_destroy (&t->known);
    pthread_mutex_destroy (&t->lock);
    free (t->name);
    free (t);
  }
}

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
  p->loaded = plugin_busy ();
  start = now_ns ();
  if (p->next->pread (p->next, p->buf, len,
                      probe_offset (p->geo, len, place), 0, &err) == -1)
    return -1;
  p->loaded |= plugin_busy ();
  p->loaded_any |= p->loaded;
  return now_ns () - start;
}

static double
time_fresh (struct probe *p, uint32_t len)
{
  return time_read (p, len, p->place++);
}

/* The model the probe found.  Its fields are set once (publish). */
static struct cut_model
probed (const struct tune *t)
{
  return (struct cut_model) {
    .grain = t->grain, .flat_ns = t->probe_ns[class_of (t->grain)],
    .lat_ns = t->lat_ns, .ns_per_byte = t->ns_per_byte,
  };
}

/* The cost of a call of s bytes as model m has it. */
static double
model_ns (const struct cut_model *m, uint64_t s)
{
  if (s <= m->grain || m->ns_per_byte == 0)
    return m->flat_ns;
  return m->lat_ns + s * m->ns_per_byte;
}

/* The power of 2 times lo nearest target, from lo up to hi. */
static uint64_t
pow2_nearest (uint64_t lo, double target, uint64_t hi)
{
  uint64_t p = lo;

  while (p < hi && p * 1.41421356 < target)
    p *= 2;
  return p;
}

/* From the probe: the sizes, and why. */
static void
choose_sizes (struct tune *t)
{
  const struct cut_model m = probed (t);
  uint64_t p;

  if (t->fast) {
    t->sizes = (struct tune_sizes) { .preferred = FAST_PREFERRED };
    snprintf (t->why, sizeof t->why,
              "smallest read in %.0f us: no latency; clients told %uK, "
              "requests not cut", t->lat_ns / 1000,
              FAST_PREFERRED / 1024);
    return;
  }
  /* Where a call's transfer takes half its fixed cost, s = L B / 2:
   * clients keep many requests in flight, nbdkit's threads overlap
   * the latency, and beyond that larger requests only cost the client
   * buffers and the caches (measured with nbdcopy: over 20 ms +
   * 100 MB/s, fastest at 1M, L B = 2M; over 1 ms + 400 MB/s, at
   * 256K-512K, L B = 400K).  A plugin that serializes requests
   * overlaps nothing within a connection: there a call should carry
   * twice its fixed cost in transfer, s = 2 L B (measured over a
   * serialized 1 ms + 400 MB/s: 1M-2M fastest for nbdcopy and
   * qemu-img, 256K a third slower).  The power of 2 nearest, at least
   * G, at most PREFERRED_CAP.
   */
  if (t->ns_per_byte > 0)
    p = pow2_nearest (t->grain, t->lat_ns / t->ns_per_byte *
                      (reshape_cfg.parallel_ok ? 0.5 : 2), PREFERRED_CAP);
  else
    p = max_u64 (t->grain, PREFERRED_CAP);
  p = min_u64 (p, PREFERRED_CAP);
  t->sizes = (struct tune_sizes) {
    .preferred = p, .unit = p, .grain = t->grain,
  };
  snprintf (t->why, sizeof t->why,
            "cost flat up to %" PRIu32 "K (%.2f ms), then %.2f ms + "
            "%.0f MB/s per stream: clients told %" PRIu64 "K",
            t->grain / 1024, model_ns (&m, t->grain) / 1e6, t->lat_ns / 1e6,
            t->ns_per_byte > 0 ? 1e3 / t->ns_per_byte : 0.0, p / 1024);
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
 * with nothing else in flight differ by more than KNEE.  A repeat of a
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
    note_base (p, ts, p->loaded);
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
      (pr->p.buf = malloc (pr->limit)) == NULL) {
    free (pr);
    return NULL;
  }
  return pr;
}

static void
prober_free (struct prober *pr)
{
  free (pr->p.buf);
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

/* Is t's model there to use?  Its fields are written, under the lock,
 * before measured is set (publish), and never change afterwards while
 * connections use them, so a reader that saw measured under the lock
 * reads them whole without it.  (The lock rather than an atomic flag:
 * a probe beside the connections publishes while they run, and
 * helgrind sees only locks.)
 */
static bool
model_ready (struct tune *t)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);
  return t->measured;
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
  choose_sizes (t);
  t->measured = true;
}

/* Does what a profile said of t hold for this geometry?  Lock held. */
static bool
profile_fits (struct tune *t, const struct geometry *geo)
{
  if (t->exportsize == geo->exportsize && t->min == geo->min &&
      t->max == geo->max)
    return true;
  nbdkit_error ("reshape-profile: warning: export '%s' is not what the "
                "profile was made on (size %" PRIu64 ", minimum %" PRIu32
                ", maximum %" PRIu32 " now; %" PRIu64 ", %" PRIu32 ", %"
                PRIu32 " then): probing it again", t->name,
                geo->exportsize, geo->min, geo->max, t->exportsize, t->min,
                t->max);
  memset (t->probe_ns, 0, sizeof t->probe_ns);
  t->measured = t->fast = t->from_profile = false;
  t->grain = 0;
  t->lat_ns = t->ns_per_byte = 0;
  t->sizes = (struct tune_sizes) { 0 };
  return false;
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
    t->state = measured ? KNOWN : UNKNOWN;
    t->beside = false;
    pthread_cond_broadcast (&t->known);
  }
  prober_free (pr);
  if (profile.file && measured)
    tune_save ();
}

static void *
beside_thread (void *arg)
{
  struct prober *pr = arg;

  probe_rest (pr);
  probe_done (pr);
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
   * (tune_cut_begin).  Over 20 ms and 100 MB/s, qemu-img's 2M reads
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
  if (pthread_create (&t->thread, NULL, beside_thread, pr) != 0) {
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
 * ended (t->state is no longer PROBING): joined before another starts.
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

void
tune_probe (struct tune *t, nbdkit_next *next, const struct geometry *geo,
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
      while (t->state == PROBING && (!t->beside || t->cancel))
        pthread_cond_wait (&t->known, &t->lock);
      /* A profile is checked against the first connection's geometry
       * only: once a connection uses what it says, nothing may change
       * under it (the sizes are read without a lock).
       */
      if (t->state == KNOWN &&
          (!t->from_profile || profile_fits (t, geo))) {
        /* Sizes from a profile are chosen now: they depend on the
         * thread model, which is known only after the profile is read.
         */
        if (t->from_profile)
          choose_sizes (t);
        t->from_profile = false;
        return;
      }
      if (t->state == PROBING)          /* beside: static sizes for now */
        return;
      if (!t->joinable)
        break;
      join_ended (t);                   /* then look again */
    }
    t->state = PROBING;
    t->cancel = false;
    floor = t->floor_ns;
  }
  pr = prober_new (t, next, geo);
  if (pr == NULL) {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);
    snprintf (t->why, sizeof t->why, "not measured: static sizes");
    t->state = UNKNOWN;
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

void
tune_release (struct tune *t, const void *lender)
{
  pthread_t th;
  bool took, probing;

  if (t == NULL)
    return;
  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);
    took = take_thread (t, lender, &th);
    probing = t->state == PROBING;
  }
  if (!took)
    return;
  if (reshape_debug_tune && probing)
    nbdkit_debug ("reshape: tune: export '%s': the connection the probe "
                  "reads through is ending: the probe stops", t->name);
  pthread_join (th, NULL);
}

/* The sizes are set once, before measured (model_ready). */
void
tune_sizes (struct tune *t, struct tune_sizes *s)
{
  if (model_ready (t))
    *s = t->sizes;
  else
    *s = (struct tune_sizes) { 0 };
}

/* While a probe goes on beside the connections: beside_hint's. */
void
tune_start_sizes (struct tune *t, struct tune_sizes *s)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);

  if (t->measured)
    *s = t->sizes;
  else if (t->beside)
    *s = (struct tune_sizes) { .preferred = t->hint };
  else
    *s = (struct tune_sizes) { 0 };
}

void
tune_record (struct tune *t, enum tune_dir d, uint64_t bytes, uint64_t ns)
{
  struct cost *c = &t->table[d][class_of (bytes)];

  __atomic_fetch_add (&c->calls, 1, __ATOMIC_RELAXED);
  __atomic_fetch_add (&c->bytes, bytes, __ATOMIC_RELAXED);
  __atomic_fetch_add (&c->ns, ns, __ATOMIC_RELAXED);
}

/* Lanes: the pieces of one request that run at once.  The plugin's
 * parallelism (reshape-parallel, like nbdkit's threads) is shared by
 * the large requests in flight, whole or cut: a client that keeps
 * eight in flight gives the plugin eight streams already, and a
 * request cut to run wider than its share only slows the others,
 * while its own time, all that the measuring sees, looks faster.
 */
static unsigned
lanes (struct tune *t)
{
  unsigned n = __atomic_load_n (&t->inflight, __ATOMIC_RELAXED);

  if (!reshape_cfg.parallel_ok)
    return 1;
  return max_u64 (reshape_cfg.parallel / max_u64 (n, 1), 1);
}

/* What a request of count bytes is cut by, if anything may cut it:
 * the probe's model; while the probe goes on beside the connections,
 * if early, the handshake's (beside_hint); neither for a plugin
 * without latency or a request too small to cut in two grains.  Lock
 * held.
 */
static bool
model_for (const struct tune *t, uint64_t count, bool early,
           struct cut_model *m)
{
  if (t->measured && !t->fast)
    *m = probed (t);
  else if (early && t->beside && t->early.grain)
    *m = t->early;
  else
    return false;
  return count >= 2 * m->grain;
}

/* The model's best cut of count bytes and its gain over whole. */
static uint64_t
best_cut (struct tune *t, const struct cut_model *m, uint64_t count,
          uint32_t max, double *gain)
{
  const unsigned l = lanes (t);
  const double whole = model_ns (m, min_u64 (count, max)) *
    ((count + max - 1) / max);
  uint64_t s, best = count;
  double best_ns = whole;

  for (s = max_u64 (m->grain, 4096); s <= count / 2 && s <= max; s *= 2) {
    uint64_t pieces = (count + s - 1) / s;
    double ns = ((pieces + l - 1) / l) * model_ns (m, s);
    if (ns < best_ns) {
      best_ns = ns;
      best = s;
    }
  }
  *gain = whole / best_ns;
  return best;
}

uint64_t
tune_cut_model (struct tune *t, uint64_t count, uint32_t max)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);
  struct cut_model m;
  uint64_t cut;
  double gain;

  /* Only the probe's: nothing measures how the filter's own reads
   * fare cut.
   */
  if (!model_for (t, count, false, &m))
    return min_u64 (count, max);
  cut = best_cut (t, &m, count, max, &gain);
  return gain >= FLAT ? cut : min_u64 (count, max);
}

uint32_t
tune_cut_begin (struct tune *t, enum tune_dir d, uint64_t count,
                uint32_t max, struct tune_choice *c)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);
  struct cut_model m;
  struct bandit *b;
  uint64_t cut;
  double gain;
  bool explore;

  c->cls = -1;
  if (!model_for (t, count, true, &m))
    return min_u64 (count, max);
  __atomic_add_fetch (&t->inflight, 1, __ATOMIC_RELAXED);
  cut = best_cut (t, &m, count, max, &gain);
  b = &t->bandits[d][class_of (count)];
  if (!b->used) {
    /* The model comes from reads: for writes its promise is no more
     * than a guess (a decoder's clusters cost reads, not writes).
     */
    *b = (struct bandit) { .used = true, .cut = false,
                           .every = d == TUNE_READ && gain >= BIG_GAIN ?
                                    EXPLORE_EAGER : EXPLORE_FIRST };
    if (reshape_debug_tune)
      nbdkit_debug ("reshape: tune: '%s' %s of %" PRIu64 "K: %s (the "
                    "model: %.2fx faster cut at %" PRIu64 "K, to be "
                    "measured)", t->name,
                    d == TUNE_READ ? "reads" : "writes", count / 1024,
                    "whole", gain, cut / 1024);
  }
  /* Try the other option now and then, if the model sees one. */
  explore = ++b->since >= b->every && cut < count &&
    (b->cut || gain >= FLAT);
  if (explore)
    b->since = 0;
  c->cls = class_of (count);
  c->cut = b->cut != explore && cut < count;
  c->count = count;
  c->start_ns = now_ns ();
  return c->cut ? cut : min_u64 (count, max);
}

void
tune_cut_end (struct tune *t, enum tune_dir d, const struct tune_choice *c,
              bool ok)
{
  const double npb = (double) (now_ns () - c->start_ns) / c->count;
  struct bandit *b;
  const int o = c->cut;

  if (c->cls < 0)
    return;
  __atomic_sub_fetch (&t->inflight, 1, __ATOMIC_RELAXED);
  if (!ok)                      /* a failure's time tells nothing */
    return;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);
  b = &t->bandits[d][c->cls];
  b->ns_per_byte[o] = b->samples[o] ? 0.75 * b->ns_per_byte[o] + 0.25 * npb
                                    : npb;
  b->samples[o]++;
  /* An exploration measured worse backs off at once (the model was
   * wrong, and each try costs the client); a switch needs a few.
   */
  if (o != b->cut && b->samples[!o] >= MIN_SAMPLES) {
    if (b->samples[o] >= MIN_SAMPLES &&
        b->ns_per_byte[o] < SWITCH * b->ns_per_byte[!o]) {
      b->cut = o;
      b->every = EXPLORE_EVERY;
      b->switches++;
      if (reshape_debug_tune)
        nbdkit_debug ("reshape: tune: '%s' %s of %" PRIu64 "K: now %s "
                      "(measured %.2f against %.2f ns per byte)", t->name,
                      d == TUNE_READ ? "reads" : "writes",
                      class_bytes (c->cls) / 1024, o ? "cut" : "whole",
                      b->ns_per_byte[o], b->ns_per_byte[!o]);
    }
    else if (b->ns_per_byte[o] > WORSE * b->ns_per_byte[!o])
      b->every = min_u64 (max_u64 (b->every, EXPLORE_EVERY) * 2,
                          EXPLORE_RARELY);
    else if (b->samples[o] >= MIN_SAMPLES)   /* not worse: try sooner */
      b->every = max_u64 (b->every / 2, EXPLORE_EVERY);
  }
}

static void
report_one (FILE *fp, struct tune *t)
{
  static const char *const dirs[TUNE_DIRS] = { "reads", "writes" };
  unsigned d, c;

  fprintf (fp, "\nreshape-size=auto, export '%s': %s\n", t->name, t->why);
  if (t->sizes.preferred)
    fprintf (fp, "  preferred %" PRIu32 "K, unit %" PRIu32 "K, "
             "grain %" PRIu32 "K\n", t->sizes.preferred / 1024,
             t->sizes.unit / 1024, t->sizes.grain / 1024);
  if (t->probe_reads)
    fprintf (fp, "  probe: %u reads\n", t->probe_reads);
  fprintf (fp, "  %-8s %8s %10s %10s %10s %10s\n", "", "size", "probe ms",
           "calls", "mean ms", "MB/s");
  for (d = 0; d < TUNE_DIRS; d++)
    for (c = 0; c < NCLASSES; c++) {
      const struct cost *k = &t->table[d][c];
      if (k->calls == 0 && (d != TUNE_READ || t->probe_ns[c] == 0))
        continue;
      fprintf (fp, "  %-8s %7" PRIu64 "K %10.3f %10" PRIu64 " %10.3f "
               "%10.1f\n", dirs[d], class_bytes (c) / 1024,
               d == TUNE_READ ? t->probe_ns[c] / 1e6 : 0.0, k->calls,
               k->calls ? (double) k->ns / k->calls / 1e6 : 0.0,
               k->ns ? (double) k->bytes / k->ns * 1e3 : 0.0);
    }
  for (d = 0; d < TUNE_DIRS; d++)
    for (c = 0; c < NCLASSES; c++) {
      const struct bandit *b = &t->bandits[d][c];
      if (!b->used)
        continue;
      fprintf (fp, "  %s of %" PRIu64 "K+: %s (whole %.3f, cut %.3f ns "
               "per byte, %u/%u samples, %u switches)\n", dirs[d],
               class_bytes (c) / 1024, b->cut ? "cut" : "whole",
               b->ns_per_byte[0], b->ns_per_byte[1], b->samples[0],
               b->samples[1], b->switches);
    }
}

void
tune_report (FILE *fp)
{
  struct tune *t;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&all.lock);

  for (t = all.list; t; t = t->next)
    report_one (fp, t);
}

/* The profile.  A text file, one line per export measured:
 *
 *   nbdkit-reshape-filter profile 1
 *   export HEXNAME exportsize N min N max N fast 0|1 grain N
 *     lat NS npb NS probe CLASS:NS ...        (all on one line)
 *
 * written whole to a temporary file and renamed over the old one, so
 * that a reader never sees half of it.  Anything unexpected makes the
 * whole file suspect: it is ignored with a warning, and every export
 * is probed.
 */
#define PROFILE_HEADER "nbdkit-reshape-filter profile 1"

static void
write_entry (FILE *fp, const struct tune *t)
{
  const char *n;
  unsigned c;

  fprintf (fp, "export ");
  for (n = t->name; *n; n++)
    fprintf (fp, "%02x", (unsigned char) *n);
  if (*t->name == '\0')
    fprintf (fp, "-");
  fprintf (fp, " exportsize %" PRIu64 " min %" PRIu32 " max %" PRIu32
           " fast %d grain %" PRIu32 " lat %.0f npb %.6f probe",
           t->exportsize, t->min, t->max, t->fast, t->grain, t->lat_ns,
           t->ns_per_byte);
  for (c = 0; c < NCLASSES; c++)
    if (t->probe_ns[c])
      fprintf (fp, " %u:%.0f", c, t->probe_ns[c]);
  fprintf (fp, "\n");
}

void
tune_save (void)
{
  CLEANUP_FREE char *tmp = NULL;
  struct tune *t;
  FILE *fp;
  bool ok;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&profile.lock);

  if (profile.file == NULL)
    return;
  if (asprintf (&tmp, "%s.tmp.%ld", profile.file, (long) getpid ()) == -1)
    tmp = NULL;                 /* undefined after a failure */
  if (tmp == NULL || (fp = fopen (tmp, "w")) == NULL) {
    nbdkit_error ("reshape-profile: warning: cannot write %s: %m",
                  profile.file);
    return;
  }
  fprintf (fp, "%s\n", PROFILE_HEADER);
  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&all.lock);
    for (t = all.list; t; t = t->next) {
      ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);
      if (t->state == KNOWN && t->measured)
        write_entry (fp, t);
    }
  }
  ok = fflush (fp) == 0 && fsync (fileno (fp)) == 0;
  if (fclose (fp) != 0 || !ok || rename (tmp, profile.file) == -1) {
    nbdkit_error ("reshape-profile: warning: cannot write %s: %m",
                  profile.file);
    unlink (tmp);
  }
}

/* Decode HEXNAME ("-": the empty name) into name (len bytes). */
static bool
unhex (const char *hex, char *name, size_t len)
{
  size_t i, n = strlen (hex);

  if (strcmp (hex, "-") == 0) {
    *name = '\0';
    return true;
  }
  if (n % 2 || n / 2 >= len)
    return false;
  for (i = 0; i < n / 2; i++) {
    unsigned v;
    if (sscanf (hex + 2 * i, "%2x", &v) != 1 || v == 0 ||
        !strchr ("0123456789abcdef", hex[2 * i]) ||
        !strchr ("0123456789abcdef", hex[2 * i + 1]))
      return false;
    name[i] = v;
  }
  name[i] = '\0';
  return true;
}

/* One export line into t (not yet shared); false if it is not one. */
static bool
parse_entry (char *line, char *name, size_t len, struct tune *t)
{
  char hex[2 * 4096 + 2], *p;
  int fast, used = -1;          /* %n is not reached if " probe" is missing */

  if (sscanf (line, "export %8193s exportsize %" SCNu64 " min %" SCNu32
              " max %" SCNu32 " fast %d grain %" SCNu32 " lat %lf npb %lf"
              " probe%n", hex, &t->exportsize, &t->min, &t->max, &fast,
              &t->grain, &t->lat_ns, &t->ns_per_byte, &used) != 8 ||
      used < 0 ||
      !unhex (hex, name, len) || t->exportsize == 0 ||
      !is_power_of_2 (t->min) || t->min > 64 * 1024 || t->max < t->min ||
      (fast != 0 && fast != 1) ||
      (!fast && (!is_power_of_2 (t->grain) || t->grain < 4096 ||
                 t->grain > PROBE_MAX)) ||
      !(t->lat_ns >= 0 && t->lat_ns < 1e11) ||
      !(t->ns_per_byte >= 0 && t->ns_per_byte < 1e6))
    return false;
  t->fast = fast;
  for (p = line + used; *p && *p != '\n'; ) {
    unsigned c;
    double ns;
    int n;
    if (sscanf (p, " %u:%lf%n", &c, &ns, &n) != 2 || c >= NCLASSES ||
        !(ns > 0 && ns < 1e11))
      return false;
    t->probe_ns[c] = ns;
    p += n;
  }
  return t->fast || t->probe_ns[class_of (t->grain)] > 0;
}

/* Read the whole file; false (nothing taken) if any line is wrong. */
static bool
load (FILE *fp, const char *file)
{
  struct entry { char name[4097]; struct tune t; } *e = NULL;
  CLEANUP_FREE char *line = NULL;
  size_t cap = 0, n = 0, i;
  unsigned lineno = 1;
  ssize_t r;

  if ((r = getline (&line, &cap, fp)) == -1)
    return true;                        /* empty: nothing learnt yet */
  if (strcmp (line, PROFILE_HEADER "\n") != 0) {
    nbdkit_error ("reshape-profile: warning: %s is not a profile of this "
                  "filter; ignored, and left as it is (nothing learnt "
                  "will be kept)", file);
    profile.file = NULL;
    return false;
  }
  while ((r = getline (&line, &cap, fp)) != -1) {
    struct entry *ne = realloc (e, (n + 1) * sizeof *e);
    lineno++;
    if (ne == NULL) {
      free (e);
      return false;
    }
    e = ne;
    memset (&e[n], 0, sizeof e[n]);
    if (!parse_entry (line, e[n].name, sizeof e[n].name, &e[n].t)) {
      nbdkit_error ("reshape-profile: warning: %s line %u is corrupt; "
                    "the profile is ignored", file, lineno);
      free (e);
      return false;
    }
    n++;
  }
  for (i = 0; i < n; i++) {
    struct tune *t = tune_get (e[i].name);
    if (t == NULL)
      break;
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&t->lock);
    t->exportsize = e[i].t.exportsize;
    t->min = e[i].t.min;
    t->max = e[i].t.max;
    t->fast = e[i].t.fast;
    t->grain = e[i].t.grain;
    t->lat_ns = e[i].t.lat_ns;
    t->ns_per_byte = e[i].t.ns_per_byte;
    memcpy (t->probe_ns, e[i].t.probe_ns, sizeof t->probe_ns);
    t->measured = t->from_profile = true;
    t->state = KNOWN;
    choose_sizes (t);
  }
  free (e);
  return true;
}

int
tune_load (const char *file)
{
  FILE *fp;

  profile.file = file;
  fp = fopen (file, "r");
  if (fp == NULL) {
    if (errno == ENOENT)
      return 0;                         /* made at the first probe */
    nbdkit_error ("reshape-profile: %s: %m", file);
    return -1;
  }
  load (fp, file);
  fclose (fp);
  return 0;
}
