#!/usr/bin/python3
# A client that mixes every NBD command the server offers, cache and
# block status included, between streams of sequential reads (which
# turn the filter's readahead and learning on), and checks every read
# against a model of the disk.  Any command may follow any state the
# filter can be in: a request nbdkit's core was not told it could
# pass down aborts the server, and the next request here then fails.
#
# usage: fuzz-client.py SEED URI SIZE [--ops N]
# The disk starts as zeros.

import argparse
import errno
import random
import sys

import nbd

p = argparse.ArgumentParser()
p.add_argument("seed", type=int)
p.add_argument("uri")
p.add_argument("size", type=int)
p.add_argument("--ops", type=int, default=400)
a = p.parse_args()
print("fuzz-client: seed %d, %d ops, size %d" % (a.seed, a.ops, a.size),
      flush=True)
rng = random.Random(a.seed)

model = bytearray(a.size)
defined = bytearray(b"\1" * a.size)     # 0: trimmed, contents undefined
h = nbd.NBD()
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.connect_uri(a.uri)
can = {
    "write": not h.is_read_only(),
    "fua": h.can_fua(), "flush": h.can_flush(), "trim": h.can_trim(),
    "zero": h.can_zero(), "fast_zero": h.can_fast_zero(),
    "cache": h.can_cache(),
    "extents": h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION),
}
print("server offers:", " ".join(k for k, v in can.items() if v), flush=True)
counts = {}


def place(maxlen):
    n = rng.choice([1, 511, 512, 4096, 4097, 65536, rng.randint(1, maxlen)])
    n = min(n, a.size)
    return rng.randint(0, a.size - n), n


def check(off, buf, what):
    if buf == model[off:off + len(buf)]:
        return
    for i, b in enumerate(buf):
        if defined[off + i] and b != model[off + i]:
            sys.exit("fuzz-client: seed %d: %s: byte %d differs (%d, model %d)"
                     % (a.seed, what, off + i, b, model[off + i]))


def read(off, n):
    check(off, h.pread(n, off), "read %d+%d" % (off, n))


def stream():
    """Sequential reads, some pipelined: what turns readahead on."""
    n = rng.choice([512, 4096, 16384])
    k = rng.randint(8, 600)
    off = rng.randint(0, max(0, a.size - n * k)) // n * n
    if rng.random() < 0.5:
        for i in range(k):
            if off + n > a.size:
                break
            read(off, n)
            off += n
    else:
        cookies = []
        for i in range(k):
            if off + n > a.size:
                break
            buf = nbd.Buffer(n)
            cookies.append((h.aio_pread(buf, off), off, buf))
            off += n
            if len(cookies) >= 16:
                drain(cookies)
        drain(cookies)


def drain(cookies):
    while cookies:
        cookie, off, buf = cookies[0]
        while not h.aio_command_completed(cookie):
            h.poll(-1)
        check(off, buf.to_bytearray(), "aio read %d+%d" % (off, len(buf)))
        cookies.pop(0)


def write(fua):
    off, n = place(200000)
    data = rng.randbytes(n)
    h.pwrite(data, off, nbd.CMD_FLAG_FUA if fua else 0)
    model[off:off + n] = data
    defined[off:off + n] = b"\1" * n


def zero():
    off, n = place(3 << 20)
    flags = 0
    if rng.random() < 0.5:
        flags |= nbd.CMD_FLAG_NO_HOLE
    if can["fua"] and rng.random() < 0.3:
        flags |= nbd.CMD_FLAG_FUA
    if can["fast_zero"] and rng.random() < 0.5:
        flags |= nbd.CMD_FLAG_FAST_ZERO
    try:
        h.zero(n, off, flags)
    except nbd.Error as e:
        # A fast zero may refuse (ENOTSUP) and must change nothing.
        if not flags & nbd.CMD_FLAG_FAST_ZERO or e.errnum != errno.ENOTSUP:
            raise
        return
    model[off:off + n] = bytes(n)
    defined[off:off + n] = b"\1" * n


def trim():
    off, n = place(3 << 20)
    h.trim(n, off, nbd.CMD_FLAG_FUA if can["fua"] and rng.random() < 0.3
           else 0)
    defined[off:off + n] = bytes(n)


def extents():
    off, n = place(8 << 20)
    seen = []
    h.block_status(n, off, lambda ctx, o, ents, err: seen.append(len(ents)))
    if not seen or seen[0] < 2:
        sys.exit("fuzz-client: seed %d: block status %d+%d: no extent"
                 % (a.seed, off, n))


ops = [("stream", 6, stream), ("read", 4, lambda: read(*place(300000)))]
if can["write"]:
    ops += [("write", 4, lambda: write(False))]
    if can["fua"]:
        ops += [("write-fua", 2, lambda: write(True))]
    if can["zero"]:
        ops += [("zero", 2, zero)]
    if can["trim"]:
        ops += [("trim", 2, trim)]
if can["flush"]:
    ops += [("flush", 2, h.flush)]
if can["cache"]:
    ops += [("cache", 4, lambda: h.cache(*reversed(place(64 << 20))))]
if can["extents"]:
    ops += [("extents", 2, extents)]
names = [o[0] for o in ops for _ in range(o[1])]
funcs = dict((o[0], o[2]) for o in ops)

for i in range(a.ops):
    name = rng.choice(names)
    counts[name] = counts.get(name, 0) + 1
    try:
        funcs[name]()
    except nbd.Error as e:
        sys.exit("fuzz-client: seed %d: op %d (%s): %s" % (a.seed, i, name, e))

# Whatever came before, the server still answers, and holds the data.
read(0, min(a.size, 1 << 20))
if can["flush"]:
    h.flush()
h.shutdown()
print("fuzz-client: done:", " ".join("%s %d" % kv for kv in sorted(counts.items())))
