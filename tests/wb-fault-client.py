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
#   --names N      connections to N export names (one each) over one
#                  storage: a read checks only the bytes its own name
#                  wrote last (names promise each other no coherence),
#                  and the final file must hold the last write of each
#                  byte, whatever name wrote it
#   --reconnect P  before each request, with chance P, one connection
#                  is dropped (no flush, no NBD_CMD_DISC) and made anew
#   --no-flush     end without the final flush (the caller stops the
#                  server at once: the staged data is then pending)
#
# usage: wb-fault-client.py SEED URI SIZE MODEL [--ops N] [options]
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
p.add_argument("--names", type=int, default=1)
p.add_argument("--reconnect", type=float, default=0.0)
p.add_argument("--no-flush", action="store_true")
a = p.parse_args()
rng = random.Random(a.seed)
print("wb-fault-client: seed %d" % a.seed, flush=True)


def connect(name):
    """A connection to export n<name> (the URI's path names the export,
    overriding set_export_name), or to the URI's own with one name."""
    uri = a.uri
    if a.names > 1:
        q = uri.index("?")
        base = uri[:q][:-1] if uri[:q].endswith(":///") else uri[:q]
        uri = base + "/n%d" % name + uri[q:]
    h = nbd.NBD()
    h.connect_uri(uri)
    assert a.names == 1 or h.get_export_name() == "n%d" % name
    return h


hs = []
name_of = []                            # export name index per connection
for n in range(a.names):
    hs.append(connect(n))
    name_of.append(n)
if a.names == 1 and hs[0].can_multi_conn():
    for _ in range(2):
        hs.append(connect(0))
        name_of.append(0)
can_fua = hs[0].can_fua()

model = bytearray(a.size)               # the disk starts as zeros
known = bytearray(b"\1" * a.size)       # 0: contents undefined
owner = bytearray(a.size)               # the name that wrote it last
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
    owner[off:off + n] = bytes([name_of[hs.index(h)]]) * n
    recent.append((off, off + n))
    del recent[:-16]


def zero(h):
    off, n = pick()
    known[off:off + n] = bytes(n)
    until_done("zero", h.zero, n, off)
    model[off:off + n] = bytes(n)
    known[off:off + n] = b"\1" * n
    owner[off:off + n] = bytes([name_of[hs.index(h)]]) * n


def trim(h):
    off, n = pick()
    attempt(h.trim, n, off)
    known[off:off + n] = bytes(n)       # undefined, done or not


def read(h):
    off, n = pick()
    got = attempt(h.pread, n, off)
    if got is None:
        return
    me = name_of[hs.index(h)]
    for i in range(n):
        if known[off + i] and got[i] != model[off + i] and \
           owner[off + i] == me:
            sys.exit("wb-fault-client: seed %d: WRONG DATA at %d (read "
                     "%d+%d on connection %d): got %d want %d: acknowledged "
                     "data not readable" % (a.seed, off + i, off, n,
                                            hs.index(h), got[i],
                                            model[off + i]))
    stats["checked"] += n


def flush(h):
    if attempt(h.flush) is None:
        stats["flush failed"] += 1


def reconnect():
    i = rng.randrange(len(hs))
    hs[i] = None                        # dropped: no flush, no DISC
    hs[i] = connect(name_of[i])
    stats["reconnects"] += 1


stats["reconnects"] = 0
ops = [(write, 10), (read, 8), (zero, 1), (trim, 1), (flush, 2)]
for _ in range(a.ops):
    if a.reconnect and rng.random() < a.reconnect:
        reconnect()
    fn = rng.choices([o[0] for o in ops], [o[1] for o in ops])[0]
    fn(rng.choice(hs))

if not a.no_flush:
    for h in hs:                        # every name's staged data
        until_done("final flush", h.flush)
    for h in hs:
        h.shutdown()
open(a.model, "wb").write(model)
open(a.model + ".mask", "wb").write(known)
print("wb-fault-client: seed %d: %d connections, %d ok, %d errors, "
      "%d flushes failed, %d bytes checked, %d reconnects"
      % (a.seed, len(hs), stats["ok"], stats["errors"],
         stats["flush failed"], stats["checked"], stats["reconnects"]))
