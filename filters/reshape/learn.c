/* nbdkit-reshape-filter
 * Copyright the nbdkit-reshape-filter authors.
 * SPDX-License-Identifier: BSD-3-Clause
 *
 * reshape-size=auto: the learning's decisions, with no lock, clock or
 * plugin call (see learn.h).  Per export it keeps what plugin calls
 * cost by their size, from the calls clients' requests make anyway,
 * and picks its sizes from that.  It has no phase of its own and
 * never asks for a read: nothing at the handshake, nothing for a
 * client that reads nothing or reads alone.
 *
 * Every plugin call is timed into a table of size classes (learn_
 * record): the fastest call of each, which a loaded machine or a busy
 * plugin can only slow, never speed.  A stream's read that misses the
 * cache (learn_grain) goes as it is until a read of its size has been
 * timed.  If that read was fast (under PLUGIN_SLOW_NS: memory, a page
 * cache), nothing is fetched or cut for the export.  If it was slow,
 * the stream's reads are served from aligned grains of
 * GUESS_PREFERRED (2M): safe to be wrong, since a grain larger than
 * the plugin's best costs at most its transfer.  The fastest of the
 * first GUESS_CALLS such calls tells the rest: the first ones wait behind the
 * reads a stream's start piles up at the plugin (nbdcopy sends 64 at
 * once), which grains then hold back.  From the read's time and the grain's, on the
 * line through both (line):
 *
 *   - the grain G: GUESS_PREFERRED where it costs less than KNEE reads
 *     (clusters decoded whole, or latency that dwarfs the transfer),
 *     else the largest power of 2 that moves in twice a read's time;
 *   - per-call cost L and bandwidth B of one stream;
 *   - preferred P, told to the connections made from then on and used
 *     as the unit of staging: the power of 2 nearest L B / 2, where a
 *     call's transfer takes half its fixed cost (2 L B if the plugin
 *     serializes requests: nothing overlaps), at least G (a cluster
 *     decoded whole for every smaller request), at most
 *     PREFERRED_CAP.  A fast plugin is told FAST_PREFERRED.
 *
 * Each faster call of either size moves the line: the choice follows
 * the plugin as it is measured, with nothing to recheck.
 */

#include <config.h>

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "learn.h"

unsigned
size_class (uint64_t bytes)
{
  unsigned c = 0;

  while (c + 1 < SIZE_CLASSES && bytes >> (c + 1 + SIZE_CLASS_SHIFT))
    c++;
  return c;
}

uint64_t
size_class_bytes (unsigned c)
{
  return UINT64_C (1) << (c + SIZE_CLASS_SHIFT);
}

void
learn_forget (struct learn *l)
{
  memset (l->table, 0, sizeof l->table);
  l->state = LEARN_NONE;
  l->base = SIZE_CLASSES;               /* no stream seen */
  l->learnt = (struct learnt) { .fast = false };
  l->sizes = (struct learn_sizes) { 0 };
  l->why[0] = '\0';
}

/* The sizes that follow from what is known. */
static void
choose_sizes (struct learn *l)
{
  const struct learnt *lt = &l->learnt;
  uint64_t p;

  if (lt->fast) {
    l->sizes = (struct learn_sizes) { .preferred = FAST_PREFERRED };
    snprintf (l->why, sizeof l->why, "reads of the stream's size took "
              "%.0f us: no latency; clients told %uK, nothing fetched "
              "or cut", lt->flat_ns / 1000, FAST_PREFERRED / 1024);
    return;
  }
  /* Clients keep many requests in flight and nbdkit's threads overlap
   * the latency: beyond L B / 2, larger requests only cost buffers
   * and caches.  Nothing overlaps over a plugin that serializes
   * requests: there a call should carry twice its fixed cost.
   */
  if (lt->ns_per_byte > 0)
    p = pow2_nearest (lt->grain, lt->lat_ns / lt->ns_per_byte *
                      (l->parallel ? 0.5 : 2), PREFERRED_CAP);
  else
    p = PREFERRED_CAP;
  p = MIN (MAX (p, lt->grain), PREFERRED_CAP);
  l->sizes = (struct learn_sizes) {
    .preferred = p, .unit = p, .grain = lt->grain,
  };
  if (lt->ns_per_byte > 0)
    snprintf (l->why, sizeof l->why,
              "grains of %" PRIu32 "K (%.2f ms); calls cost %.2f ms + "
              "%.0f MB/s: clients told %" PRIu64 "K",
              lt->grain / 1024, lt->flat_ns / 1e6, lt->lat_ns / 1e6,
              1e3 / lt->ns_per_byte, p / 1024);
  else
    snprintf (l->why, sizeof l->why,
              "grains of %" PRIu32 "K (%.2f ms), as fast as the reads "
              "they hold: clients told %" PRIu64 "K", lt->grain / 1024,
              lt->flat_ns / 1e6, p / 1024);
}

/* Known: from now on, connections are told l->sizes.  True if a size
 * told or fetched changed.
 */
static bool
adopt (struct learn *l, const struct learnt *lt)
{
  const struct learn_sizes was = l->sizes;
  const bool was_known = learn_known (l);

  l->learnt = *lt;
  l->state = LEARN_KNOWN;
  choose_sizes (l);
  return !was_known || was.preferred != l->sizes.preferred ||
    was.grain != l->sizes.grain;
}

bool
learn_teach (struct learn *l, const struct learnt *lt)
{
  if (learn_known (l))
    return false;
  adopt (l, lt);
  return true;
}

int
learn_model (const struct learn *l, struct cut_model *m)
{
  const struct learnt *lt = &l->learnt;

  if (!learn_known (l))
    return 0;
  if (lt->fast || lt->grain == 0)
    return -1;
  *m = (struct cut_model) {
    .grain = lt->grain, .flat_ns = lt->flat_ns, .lat_ns = lt->lat_ns,
    .ns_per_byte = lt->ns_per_byte,
  };
  return 1;
}

/* The cost of the stream's reads (the fastest of read bytes: r_ns) and
 * of a call of g bytes, GUESS_PREFERRED or more (g_ns), on the line
 * through both.  A call that costs less than KNEE reads holds whole
 * clusters, or the plugin's latency dwarfs its transfer: grains of
 * GUESS_PREFERRED (a qcow2's clusters are at most 2M).  Else the
 * largest power of 2 whose transfer takes at most twice a read's
 * time: a call's fixed cost is then a third of it or less, and the
 * grain no larger than that pays for bytes the stream may not read.
 */
static void
line (const struct learn *l, double r_ns, uint64_t g, double g_ns,
      struct learnt *lt)
{
  const double read = MAX (size_class_bytes (l->base), l->min);
  const double npb = g_ns > r_ns ? (g_ns - r_ns) / (g - read) : 0;

  *lt = (struct learnt) { .grain = GUESS_PREFERRED, .ns_per_byte = npb };
  lt->lat_ns = r_ns > read * npb ? r_ns - read * npb : 0;
  lt->flat_ns = lt->lat_ns + GUESS_PREFERRED * npb;
  if (g_ns <= KNEE * r_ns || npb == 0)
    return;
  lt->grain = MAX (MIN (pow2_floor (2 * r_ns / npb), GUESS_PREFERRED),
                   4096);
  lt->flat_ns = lt->lat_ns + lt->grain * npb;
}

/* What the table says of the stream's reads now.  The calls of
 * GUESS_PREFERRED or more (a stream's grains, or its runs of them:
 * several in one call) draw the line once GUESS_CALLS are timed,
 * through the size whose fastest call is the cheapest per byte beyond
 * the read (a size timed only while the machine was slow does not
 * hide another timed since).  True if a size told or fetched changed.
 */
static bool
update (struct learn *l)
{
  const struct samples *r;
  double read;
  uint64_t calls = 0, g_bytes = 0;
  double g_ns = 0, best = 0;
  struct learnt lt;
  unsigned c;

  if (l->base >= SIZE_CLASSES)          /* no stream yet (a profile's) */
    return false;
  r = &l->table[LEARN_READ][l->base];
  read = MAX (size_class_bytes (l->base), l->min);
  if (r->fastest == 0)
    return false;
  for (c = size_class (GUESS_PREFERRED); c < SIZE_CLASSES; c++) {
    const struct samples *g = &l->table[LEARN_READ][c];
    double npb;
    if (g->calls == 0)
      continue;
    calls += g->calls;
    npb = ((double) g->fastest - r->fastest) / (size_class_bytes (c) - read);
    if (g_bytes == 0 || npb < best) {
      best = npb;
      g_bytes = size_class_bytes (c);
      g_ns = g->fastest;
    }
  }
  if (r->fastest < PLUGIN_SLOW_NS)
    lt = (struct learnt) { .fast = true, .flat_ns = r->fastest };
  else if (calls < GUESS_CALLS) {
    if (l->state == LEARN_NONE)
      l->state = LEARN_GUESS;
    return false;
  }
  else
    line (l, r->fastest, g_bytes, g_ns, &lt);
  return adopt (l, &lt);
}

bool
learn_record (struct learn *l, enum learn_dir d, uint64_t bytes, uint64_t ns)
{
  const unsigned c = size_class (bytes);
  struct samples *s = &l->table[d][c];
  const bool faster = s->fastest == 0 || ns < s->fastest;

  s->calls++;
  s->bytes += bytes;
  s->ns += ns;
  if (faster)
    s->fastest = ns;
  /* Only the costs the rule rests on. */
  if (d != LEARN_READ || l->state == LEARN_NONE)
    return false;
  if ((c == l->base && faster) || c >= size_class (GUESS_PREFERRED))
    return update (l);
  return false;
}

uint32_t
learn_grain (struct learn *l, uint32_t count, uint64_t cap)
{
  const unsigned c = size_class (count);
  const uint64_t fastest = l->table[LEARN_READ][c].fastest;
  uint32_t g;

  if (count >= BASE_MAX)
    return 0;
  if (fastest && (c != l->base || l->state == LEARN_NONE)) {
    l->base = c;
    update (l);
  }
  /* Reads not timed yet go as they are (one-shot commands read only
   * what they ask for), and so do reads measured fast, unless a
   * profile said otherwise.
   */
  if (l->state == LEARN_KNOWN)
    g = l->learnt.fast ? 0 : l->sizes.grain;
  else if (l->state == LEARN_GUESS && fastest >= PLUGIN_SLOW_NS)
    g = GUESS_PREFERRED;
  else
    g = 0;
  if (g <= count || g > cap || (l->min && g % l->min))
    return 0;
  return g;
}
