#!/usr/bin/python3
# Client for test-wb-faults.sh: the semantics of a disk's volatile
# write cache, under a plugin that fails requests at random.
#
# Connections (3 when the server allows multi-conn, else 1) send, one
# request at a time in random order: unaligned writes (some FUA),
# zeroes, trims, flushes and reads.  The model holds every byte whose
# write or zero was acknowledged:
#   - a read that succeeds returns, for every byte the model knows,
#     exactly the model's byte, on any connection, whether or not a
#     flush came between, and whatever write-back failed meanwhile;
#   - a failed write or zero leaves its bytes unknown (part of it may
#     have happened); the client sends it again until it succeeds, as
#     a real client would; a trimmed range is unknown;
#   - a failed flush changes nothing in the model: acknowledged data
#     stays readable until it reaches the plugin.
# At the end a flush must succeed (retried), and the model is written
# to MODEL for the caller to compare with the backing file.
#
# usage: wb-fault-client.py SEED URI SIZE MODEL [--ops N]
import argparse
import random
import sys

import nbd

p = argparse.ArgumentParser()
p.add_argument("seed", type=int)
p.add_argument("uri")
p.add_argument("size", type=int)
p.add_argument("model")
p.add_argument("--ops", type=int, default=1500)
a = p.parse_args()
rng = random.Random(a.seed)

hs = []
h = nbd.NBD()
h.connect_uri(a.uri)
hs.append(h)
if h.can_multi_conn():
    for _ in range(2):
        h = nbd.NBD()
        h.connect_uri(a.uri)
        hs.append(h)
can_fua = hs[0].can_fua()

model = bytearray(a.size)               # the disk starts as zeros
known = bytearray(b"\1" * a.size)       # 0: contents undefined
recent = []                             # ranges written lately
stats = {"ok": 0, "errors": 0, "checked": 0, "flush failed": 0}


def attempt(fn, *args):
    """One request: its result, or None on a clean (errno) error."""
    try:
        r = fn(*args)
        stats["ok"] += 1
        return True if r is None else r
    except nbd.Error as e:
        if e.errno is None:
            sys.exit("wb-fault-client: seed %d: not an errno error: %s"
                     % (a.seed, e.string))
        stats["errors"] += 1
        return None


def pick():
    n = rng.choice([1, 100, 512, 3584, 4096, 4097, 20000,
                    rng.randrange(1, 140000)])
    n = min(n, a.size)
    if recent and rng.random() < 0.5:
        lo, hi = rng.choice(recent)     # near what was written lately
        off = max(0, min(a.size - n, lo + rng.randrange(-4096, 4096)))
    else:
        off = rng.randrange(0, a.size - n + 1)
    return off, n


def until_done(what, fn, *args):
    for _ in range(100):
        if attempt(fn, *args):
            return
    sys.exit("wb-fault-client: seed %d: %s failed 100 times" % (a.seed, what))


def write(h):
    off, n = pick()
    data = rng.randbytes(n)
    flags = nbd.CMD_FLAG_FUA if can_fua and rng.random() < 0.1 else 0
    known[off:off + n] = bytes(n)       # unknown until acknowledged
    until_done("write", h.pwrite, data, off, flags)
    model[off:off + n] = data
    known[off:off + n] = b"\1" * n
    recent.append((off, off + n))
    del recent[:-16]


def zero(h):
    off, n = pick()
    known[off:off + n] = bytes(n)
    until_done("zero", h.zero, n, off)
    model[off:off + n] = bytes(n)
    known[off:off + n] = b"\1" * n


def trim(h):
    off, n = pick()
    attempt(h.trim, n, off)
    known[off:off + n] = bytes(n)       # undefined, done or not


def read(h):
    off, n = pick()
    got = attempt(h.pread, n, off)
    if got is None:
        return
    for i in range(n):
        if known[off + i] and got[i] != model[off + i]:
            sys.exit("wb-fault-client: seed %d: WRONG DATA at %d (read "
                     "%d+%d on connection %d): got %d want %d: acknowledged "
                     "data not readable" % (a.seed, off + i, off, n,
                                            hs.index(h), got[i],
                                            model[off + i]))
    stats["checked"] += n


def flush(h):
    if attempt(h.flush) is None:
        stats["flush failed"] += 1


ops = [(write, 10), (read, 8), (zero, 1), (trim, 1), (flush, 2)]
for _ in range(a.ops):
    fn = rng.choices([o[0] for o in ops], [o[1] for o in ops])[0]
    fn(rng.choice(hs))

until_done("final flush", hs[0].flush)
for h in hs:
    h.shutdown()
open(a.model, "wb").write(model)
open(a.model + ".mask", "wb").write(known)
print("wb-fault-client: seed %d: %d connections, %d ok, %d errors, "
      "%d flushes failed, %d bytes checked"
      % (a.seed, len(hs), stats["ok"], stats["errors"],
         stats["flush failed"], stats["checked"]))
