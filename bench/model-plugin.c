/* nbdkit-reshape-filter: a model backend for tests and benchmarks.
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * An in-memory disk that behaves like slow storage: every request
 * waits latency, then transfers at bandwidth bytes/s *per request*
 * (per stream), so parallel requests add up while one large request
 * does not.  It counts the calls it gets, so tests and benchmarks can
 * show how many requests reached the plugin.
 *
 * With cluster=SIZE it also models a format that stores data in
 * compressed clusters (a qcow2 image served by a decoder): a read
 * decodes every cluster it touches, whole, taking decode=TIME each, on
 * one of decoders=N decoders (the CPUs it may use; 0: no limit).  So
 * reading a 2M cluster in eight 256K requests decodes it eight times.
 *
 * For tests, bad-offset=SIZE bad-length=SIZE makes reads touching that
 * region fail with EIO (while bad-file=FILE exists, if given), and
 * first-touch=TIME makes the first request to touch each 2M region
 * wait TIME, once (memory faulted in a huge page at a time), and
 * jitter=TIME adds to every request's latency a wait drawn evenly from
 * 0 to TIME (a disk's seeks, a network), from seed=N (default 1), and
 * lanes=N serves N requests at once, the others waiting their turn (a
 * backend behind a pool of N connections).  slow-reads=N: the first N
 * reads move their bytes ten times slower (a machine short of CPU for
 * a moment).  fast-calls=N: the first N calls are answered at once
 * (a plugin that turns slow); cached=P: P percent of calls, drawn from
 * the seed, are (a cache below the filter).
 * Reads of a 2M region never written return zeros without touching
 * the disk's memory, and prefault=true allocates that memory at start
 * (for writes), so that the machine's own page faults (milliseconds
 * each on a VM compacting memory) do not blur the costs the model
 * sets.  file=FILE keeps the disk in FILE instead (made beforehand at
 * least size= long, e.g. fallocate'd in /dev/shm): writes then find
 * its memory there from run to run, with no page fault at all.
 *
 *   nbdkit ./model-plugin.so size=64M latency=1ms bandwidth=400M \
 *          [cluster=2M decode=5ms decoders=2] [serialize=true] [calls=FILE]
 */

#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/stat.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

static int64_t size = -1;
static uint64_t latency_ns;
static uint64_t bandwidth;          /* bytes per second, 0 = unlimited */
static bool serialize;
static uint64_t cluster;            /* bytes, 0 = no clusters */
static uint64_t decode_ns;          /* per cluster touched by a read */
static unsigned decoders;           /* at once, 0 = no limit */
static unsigned decoding;
static unsigned lanes;              /* requests served at once, 0: all */
static unsigned in_lane;
static pthread_mutex_t lane_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t lane_free = PTHREAD_COND_INITIALIZER;
static pthread_mutex_t decoder_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t decoder_free = PTHREAD_COND_INITIALIZER;
static char *calls_file;
static int64_t bad_offset = -1, bad_length;  /* reads touching it fail */
static char *bad_file;                       /* ... while this exists */
#define REGION (2 * 1024 * 1024)
static uint64_t first_touch_ns;     /* the first access to a region */
static uint64_t jitter_ns;          /* at most, added to latency */
static unsigned slow_reads;         /* the first ones: 10x slower */
static unsigned fast_calls;         /* the first ones: at once */
static unsigned cached;             /* percent of calls: at once */
static uint64_t jitter_state = 1;   /* xorshift64, atomic */
static unsigned char *touched;      /* per REGION: accessed yet */
static unsigned char *written;      /* per REGION: memory holds data */
static bool prefault;
static char *disk;
static char *disk_file;             /* file=: the disk, through disk_fd */
static int disk_fd = -1;
static size_t disk_len;
static pthread_mutex_t disk_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t calls, reads, writes, bytes;
static uint64_t inflight, max_inflight;  /* requests at the same time */

static int
parse_bool (const char *value, bool *b)
{
  int r = nbdkit_parse_bool (value);

  if (r == -1)
    return -1;
  *b = r;
  return 0;
}

/* "1ms", "250us", "2" (seconds), "0.5" */
static int
parse_time (const char *value, uint64_t *ns)
{
  char *end;
  double d = strtod (value, &end);

  if (end == value || d < 0)
    return -1;
  if (strcmp (end, "ms") == 0) d *= 1e6;
  else if (strcmp (end, "us") == 0) d *= 1e3;
  else if (strcmp (end, "ns") == 0) ;
  else if (*end == '\0' || strcmp (end, "s") == 0) d *= 1e9;
  else return -1;
  *ns = d;
  return 0;
}

static int
model_config (const char *key, const char *value)
{
  int64_t r;

  if (strcmp (key, "size") == 0) {
    if ((size = nbdkit_parse_size (value)) == -1)
      return -1;
  }
  else if (strcmp (key, "latency") == 0) {
    if (parse_time (value, &latency_ns) == -1) {
      nbdkit_error ("latency: cannot parse '%s'", value);
      return -1;
    }
  }
  else if (strcmp (key, "bandwidth") == 0) {
    if ((r = nbdkit_parse_size (value)) == -1)
      return -1;
    bandwidth = r;
  }
  else if (strcmp (key, "cluster") == 0) {
    if ((r = nbdkit_parse_size (value)) == -1)
      return -1;
    cluster = r;
  }
  else if (strcmp (key, "decode") == 0) {
    if (parse_time (value, &decode_ns) == -1) {
      nbdkit_error ("decode: cannot parse '%s'", value);
      return -1;
    }
  }
  else if (strcmp (key, "decoders") == 0) {
    if (nbdkit_parse_unsigned (key, value, &decoders) == -1)
      return -1;
  }
  else if (strcmp (key, "slow-reads") == 0) {
    if (nbdkit_parse_unsigned (key, value, &slow_reads) == -1)
      return -1;
  }
  else if (strcmp (key, "fast-calls") == 0) {
    if (nbdkit_parse_unsigned (key, value, &fast_calls) == -1)
      return -1;
  }
  else if (strcmp (key, "cached") == 0) {
    if (nbdkit_parse_unsigned (key, value, &cached) == -1 || cached > 100) {
      nbdkit_error ("cached: a percentage from 0 to 100");
      return -1;
    }
  }
  else if (strcmp (key, "lanes") == 0) {
    if (nbdkit_parse_unsigned (key, value, &lanes) == -1)
      return -1;
  }
  else if (strcmp (key, "serialize") == 0) {
    if (parse_bool (value, &serialize) == -1)
      return -1;
  }
  else if (strcmp (key, "calls") == 0)
    calls_file = nbdkit_absolute_path (value);
  else if (strcmp (key, "file") == 0)
    disk_file = nbdkit_absolute_path (value);
  else if (strcmp (key, "bad-offset") == 0) {
    if ((bad_offset = nbdkit_parse_size (value)) == -1)
      return -1;
  }
  else if (strcmp (key, "bad-length") == 0) {
    if ((bad_length = nbdkit_parse_size (value)) == -1)
      return -1;
  }
  else if (strcmp (key, "bad-file") == 0)
    bad_file = nbdkit_absolute_path (value);
  else if (strcmp (key, "prefault") == 0) {
    if (parse_bool (value, &prefault) == -1)
      return -1;
  }
  else if (strcmp (key, "jitter") == 0) {
    if (parse_time (value, &jitter_ns) == -1) {
      nbdkit_error ("jitter: cannot parse '%s'", value);
      return -1;
    }
  }
  else if (strcmp (key, "seed") == 0) {
    if (nbdkit_parse_uint64_t ("seed", value, &jitter_state) == -1)
      return -1;
    if (jitter_state == 0)              /* xorshift would stay at 0 */
      jitter_state = 1;
  }
  else if (strcmp (key, "first-touch") == 0) {
    if (parse_time (value, &first_touch_ns) == -1) {
      nbdkit_error ("first-touch: cannot parse '%s'", value);
      return -1;
    }
  }
  else {
    nbdkit_error ("unknown parameter '%s'", key);
    return -1;
  }
  return 0;
}

static int
model_get_ready (void)
{
  if (size < 0) {
    nbdkit_error ("size= is required");
    return -1;
  }
  /* Per region: written yet (memory), touched yet (first-touch=,
   * whichever holds the disk).
   */
  if ((written = calloc (size / REGION + 1, 1)) == NULL ||
      (first_touch_ns &&
       (touched = calloc (size / REGION + 1, 1)) == NULL)) {
    nbdkit_error ("calloc: %m");
    return -1;
  }
  if (disk_file) {
    struct stat st;

    if ((disk_fd = open (disk_file, O_RDWR | O_CLOEXEC)) == -1 ||
        fstat (disk_fd, &st) == -1) {
      nbdkit_error ("%s: %m", disk_file);
      return -1;
    }
    if (st.st_size < size) {
      nbdkit_error ("file: %s is shorter than size=%" PRIi64, disk_file,
                    size);
      return -1;
    }
    return 0;
  }
  /* Anonymous memory, in huge pages where the kernel allows: a real
   * disk does not page-fault every 4K on first read, and faults are
   * expensive in VMs, so small pages would make the model (not the
   * filter under test) the bottleneck of large transfers.
   */
  disk_len = size ? size : 1;
  disk = mmap (NULL, disk_len, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (disk == MAP_FAILED) {
    disk = NULL;
    nbdkit_error ("mmap: %m");
    return -1;
  }
#ifdef MADV_HUGEPAGE
  madvise (disk, disk_len, MADV_HUGEPAGE);
#endif
  if (prefault)
    memset (disk, 0, disk_len);
  return 0;
}

static void
model_unload (void)
{
  if (calls_file) {
    FILE *fp = fopen (calls_file, "w");
    if (fp) {
      fprintf (fp, "calls %" PRIu64 "\nreads %" PRIu64 "\nwrites %" PRIu64
               "\nbytes %" PRIu64 "\nmax_inflight %" PRIu64 "\n",
               calls, reads, writes, bytes, max_inflight);
      fclose (fp);
    }
  }
  free (calls_file);
  free (bad_file);
  free (disk_file);
  if (disk_fd >= 0)
    close (disk_fd);
  free (touched);
  free (written);
  if (disk)
    munmap (disk, disk_len);
}

static int
model_thread_model (void)
{
  return serialize ? NBDKIT_THREAD_MODEL_SERIALIZE_REQUESTS
    : NBDKIT_THREAD_MODEL_PARALLEL;
}

static void *
model_open (int readonly)
{
  return NBDKIT_HANDLE_NOT_NEEDED;
}

static int64_t
model_get_size (void *handle)
{
  return size;
}

static int
model_can_multi_conn (void *handle)
{
  return 1;
}

static int
model_can_fua (void *handle)
{
  return NBDKIT_FUA_NATIVE;
}

/* The cost of one request moving count bytes. */
static void
note_inflight (void)
{
  uint64_t now = __atomic_add_fetch (&inflight, 1, __ATOMIC_RELAXED);
  uint64_t old = __atomic_load_n (&max_inflight, __ATOMIC_RELAXED);

  while (now > old &&
         !__atomic_compare_exchange_n (&max_inflight, &old, now, false,
                                       __ATOMIC_RELAXED, __ATOMIC_RELAXED))
    ;
}

/* The next of the seed's sequence. */
static uint64_t
next_random (void)
{
  uint64_t old = __atomic_load_n (&jitter_state, __ATOMIC_RELAXED), x;

  do {
    x = old;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
  } while (!__atomic_compare_exchange_n (&jitter_state, &old, x, false,
                                         __ATOMIC_RELAXED,
                                         __ATOMIC_RELAXED));
  return x;
}

/* A wait from 0 to jitter_ns. */
static uint64_t
jitter (void)
{
  return jitter_ns ? next_random () % (jitter_ns + 1) : 0;
}

/* lanes=N: a backend that serves N requests at once (a pool of N
 * connections behind it), the others wait.
 */
static void
lane_take (void)
{
  pthread_mutex_lock (&lane_lock);
  while (lanes && in_lane >= lanes)
    pthread_cond_wait (&lane_free, &lane_lock);
  in_lane++;
  pthread_mutex_unlock (&lane_lock);
}

static void
lane_give (void)
{
  pthread_mutex_lock (&lane_lock);
  in_lane--;
  pthread_cond_signal (&lane_free);
  pthread_mutex_unlock (&lane_lock);
}

static int
wait_for (uint32_t count, uint64_t *counter)
{
  uint64_t ns = latency_ns + jitter ();
  const uint64_t nth = __atomic_fetch_add (counter, 1, __ATOMIC_RELAXED);
  int r;

  __atomic_fetch_add (&calls, 1, __ATOMIC_RELAXED);
  __atomic_fetch_add (&bytes, count, __ATOMIC_RELAXED);
  if (bandwidth)
    ns += (uint64_t) count * 1000000000 / bandwidth *
          (counter == &reads && nth < slow_reads ? 10 : 1);
  if (__atomic_load_n (&calls, __ATOMIC_RELAXED) <= fast_calls ||
      (cached && next_random () % 100 < cached))
    ns = 0;
  note_inflight ();
  lane_take ();
  r = ns ? nbdkit_nanosleep (ns / 1000000000, ns % 1000000000) : 0;
  lane_give ();
  __atomic_sub_fetch (&inflight, 1, __ATOMIC_RELAXED);
  return r;
}

/* Decode one cluster on a free decoder. */
static int
decode_one (void)
{
  int r;

  pthread_mutex_lock (&decoder_lock);
  while (decoders && decoding >= decoders)
    pthread_cond_wait (&decoder_free, &decoder_lock);
  decoding++;
  pthread_mutex_unlock (&decoder_lock);
  r = nbdkit_nanosleep (decode_ns / 1000000000, decode_ns % 1000000000);
  pthread_mutex_lock (&decoder_lock);
  decoding--;
  pthread_cond_signal (&decoder_free);
  pthread_mutex_unlock (&decoder_lock);
  return r;
}

/* The first request to touch each region waits first_touch_ns. */
static int
touch (uint32_t count, uint64_t offset)
{
  uint64_t r, ns = 0;

  if (touched == NULL || count == 0)
    return 0;
  for (r = offset / REGION; r <= (offset + count - 1) / REGION; r++)
    if (!__atomic_exchange_n (&touched[r], 1, __ATOMIC_RELAXED))
      ns += first_touch_ns;
  return ns ? nbdkit_nanosleep (ns / 1000000000, ns % 1000000000) : 0;
}

/* A read decodes every cluster it touches, one after another. */
static int
decode (uint32_t count, uint64_t offset)
{
  uint64_t c;

  if (cluster == 0 || count == 0)
    return 0;
  for (c = offset / cluster; c <= (offset + count - 1) / cluster; c++)
    if (decode_one () == -1)
      return -1;
  return 0;
}

/* Does a read of [offset, offset+count) touch the bad region (tests:
 * a plugin failing where the client does not read)?
 */
static bool
bad_read (uint32_t count, uint64_t offset)
{
  if (bad_offset < 0 || offset >= (uint64_t) bad_offset + bad_length ||
      offset + count <= (uint64_t) bad_offset)
    return false;
  return bad_file == NULL || access (bad_file, F_OK) == 0;
}

/* The part of [offset, offset+count) in the region holding offset. */
static uint32_t
region_part (uint32_t count, uint64_t offset)
{
  uint64_t end = (offset / REGION + 1) * REGION;

  return end - offset < count ? end - offset : count;
}

/* file=: the disk is disk_fd.  A write of buf NULL writes zeros (buf
 * is written from, never to, when write is true).  Called under
 * disk_lock.
 */
static int
file_io (char *buf, uint32_t count, uint64_t offset, bool write)
{
  static const char zeros[65536];

  while (count > 0) {
    uint32_t n = buf || count < sizeof zeros ? count : sizeof zeros;
    ssize_t r = write ? pwrite (disk_fd, buf ? buf : zeros, n, offset)
      : pread (disk_fd, buf, n, offset);
    if (r <= 0) {
      if (r == 0)
        errno = EIO;                    /* the file was cut short */
      nbdkit_error ("%s: %s: %m", write ? "pwrite" : "pread", disk_file);
      return -1;
    }
    if (buf)
      buf += r;
    offset += r; count -= r;
  }
  return 0;
}

/* Memory of regions never written is not touched: reads of it are
 * zeros, zeroing it is nothing to do.  Called under disk_lock.
 */
static void
copy_out (char *buf, uint32_t count, uint64_t offset)
{
  while (count > 0) {
    uint32_t n = region_part (count, offset);

    if (written[offset / REGION])
      memcpy (buf, disk + offset, n);
    else
      memset (buf, 0, n);
    buf += n; offset += n; count -= n;
  }
}

static void
copy_in (const char *buf, uint32_t count, uint64_t offset)
{
  while (count > 0) {
    uint32_t n = region_part (count, offset);

    if (buf) {
      written[offset / REGION] = 1;
      memcpy (disk + offset, buf, n);
      buf += n;
    }
    else if (written[offset / REGION])
      memset (disk + offset, 0, n);
    offset += n; count -= n;
  }
}

/* The disk's part of a request, whole with respect to the others. */
static int
disk_io (char *buf, uint32_t count, uint64_t offset, bool write)
{
  int r = 0;

  pthread_mutex_lock (&disk_lock);
  if (disk_fd >= 0)
    r = file_io (buf, count, offset, write);
  else if (write)
    copy_in (buf, count, offset);
  else
    copy_out (buf, count, offset);
  pthread_mutex_unlock (&disk_lock);
  return r;
}

static int
model_pread (void *handle, void *buf, uint32_t count, uint64_t offset,
             uint32_t flags)
{
  if (wait_for (count, &reads) == -1 || touch (count, offset) == -1 ||
      decode (count, offset) == -1)
    return -1;
  if (bad_read (count, offset)) {
    nbdkit_error ("model: a read of the bad region (%" PRIu32 " bytes at "
                  "%" PRIu64 ")", count, offset);
    errno = EIO;
    return -1;
  }
  return disk_io (buf, count, offset, false);
}

static int
model_pwrite (void *handle, const void *buf, uint32_t count,
              uint64_t offset, uint32_t flags)
{
  if (wait_for (count, &writes) == -1 || touch (count, offset) == -1)
    return -1;
  return disk_io ((char *) buf, count, offset, true);
}

static int
model_zero (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  if (wait_for (0, &writes) == -1)
    return -1;
  return disk_io (NULL, count, offset, true);
}

static int
model_trim (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  return model_zero (handle, count, offset, flags);
}

static int
model_flush (void *handle, uint32_t flags)
{
  return wait_for (0, &writes);
}

static struct nbdkit_plugin plugin = {
  .name              = "model",
  .longname          = "reshape model backend",
  .config            = model_config,
  .config_help       = "size=SIZE latency=TIME bandwidth=BYTES/S "
                       "cluster=SIZE decode=TIME decoders=N "
                       "serialize=BOOL calls=FILE bad-offset=SIZE "
                       "bad-length=SIZE bad-file=FILE first-touch=TIME "
                       "jitter=TIME seed=N lanes=N slow-reads=N prefault=BOOL "
                       "file=FILE",
  .get_ready         = model_get_ready,
  .unload            = model_unload,
  .thread_model      = model_thread_model,
  .open              = model_open,
  .get_size          = model_get_size,
  .can_multi_conn    = model_can_multi_conn,
  .can_fua           = model_can_fua,
  .pread             = model_pread,
  .pwrite            = model_pwrite,
  .zero              = model_zero,
  .trim              = model_trim,
  .flush             = model_flush,
  .errno_is_preserved = 1,
};

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL
NBDKIT_REGISTER_PLUGIN (plugin)
