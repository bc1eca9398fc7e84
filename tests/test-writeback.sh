#!/usr/bin/env bash
# reshape-writeback=true: small writes are staged and acknowledged;
# they reach the plugin combined, on flush, before overlapping reads
# and block status, and at connection close (SIGTERM included); a
# write-back the plugin refuses stays staged and readable, and fails
# every flush until the plugin takes it.
source "$srcdir/functions.sh"
requires nbdsh --version
test -f "$MODEL" || { echo "model plugin not built"; exit 77; }

# SIGTERM while a client is connected, after unflushed writes.
truncate -s 4M "$tmp/disk"
start_server "$tmp/sock" "$tmp/pid" --filter="$FILTER" file "$tmp/disk" \
  reshape-writeback=true
# The client says when all are acknowledged ($tmp/acked), and stays
# connected for 3 s: nbdkit, told to quit meanwhile, closes the
# connection when the client goes (nbdkit 1.32 waits for an idle
# client), and the staged writes go to the file then.
ACKED=$tmp/acked nbdsh -u "nbd+unix:///?socket=$tmp/sock" -c '
import os, time
for i in range(100):
    h.pwrite(bytes([65 + i % 26]) * 3000, 7 + i * 3000)
print("acknowledged, not flushed")
open(os.environ["ACKED"], "w").close()
time.sleep(3)' &
client=$!
for i in $(seq 600); do test -e "$tmp/acked" && break; sleep 0.1; done
test -e "$tmp/acked" || fail "the 100 writes were not acknowledged in 60 s"
stop_servers
wait $client || :
/usr/bin/python3 -c '
import sys
d = open(sys.argv[1], "rb").read()
for i in range(100):
    o = 7 + i * 3000
    assert d[o:o + 3000] == bytes([65 + i % 26]) * 3000, "write %d lost" % i
print("all 100 staged writes reached the file")' "$tmp/disk"

# A write-back the plugin refuses keeps the data staged: every
# connection still reads it, every flush fails while the plugin
# refuses, and once it accepts, the next flush writes it (the error
# filter fails writes while $tmp/refuse exists).  Data the plugin
# still refuses at the name's last close is given up with an error
# naming the bytes.
truncate -s 0 "$tmp/disk"; truncate -s 4M "$tmp/disk"
export REFUSE="$tmp/refuse" DISK="$tmp/disk"
nbdkit -U - --filter="$FILTER" --filter=error file "$tmp/disk" \
  error-pwrite=EIO error-pwrite-rate=100% error-file="$tmp/refuse" \
  reshape-writeback=true \
  --run 'nbdsh -u "$uri" -c "
refuse = os.environ[\"REFUSE\"]
open(refuse, \"w\").close()
h.pwrite(b\"x\" * 100, 0)          # staged: acknowledged
h2 = nbd.NBD(); h2.connect_uri(h.get_uri())
assert h2.pread(100, 0) == b\"x\" * 100, \"staged data lost after a failure\"
for c in (h2, h, h2):
    try:
        c.flush()
        raise SystemExit(\"a flush hid a failed write-back\")
    except nbd.Error as e:
        assert \"Input/output error\" in e.string, e.string
assert h.pread(100, 0) == b\"x\" * 100
os.unlink(refuse)
h2.flush()                           # the plugin takes it now
assert open(os.environ[\"DISK\"], \"rb\").read(100) == b\"x\" * 100
open(refuse, \"w\").close()
h.pwrite(b\"y\" * 50, 4096)         # refused until the end
assert h2.pread(50, 4096) == b\"y\" * 50
print(\"kept staged through failures\")
"' 2> "$tmp/err" || fail "write-back failures: $(cat "$tmp/err")"
rm -f "$tmp/refuse"
grep -q "deferred write of 100 bytes at 0 failed" "$tmp/err" ||
  fail "deferred failure not logged: $(cat "$tmp/err")"
grep -q "50 acknowledged bytes of export '' lost at its last close" "$tmp/err" ||
  fail "data given up at the last close not named: $(cat "$tmp/err")"
cmp -n 100 "$tmp/disk" <(printf 'x%.0s' $(seq 100)) ||
  fail "the retried write-back did not reach the file"

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

# Staging is per export: a flush on export "a" never writes what was
# staged for export "b" (file plugin, dir= mode).
mkdir "$tmp/dir"; truncate -s 1M "$tmp/dir/a"; truncate -s 1M "$tmp/dir/b"
nbdkit -U - --filter="$FILTER" file dir="$tmp/dir" reshape-writeback=true \
  --run '/usr/bin/python3 -c "
import nbd, sys
def conn(name):
    h = nbd.NBD(); h.set_export_name(name); h.connect_unix(sys.argv[1])
    return h
a, b = conn(\"a\"), conn(\"b\")
b.pwrite(b\"B\" * 4096, 8192)
a.flush()
a.pread(4096, 8192)
print(\"flushed a\")
" "$unixsocket"'
/usr/bin/python3 -c '
import sys
a = open(sys.argv[1] + "/a", "rb").read()
b = open(sys.argv[1] + "/b", "rb").read()
assert a == bytes(1 << 20), "export a got data staged for b"
assert b[8192:12288] == b"B" * 4096, "export b lost its staged write"
print("exports kept apart")' "$tmp/dir"

# Without multi-conn, another connection's readahead must not cache
# around a connection's staged write.
nbdkit -U - --filter="$FILTER" --filter=multi-conn memory 4M \
  multi-conn-mode=disable reshape-writeback=true \
  --run '/usr/bin/python3 -c "
import nbd, sys
a = nbd.NBD(); a.connect_uri(sys.argv[1])
b = nbd.NBD(); b.connect_uri(sys.argv[1])
a.pwrite(b\"A\" * 100, 70000)
for i in range(64):
    b.pread(4096, i * 4096)
assert a.pread(100, 70000) == b\"A\" * 100, \"stale read of own write\"
a.flush()
assert a.pread(100, 70000) == b\"A\" * 100, \"stale after flush\"
print(\"own writes seen\")
" "$uri"'

# Staged writes are the export's: without multi-conn too, a flush on
# any connection writes every page staged (NBD allows a flush to do
# more), and the file has them while the writer is still connected.
truncate -s 0 "$tmp/shared"; truncate -s 4M "$tmp/shared"
nbdkit -U - --filter="$FILTER" --filter=multi-conn file "$tmp/shared" \
  multi-conn-mode=disable reshape-writeback=true \
  --run '/usr/bin/python3 -c "
import nbd, sys
a = nbd.NBD(); a.connect_uri(sys.argv[1])
b = nbd.NBD(); b.connect_uri(sys.argv[1])
assert not a.can_multi_conn()
a.pwrite(b\"W\" * 100, 70000)
assert open(sys.argv[2], \"rb\").read()[70000:70100] == bytes(100), \"not staged\"
b.flush()
assert open(sys.argv[2], \"rb\").read()[70000:70100] == b\"W\" * 100, \"B flushed, A staged write not in the file\"
print(\"a flush writes the export pages\")
" "$uri" '"$tmp/shared" || fail "a flush on another connection left staged data"

# A clean disconnect without flush, with a layer below that sleeps:
# the write-back at close must still reach the plugin.
nbdkit -U - --filter="$FILTER" --filter=delay memory 4M \
  delay-write=1ms reshape-writeback=true \
  --run '/usr/bin/python3 -c "
import nbd, sys
a = nbd.NBD(); a.connect_uri(sys.argv[1])
keep = nbd.NBD(); keep.connect_uri(sys.argv[1])
a.pwrite(b\"D\" * 4096, 4096)
a.shutdown(); del a
assert keep.pread(4096, 4096) == b\"D\" * 4096, \"write lost at disconnect\"
print(\"written back at disconnect\")
" "$uri"'

# A tiny pool with readahead over 64K blocks from two connections must
# not hang (a fill holding memory while its pieces wait for more).
timed 120 nbdkit -U - --filter="$FILTER" --filter=delay memory 4M \
  delay-read=1ms reshape-pool=256K \
  reshape-min=64K reshape-size=64K reshape-readahead=64K \
  reshape-writeback=true \
  --run '/usr/bin/python3 -c "
import nbd, sys
hs = [nbd.NBD() for i in range(2)]
for h in hs:
    h.connect_uri(sys.argv[1])
for r in range(50):
    for j, h in enumerate(hs):
        h.pwrite(b\"p\" * 1000, 57344 + j * 4096 + r * 65536)
        h.pread(8192, 57344 + j * 4096 + r * 65536)
print(\"no hang\")
" "$uri"' || fail "small pool with readahead hung or failed"

# Flushes from two connections while the plugin refuses every
# write-back: each tries each block once and fails, in bounded time
# (one field per block once made them retry each other's blocks for
# ever).
rm -f "$tmp/refuse"
export REFUSE="$tmp/refuse"
timed 60 nbdkit -U - --filter="$FILTER" --filter=delay --filter=error \
  memory 1M delay-write=50ms error-pwrite=EIO error-pwrite-rate=100% \
  error-pwrite-file="$tmp/refuse" reshape-writeback=true reshape-size=64K \
  --run '/usr/bin/python3 -c "
import nbd, os, sys, time
a = nbd.NBD(); a.connect_uri(sys.argv[1])
b = nbd.NBD(); b.connect_uri(sys.argv[1])
for i in range(8):
    a.pwrite(bytes([65 + i]) * 4096, i * 65536)
open(os.environ[\"REFUSE\"], \"w\").close()
cs = [(a, a.aio_flush()), (b, b.aio_flush())]
t0 = time.time()
while cs and time.time() - t0 < 20:
    for h, c in list(cs):
        h.poll(0)
        try:
            done = h.aio_command_completed(c)
        except nbd.Error:
            done = True
        if done:
            cs.remove((h, c))
    time.sleep(0.01)
assert not cs, \"concurrent flushes still pending after 20 s\"
assert b.pread(4096, 7 * 65536) == b\"H\" * 4096
os.unlink(os.environ[\"REFUSE\"])
b.flush()
print(\"concurrent flushes failed in %.1f s, then succeeded\" % (time.time() - t0))
" "$uri"' 2> "$tmp/err" || fail "concurrent flushes: $(grep -v injecting "$tmp/err" | tail -5)"

# A plugin that cannot flush: the client cannot ask for durability, so
# nothing is staged (the write reaches the plugin before its reply).
truncate -s 0 "$tmp/disk"; truncate -s 1M "$tmp/disk"
nbdkit -U - --filter="$FILTER" eval \
  get_size='echo 1048576' \
  pread='dd if='"$tmp/disk"' skip=$4 count=$3 iflag=skip_bytes,count_bytes status=none' \
  pwrite='dd of='"$tmp/disk"' seek=$4 conv=notrunc oflag=seek_bytes status=none' \
  reshape-writeback=true \
  --run 'nbdsh -u "$uri" -c "
assert not h.can_flush()
h.pwrite(b\"n\" * 4096, 8192)
assert open(\"'"$tmp/disk"'\", \"rb\").read()[8192:12288] == b\"n\" * 4096, \\
  \"a write was staged though the client cannot flush\"
print(\"no staging without flush\")
"' || fail "write-back over a plugin without flush"

# Connections of one export that stage in blocks of different sizes
# share them (multi-conn): here the plugin says a preferred size of
# 64K to the first connection and 1M to the others, and each stages in
# its own.  Each write must win over the writes acknowledged before
# it, whatever block it lands near, and no write may reach past the
# end of a block of the other size (that overwrote the heap and killed
# the server).
cat > "$tmp/shapes.py" <<'PYEOF'
import nbd, sys
c1 = nbd.NBD(); c1.connect_unix(sys.argv[1])
c2 = nbd.NBD(); c2.connect_unix(sys.argv[1])
p1 = c1.get_block_size(nbd.SIZE_PREFERRED)
p2 = c2.get_block_size(nbd.SIZE_PREFERRED)
assert c1.can_multi_conn(), "the plugin should allow multi-conn"
assert p2 != p1, "both connections were told %d" % p1
print("told %d, then %d" % (p1, p2))
small, large = (c1, c2) if p1 < p2 else (c2, c1)
S = min(p1, p2)
K = 4096
large.pwrite(b"0" * K, 0)               # a large block at 0
small.pwrite(b"A" * K, S)               # a small one inside it, newer
large.pwrite(b"B" * K, S)               # the last write there
for h in (c1, c2):
    assert h.pread(K, S) == b"B" * K, "a write lost to an older one"
small.flush()
for h in (c1, c2):
    assert h.pread(K, S) == b"B" * K, "after flush: a write lost"
small.pwrite(b"C" * K, 3 * S)           # a small block at 3 S
large.pwrite(b"D" * K, 2 * S)           # in the large block's range
for h in (c1, c2):
    assert h.pread(K, 2 * S) == b"D" * K and \
        h.pread(K, 3 * S) == b"C" * K, "writes near another shape lost"
large.flush()
print("writes through blocks of two sizes: each read back")
PYEOF
truncate -s 0 "$tmp/disk"; truncate -s 16M "$tmp/disk"
rm -f "$tmp/told"
start_server "$tmp/shapes.sock" "$tmp/shapes.pid" --filter="$FILTER" eval \
  thread_model='echo parallel' get_size='echo 16777216' \
  can_multi_conn='exit 0' can_flush='exit 0' can_write='exit 0' \
  flush='exit 0' \
  block_size='test -e "'"$tmp"'/told" && echo 1 1048576 4294967295 && exit 0
              touch "'"$tmp"'/told"; echo 1 65536 4294967295' \
  pread='dd if="'"$tmp"'/disk" skip=$4 count=$3 iflag=skip_bytes,count_bytes status=none' \
  pwrite='dd of="'"$tmp"'/disk" seek=$4 conv=notrunc oflag=seek_bytes status=none' \
  reshape-writeback=true
/usr/bin/python3 "$tmp/shapes.py" "$tmp/shapes.sock" ||
  fail "write-back across connections told different sizes"
kill -0 "$(cat "$tmp/shapes.pid")" || fail "the server died"
stop_servers

# A plugin that answers multi-conn differently per connection (here no
# to the first, yes to the others): the first connection decides
# whether the export's blocks are shared, and one that disagrees does
# not stage.  (Both staging, the second's shared block lay over the
# first's own, and the first's flush wrote its older block last.)
truncate -s 0 "$tmp/disk"; truncate -s 1M "$tmp/disk"
rm -f "$tmp/mc"
start_server "$tmp/mc.sock" "$tmp/mc.pid" --filter="$FILTER" eval \
  thread_model='echo parallel' get_size='echo 1048576' \
  can_multi_conn='test -e "'"$tmp"'/mc" && exit 0; touch "'"$tmp"'/mc"; exit 3' \
  can_flush='exit 0' flush='exit 0' can_write='exit 0' \
  pread='dd if="'"$tmp"'/disk" skip=$4 count=$3 iflag=skip_bytes,count_bytes status=none' \
  pwrite='dd of="'"$tmp"'/disk" seek=$4 conv=notrunc oflag=seek_bytes status=none' \
  reshape-size=64K reshape-writeback=true
timeout 60 /usr/bin/python3 -c '
import nbd, sys
b = nbd.NBD(); b.connect_unix(sys.argv[1])
a = nbd.NBD(); a.connect_unix(sys.argv[1])
assert not b.can_multi_conn() and a.can_multi_conn()
b.pwrite(b"1" * 4096, 0)
a.pwrite(b"2" * 4096, 0)
b.pwrite(b"3" * 4096, 0)
b.flush()
assert b.pread(4096, 0) == b"3" * 4096, "the last write, flushed, was lost"
assert open(sys.argv[2], "rb").read(4096) == b"3" * 4096, "not in the plugin"
print("multi-conn per connection: the last write flushed, read back")
' "$tmp/mc.sock" "$tmp/disk" ||
  fail "connections answered multi-conn differently: a write lost"
stop_servers
