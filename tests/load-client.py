#!/usr/bin/python3
# Client for test-limits.sh: CONNS connections each keeping DEPTH
# requests in flight, TOTAL requests per connection: 40% of the
# server's 32M limit (from shared buffers, so that the client stays
# small), the rest of random, mostly unaligned size up to 1M or 64K,
# at random offsets; reads and writes mixed.  Contents are not checked
# here (other tests do).
import argparse, random, sys
import nbd

p = argparse.ArgumentParser()
p.add_argument("seed", type=int)
p.add_argument("uri")
p.add_argument("--conns", type=int, default=4)
p.add_argument("--depth", type=int, default=64)
p.add_argument("--total", type=int, default=96)
a = p.parse_args()
rng = random.Random(a.seed)
MAX = 32 << 20
wbuf = nbd.Buffer.from_bytearray(bytearray(b"\x5a" * MAX))
rbuf = nbd.Buffer(MAX)

hs = []
for _ in range(a.conns):
    h = nbd.NBD()
    h.connect_uri(a.uri)
    hs.append(h)
size = hs[0].get_size()
left = {h: a.total for h in hs}
done = 0


def issue(h):
    r = rng.random()
    big = r < 0.4
    n = MAX if big else rng.randrange(1, (1 << (20 if r < 0.7 else 16)) + 1)
    off = rng.randrange(0, size - n + 1)
    if rng.random() < 0.5:
        buf = rbuf if big else nbd.Buffer(n)
        h.aio_pread(buf, off, completion=lambda *args: 1)
    else:
        buf = wbuf if big else nbd.Buffer.from_bytearray(bytearray(n))
        h.aio_pwrite(buf, off, completion=lambda *args: 1)


while any(left.values()) or any(h.aio_in_flight() for h in hs):
    for h in hs:
        while left[h] and h.aio_in_flight() < a.depth:
            issue(h)
            left[h] -= 1
    busy = [h for h in hs if h.aio_in_flight()]
    if busy:
        busy[0].poll(-1)
        for h in busy[1:]:
            h.poll(0)
for h in hs:
    h.shutdown()
print("load-client: seed %d: %d connections x %d requests, %d deep"
      % (a.seed, a.conns, a.total, a.depth))
