#!/usr/bin/env bash
# Exports whose names differ but whose storage is the same (the memory
# plugin ignores export names): read-modify-writes through both must
# not lose each other's bytes, and a write through one must not leave
# stale read-ahead data in the other's cache.
source "$srcdir/functions.sh"
requires /usr/bin/python3 -c 'import nbd'

timed 120 nbdkit -U - --filter="$FILTER" --filter=delay memory 4M \
  delay-write=200ms reshape-min=4096 \
  --run '/usr/bin/python3 -c "
import nbd, sys
def conn(name):
    h = nbd.NBD(); h.set_export_name(name); h.connect_unix(sys.argv[1])
    return h
a, b = conn(\"\"), conn(\"other\")
# Two read-modify-writes of one block, at the same time, two names.
ca = a.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(b\"A\")), 0)
cb = b.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(b\"B\")), 1)
for h, c in ((a, ca), (b, cb)):       # both are sent already
    while h.aio_in_flight():
        h.poll(-1)
    assert h.aio_command_completed(c)
got = a.pread(2, 0)
assert got == b\"AB\", \"lost write across export names: %r\" % got
# Read ahead through a, write through b, read again through a.
for i in range(64):
    a.pread(4096, 65536 + i * 4096)
b.pwrite(b\"new!\", 65536 + 100000)
assert a.pread(4, 65536 + 100000) == b\"new!\", \"stale cache across names\"
print(\"ok: aliased exports\")
" "$unixsocket"'
