#!/usr/bin/python3
# Randomized differential test: several connections issue concurrent,
# non-overlapping, unaligned pread/pwrite/zero/trim/flush (some FUA)
# through the filter; every read is checked against a model of the
# disk.  Concurrent requests never overlap in bytes but often share
# minimum blocks, which is where a read-modify-write could lose data.
#
# usage: random-io.py SEED URI SIZE OUTPUT-MODEL [options]
#   --conns N --depth N --ops N --maxlen N --errors (expect some EIO)
# Writes the final model (and a mask of defined bytes) so the caller
# can compare the backing file after nbdkit exits.

import argparse
import errno
import random
import sys

import nbd

p = argparse.ArgumentParser()
p.add_argument("seed", type=int)
p.add_argument("uri")
p.add_argument("size", type=int)
p.add_argument("model")
p.add_argument("--conns", type=int, default=4)
p.add_argument("--depth", type=int, default=8)
p.add_argument("--ops", type=int, default=2000)
p.add_argument("--maxlen", type=int, default=3 * 65536)
p.add_argument("--errors", action="store_true")
p.add_argument("--seqwrite", action="store_true",
               help="half of the sequential operations are writes")
p.add_argument("--seq", type=float, default=0.0,
               help="share of reads that continue the connection's last "
                    "read (exercises readahead)")
a = p.parse_args()
print("random-io: seed %d, %d connections x %d deep, %d ops, size %d"
      % (a.seed, a.conns, a.depth, a.ops, a.size), flush=True)
rng = random.Random(a.seed)

# The disk starts as the caller made it: zeros.
model = bytearray(a.size)
defined = bytearray(b"\1" * a.size)     # 0 = contents undefined

handles = []
for _ in range(a.conns):
    h = nbd.NBD()
    h.connect_uri(a.uri)
    handles.append(h)
can_fua = handles[0].can_fua()
can_trim = handles[0].can_trim()
can_zero = handles[0].can_zero()
can_fast_zero = handles[0].can_fast_zero()

cursor = {}          # handle -> where its next sequential read starts
inflight = []        # (handle, cookie, kind, off, len, buf, expect, mask)
busy = []            # byte ranges of requests in flight


def overlaps(off, n):
    return any(off < e and s < off + n for s, e in busy)


def pick_range():
    for _ in range(100):
        n = rng.choice([1, 7, 512, 4095, 4096, 4097, 65536,
                        rng.randrange(1, a.maxlen + 1)])
        n = min(n, a.size)
        # Bias towards the end of the export sometimes.
        if rng.random() < 0.1:
            off = a.size - n
        else:
            off = rng.randrange(0, a.size - n + 1)
        if not overlaps(off, n):
            return off, n
    return None


def sequential(h):
    # Each connection streams through its own part of the disk.
    off = cursor.get(h, handles.index(h) * a.size // len(handles))
    n = rng.choice([512, 4096, 4096, 8192, 65536])
    if off + n > a.size:
        off = 0
    if overlaps(off, n):
        return None
    cursor[h] = off + n
    return off, n


def issue(h):
    x = rng.random()
    r = None
    if a.seq and rng.random() < a.seq:
        r = sequential(h)
        if r is not None:
            x = 0.5 if a.seqwrite and rng.random() < 0.5 else 0.0
    if r is None:
        r = pick_range()
    if r is None:
        return False
    off, n = r
    flags = nbd.CMD_FLAG_FUA if can_fua and rng.random() < 0.2 else 0
    if x < 0.45:
        buf = nbd.Buffer(n)
        c = h.aio_pread(buf, off)
        rec = (h, c, "pread", off, n, buf,
               bytes(model[off:off + n]), bytes(defined[off:off + n]))
    elif x < 0.85:
        data = rng.randbytes(n)
        c = h.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(data)), off,
                         flags=flags)
        model[off:off + n] = data
        defined[off:off + n] = b"\1" * n
        rec = (h, c, "pwrite", off, n, None, None, None)
    elif x < 0.93 and can_zero:
        if rng.random() < 0.5:
            flags |= nbd.CMD_FLAG_NO_HOLE
        if can_fast_zero and rng.random() < 0.2:
            flags |= nbd.CMD_FLAG_FAST_ZERO
        c = h.aio_zero(n, off, flags=flags)
        # A fast zero may fail with ENOTSUP and leave the range alone;
        # mark it undefined until we know.
        old = bytes(model[off:off + n])
        model[off:off + n] = bytes(n)
        defined[off:off + n] = b"\1" * n
        rec = (h, c, "zero", off, n, old, flags, None)
    elif x < 0.97 and can_trim:
        c = h.aio_trim(n, off, flags=flags)
        defined[off:off + n] = bytes(n)     # trimmed data is undefined
        rec = (h, c, "trim", off, n, None, None, None)
    else:
        c = h.aio_flush()
        off, n = 0, 0
        rec = (h, c, "flush", 0, 0, None, None, None)
    inflight.append(rec)
    if n:
        busy.append((off, off + n))
    return True


errors = 0
checked = 0


def retire(rec, err):
    global errors, checked
    h, c, kind, off, n, buf, expect, mask = rec
    if n:
        busy.remove((off, off + n))
    if err is not None:
        # A fast zero on unaligned blocks fails at once, doing nothing.
        if kind == "zero" and (expect & nbd.CMD_FLAG_FAST_ZERO) and \
           err.errno == errno.ENOTSUP:
            model[off:off + n] = buf
            return
        if not a.errors:
            sys.exit("random-io: seed %d: unexpected error: %s %d+%d: %s"
                     % (a.seed, kind, off, n, err))
        errors += 1
        # A failed write may have happened in part: undefined now.
        if kind in ("pwrite", "zero", "trim"):
            defined[off:off + n] = bytes(n)
        return
    if kind == "pread":
        got = buf.to_bytearray()
        for i in range(n):
            if mask[i] and got[i] != expect[i]:
                sys.exit("random-io: seed %d: WRONG DATA at %d (read %d+%d): "
                         "got %d want %d" % (a.seed, off + i, off, n,
                                             got[i], expect[i]))
        checked += n


done = 0
while done < a.ops or inflight:
    for h in handles:
        while done < a.ops and \
                sum(1 for r in inflight if r[0] is h) < a.depth:
            if not issue(h):
                break
            done += 1
    # Wait for any connection with work in flight.
    hs = [r[0] for r in inflight]
    if not hs:
        continue
    hs[0].poll(-1)
    for h in handles:
        if h is not hs[0]:
            h.poll(0)
    for rec in list(inflight):
        h, c = rec[0], rec[1]
        try:
            if not h.aio_command_completed(c):
                continue
            err = None
        except nbd.Error as e:
            err = e
        inflight.remove(rec)
        retire(rec, err)

for h in handles:
    if not a.errors:
        h.flush()
    h.shutdown()

with open(a.model, "wb") as f:
    f.write(model)
with open(a.model + ".mask", "wb") as f:
    f.write(defined)
print("random-io: seed %d: %d ops, %d bytes checked, %d errors"
      % (a.seed, a.ops, checked, errors))
if a.errors and errors == 0:
    sys.exit("random-io: seed %d: errors were injected but none reached "
             "the client" % a.seed)
