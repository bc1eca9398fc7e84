#!/usr/bin/python3
# Client for test-interrupt.sh: CONNS connections keep DEPTH writes in
# flight, each to its own slot of the disk (slot i: 64K at i * 64K, an
# unaligned start and length inside it, filled with byte i % 251 + 1).
# Every acknowledged write is appended to LOG at once, so that whatever
# kills this client or the server, LOG lists what was acknowledged.
import os, random, sys
import nbd

seed, uri, log = int(sys.argv[1]), sys.argv[2], sys.argv[3]
conns, depth = 4, 32
rng = random.Random(seed)
out = open(log, "a", buffering=1)
hs = [nbd.NBD() for _ in range(conns)]
for h in hs:
    h.connect_uri(uri)
slots = hs[0].get_size() // 65536
nxt = 0


def acked(i, off, n):
    def cb(err):
        # libnbd passes the error as a ctypes int.
        if getattr(err, "value", err) == 0:
            out.write("%d %d %d\n" % (i, off, n))
            out.flush()
            os.fsync(out.fileno())
        return 1
    return cb


try:
    while nxt < slots or any(h.aio_in_flight() for h in hs):
        for h in hs:
            while nxt < slots and h.aio_in_flight() < depth:
                off = nxt * 65536 + rng.randrange(4096)
                n = rng.randrange(1, 65536 - (off % 65536) + 1)
                buf = nbd.Buffer.from_bytearray(bytearray([nxt % 251 + 1]) * n)
                h.aio_pwrite(buf, off, completion=acked(nxt, off, n))
                nxt += 1
        hs[0].poll(100)
        for h in hs[1:]:
            h.poll(0)
except nbd.Error as e:
    print("interrupt-client: stopped: %s" % e.string)
