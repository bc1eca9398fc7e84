#!/usr/bin/python3
# Workload for bench/unaligned-writes.sh: N in flight, SIZE-byte writes
# back to back over TOTAL bytes, each filled with its own byte value,
# then everything read back and checked.  Exits non-zero on bad data.
import sys

import cli
USAGE = ("usage: unaligned-writes.py URI SIZE TOTAL DEPTH\n"
         "SIZE-byte writes over TOTAL bytes of the NBD export at URI, DEPTH in\nflight, then reads them back and checks them (exit 1 on bad data).\nWrites to the export only.")
cli.args(4, USAGE)

import nbd

uri, size, total, depth = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
h = nbd.NBD()
h.connect_uri(uri)
n = total // size
bufs = [nbd.Buffer.from_bytearray(bytearray([i % 251 + 1]) * size)
        for i in range(251)]
for i in range(n):
    h.aio_pwrite(bufs[i % 251], i * size)
    while h.aio_in_flight() >= depth:
        h.poll(-1)
while h.aio_in_flight() > 0:
    h.poll(-1)
h.flush()
data = h.pread(n * size, 0) if n * size <= 32 << 20 else None
for i in range(n):
    if data[i * size:(i + 1) * size] != bytes([i % 251 + 1]) * size:
        sys.exit("bad data in write %d at %d" % (i, i * size))
print("verified %d writes of %d bytes" % (n, size))
