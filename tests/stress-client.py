#!/usr/bin/python3
# Client for test-stress.sh: CLIENTS processes connect at once, each
# in its own region of the export, of mixed kinds:
#   seq     synchronous sequential 4K reads (readahead territory)
#   write   64 unaligned writes in flight over the region, then the
#           region read back and checked
#   random  random unaligned reads with 16 in flight
# The export starts as nbdkit's pattern plugin would show it (each
# 8-byte word holds its own offset, big-endian), so every byte read is
# checked.  A watchdog fails the run if any client has not finished
# within TIMEOUT seconds: that is a hang, whatever the cause.
#
# usage: stress-client.py SEED URI SIZE KINDS TIMEOUT
#   KINDS: one letter per client, s(eq), w(rite), r(andom)
import array
import multiprocessing
import random
import sys
import time

import nbd


def pattern(off, n):
    """What the pattern plugin holds at [off, off+n)."""
    start = off - off % 8
    words = array.array("Q", range(start, off + n + 8, 8))
    if sys.byteorder == "little":
        words.byteswap()
    b = words.tobytes()
    return b[off - start:off - start + n]


def check(what, off, got, want):
    if got != want:
        i = next(i for i in range(len(want)) if got[i] != want[i])
        sys.exit("stress-client: %s: WRONG DATA at %d (request %d+%d): "
                 "got %d want %d" % (what, off + i, off, len(want),
                                     got[i], want[i]))


def connect(uri):
    h = nbd.NBD()
    h.connect_uri(uri)
    return h


def seq_reader(uri, rng, lo, hi):
    h = connect(uri)
    for off in range(lo, hi, 4096):
        check("seq", off, h.pread(4096, off), pattern(off, 4096))
    h.shutdown()


def drain(h, depth, inflight, retire):
    while len(inflight) > depth:
        h.poll(-1)
        for rec in list(inflight):
            if h.aio_command_completed(rec[0]):
                inflight.remove(rec)
                retire(rec)


def writer(uri, rng, lo, hi):
    h = connect(uri)
    want = bytearray(pattern(lo, hi - lo))
    inflight = []
    off = lo + rng.randrange(0, 4096)
    while off < hi:
        n = min(rng.choice([1, 511, 3584, 4097, rng.randrange(1, 20000)]),
                hi - off)
        data = rng.randbytes(n)
        want[off - lo:off - lo + n] = data
        buf = nbd.Buffer.from_bytearray(bytearray(data))
        inflight.append((h.aio_pwrite(buf, off), buf))
        drain(h, 63, inflight, lambda rec: None)
        off += n + rng.choice([0, 0, 0, 1, 4096])
    drain(h, 0, inflight, lambda rec: None)
    for off in range(lo, hi, 65536):
        n = min(65536, hi - off)
        check("write read-back", off, h.pread(n, off),
              bytes(want[off - lo:off - lo + n]))
    h.shutdown()


def random_reader(uri, rng, lo, hi):
    h = connect(uri)
    inflight = []

    def retire(rec):
        cookie, buf, off = rec
        check("random", off, bytes(buf.to_bytearray()),
              pattern(off, buf.size()))

    for _ in range(400):
        n = min(rng.choice([1, 4096, 5000, rng.randrange(1, 70000)]), hi - lo)
        off = rng.randrange(lo, hi - n + 1)
        buf = nbd.Buffer(n)
        inflight.append((h.aio_pread(buf, off), buf, off))
        drain(h, 15, inflight, retire)
    drain(h, 0, inflight, retire)
    h.shutdown()


KINDS = {"s": seq_reader, "w": writer, "r": random_reader}


def run(kind, uri, seed, lo, hi):
    KINDS[kind](uri, random.Random(seed), lo, hi)


def main():
    seed, uri, size, kinds, timeout = \
        int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], \
        float(sys.argv[5])
    region = size // len(kinds)
    region -= region % 4096
    procs = []
    for i, k in enumerate(kinds):
        p = multiprocessing.Process(
            target=run, args=(k, uri, seed * 1000 + i, i * region,
                              (i + 1) * region))
        p.start()
        procs.append((i, k, p))
    deadline = time.monotonic() + timeout
    for i, k, p in procs:
        p.join(max(0, deadline - time.monotonic()))
    hung = [(i, k) for i, k, p in procs if p.is_alive()]
    failed = [(i, k) for i, k, p in procs
              if not p.is_alive() and p.exitcode != 0]
    for i, k, p in procs:
        if p.is_alive():
            p.kill()
    if hung:
        sys.exit("stress-client: seed %d: HANG: clients %s still running "
                 "after %g s" % (seed, hung, timeout))
    if failed:
        sys.exit("stress-client: seed %d: clients %s failed" % (seed, failed))
    print("stress-client: seed %d: %d clients (%s), all data checked"
          % (seed, len(kinds), kinds))


if __name__ == "__main__":
    main()
