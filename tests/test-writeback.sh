#!/usr/bin/env bash
# reshape-writeback=true: small writes are staged and acknowledged;
# they reach the plugin combined, on flush, before overlapping reads
# and block status, and at connection close (SIGTERM included); a
# deferred failure is returned by the next flush.
source "$srcdir/functions.sh"
requires nbdsh --version
test -f "$MODEL" || { echo "model plugin not built"; exit 77; }

# SIGTERM while a client is connected, after unflushed writes.
truncate -s 4M "$tmp/disk"
start_server "$tmp/sock" "$tmp/pid" --filter="$FILTER" file "$tmp/disk" \
  reshape-writeback=true
nbdsh -u "nbd+unix:///?socket=$tmp/sock" -c '
import time
for i in range(100):
    h.pwrite(bytes([65 + i % 26]) * 3000, 7 + i * 3000)
print("acknowledged, not flushed"); time.sleep(5)' &
client=$!
sleep 2
pid=$(cat "$tmp/pid")
kill -TERM "$pid"
while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
server_pids=""
wait $client || :
/usr/bin/python3 -c '
import sys
d = open(sys.argv[1], "rb").read()
for i in range(100):
    o = 7 + i * 3000
    assert d[o:o + 3000] == bytes([65 + i % 26]) * 3000, "write %d lost" % i
print("all 100 staged writes reached the file")' "$tmp/disk"

# A deferred EIO is returned by the next flush (from any connection),
# once; the failure is logged.
nbdkit -U - --filter="$FILTER" --filter=error memory 4M \
  error-pwrite=EIO error-pwrite-rate=100% reshape-writeback=true \
  --run 'nbdsh -u "$uri" -c "
import errno
h.pwrite(b\"x\" * 100, 0)          # staged: acknowledged
h2 = nbd.NBD(); h2.connect_uri(h.get_uri())
try:
    h2.flush()
    raise SystemExit(\"flush hid a failed deferred write\")
except nbd.Error as e:
    assert \"Input/output error\" in e.string, e.string
    print(\"flush reported:\", e.string)
h.flush()                           # reported once: clean again
"' 2> "$tmp/err"
grep -q "deferred write of 100 bytes at 0 failed" "$tmp/err" ||
  fail "deferred failure not logged: $(cat "$tmp/err")"

# Staged data is seen by another connection, and is not a hole.
truncate -s 0 "$tmp/sparse"; truncate -s 4M "$tmp/sparse"
nbdkit -U - --filter="$FILTER" file "$tmp/sparse" reshape-writeback=true \
  --run '/usr/bin/python3 -c "
import nbd, sys
a = nbd.NBD(); a.connect_uri(sys.argv[1])
b = nbd.NBD(); b.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
b.connect_uri(sys.argv[1])
a.pwrite(b\"s\" * 4096, 1 << 20)
assert b.pread(4096, 1 << 20) == b\"s\" * 4096
a.pwrite(b\"t\" * 4096, 2 << 20)
seen = []
b.block_status(4096, 2 << 20, lambda c, o, e, err: seen.append(e))
assert not seen[0][1] & nbd.STATE_HOLE, \"staged data reported as a hole\"
print(\"staged data visible\")
" "$uri"'

# A plugin that serializes requests: 4K writes combine into whole
# reshape-size requests.
nbdkit -U - --filter="$FILTER" "$MODEL" size=16M latency=1ms serialize=true \
  calls="$tmp/calls" reshape-writeback=true reshape-stats="$tmp/stats" \
  --run 'nbdsh -u "$uri" -c "
buf = nbd.Buffer.from_bytearray(bytearray(b\"w\" * 4096))
for i in range(4096):
    h.aio_pwrite(buf, i * 4096)
    while h.aio_in_flight() >= 64:
        h.poll(-1)
while h.aio_in_flight() > 0:
    h.poll(-1)
h.flush()
assert h.pread(16 << 20, 0) == b\"w\" * (16 << 20)
"'
writes=$(awk '$1 == "writes" {print $2}' "$tmp/calls")
echo "4096 client writes became $writes plugin writes (and flushes)"
test "$writes" -le 512 || fail "write-back did not combine: $writes"
