#!/usr/bin/python3
# stream-reads.py URI COUNT DEPTH [BYTES] [--from OFFSET] [--check FILE]:
# read the export in reads of COUNT bytes from OFFSET (default 0),
# DEPTH of them in flight (as nbdcopy keeps 64), BYTES in all (default:
# to the end).  With --check, a file whose bytes the export must hold:
# every read is compared.  URI may be a unix socket's path.
import argparse
import sys
import nbd

p = argparse.ArgumentParser()
p.add_argument("uri")
p.add_argument("count", type=int)
p.add_argument("depth", type=int)
p.add_argument("bytes", type=int, nargs="?")
p.add_argument("--from", dest="start", type=int, default=0)
p.add_argument("--check")
a = p.parse_args()

h = nbd.NBD()
if a.uri.startswith("nbd"):
    h.connect_uri(a.uri)
else:
    h.connect_unix(a.uri)
size = h.get_size()
end = size if a.bytes is None else min(a.start + a.bytes, size)
want = open(a.check, "rb") if a.check else None
done = {}


def back(off, buf, err):
    if err.value:
        sys.exit("stream-reads: read at %d failed: %d" % (off, err.value))
    if want:
        done[off] = buf.to_bytearray()
    return 1


off = a.start
while off < end or h.aio_in_flight() > 0:
    while off < end and h.aio_in_flight() < a.depth:
        n = min(a.count, end - off)
        buf = nbd.Buffer(n)
        h.aio_pread(buf, off,
                    completion=lambda err, o=off, b=buf: back(o, b, err))
        off += n
    h.poll(-1)
if want:
    for o in sorted(done):
        want.seek(o)
        if want.read(len(done[o])) != bytes(done[o]):
            sys.exit("stream-reads: wrong data at %d" % o)
print("stream-reads: %d bytes from %d in %d-byte reads, %d deep%s"
      % (end - a.start, a.start, a.count, a.depth,
         ", every byte checked" if want else ""))
