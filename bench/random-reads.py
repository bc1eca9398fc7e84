#!/usr/bin/python3
# Random 4K reads, aligned, with DEPTH in flight: a database-like
# client for bench/tune.sh.  usage: random-reads.py URI COUNT DEPTH
import random
import sys

import cli

USAGE = ("usage: random-reads.py URI COUNT DEPTH\n"
         "COUNT random aligned 4K reads of the NBD export at URI, DEPTH in\nflight.  Writes nothing; runs until the reads are done.")
cli.args(3, USAGE)

import nbd

uri, count, depth = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(1)
h = nbd.NBD()
h.connect_uri(uri)
blocks = h.get_size() // 4096
bufs = [nbd.Buffer(4096) for _ in range(depth)]
free = list(range(depth))
inflight = {}
issued = 0


def done(i):
    def cb(err):
        free.append(i)
        return 1
    return cb


while issued < count or h.aio_in_flight() > 0:
    while issued < count and free:
        i = free.pop()
        h.aio_pread(bufs[i], rng.randrange(blocks) * 4096,
                    completion=done(i))
        issued += 1
    h.poll(-1)
h.shutdown()
