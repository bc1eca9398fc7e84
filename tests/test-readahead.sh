#!/usr/bin/env bash
# When readahead works and when it must stay out of the way: only for
# a client that waits for each read, and only for a plugin with latency.
# The pattern plugin's data (each 8 bytes: its offset, big-endian) is
# checked on every read.
source "$srcdir/functions.sh"
requires /usr/bin/python3 -c 'import nbd'
test -f "$MODEL" || { echo "model plugin not built"; exit 77; }

# reads MODE PLUGIN-WORDS...: 2048 sequential 4K reads, one at a time
# (sync) or 16 in flight (aio); prints "fills hits".
reads ()
{
  local mode=$1; shift
  nbdkit -U - --filter="$FILTER" "$@" reshape-stats="$tmp/stats.json" \
    --run '/usr/bin/python3 -c "
import nbd, struct, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
def check(buf, off):
    want = b\"\".join(struct.pack(\">Q\", off + i) for i in range(0, 4096, 8))
    assert buf == want, \"wrong data at %d\" % off
if sys.argv[2] == \"sync\":
    for i in range(2048):
        check(h.pread(4096, i * 4096), i * 4096)
else:
    bufs = {}
    for i in range(2048):
        while h.aio_in_flight() >= 16:
            h.poll(-1)
        b = nbd.Buffer(4096)
        bufs[i] = (b, h.aio_pread(b, i * 4096))
    while h.aio_in_flight() > 0:
        h.poll(-1)
    for i, (b, c) in bufs.items():
        assert h.aio_command_completed(c)
        check(b.to_bytearray(), i * 4096)
" "$uri" '"$mode"
  echo "$(stat_of "$tmp/stats.json" readahead_fills)" \
       "$(stat_of "$tmp/stats.json" readahead_hits)"
}
slow="--filter=delay pattern 8M delay-read=1ms"

read -r fills hits <<< "$(reads sync $slow)"
echo "waiting client, 1 ms plugin: $fills fills, $hits hits"
test "$hits" -gt 1500 || fail "readahead did not serve a waiting client"

read -r fills hits <<< "$(reads aio --filter=delay pattern 8M delay-read=5ms)"
echo "16 reads in flight, 5 ms plugin: $fills fills, $hits hits"
test "$hits" -gt 1500 ||
  { cat "$tmp/stats.json"; fail "readahead did not serve a pipelining client"; }

# (Under valgrind or the sanitizers every read is slow.)
if [ -z "${RESHAPE_CHECK:-}" ]; then
  read -r fills hits <<< "$(reads sync pattern 8M)"
  echo "waiting client, plugin without latency: $fills fills, $hits hits"
  test "$fills" = 0 || fail "readahead filled the cache over a fast plugin"
fi

# A plugin that fails where the client does not read (the model
# plugin's bad region, 14M-15M): a run over it fails, but the
# client's own reads are read alone and succeed, and the stream is
# timed again before its next run (not one failing 8M run per read:
# 2048 of them between 6M and 14M).
touch "$tmp/bad"
nbdkit -U - --filter="$FILTER" "$MODEL" size=32M latency=1ms \
  bandwidth=400M bad-offset=14M bad-length=1M bad-file="$tmp/bad" \
  reshape-size=256K \
  --run '/usr/bin/python3 -c "
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
for i in range(14 * 256):
    assert h.pread(4096, i * 4096) == bytes(4096), \"wrong data\"
print(\"read 14M 4K at a time, one read at a time\")
" "$uri"' 2> "$tmp/err" ||
  { cat "$tmp/err"; fail "a read failed for bytes it did not ask for"; }
failed=$(grep -c 'bad region' "$tmp/err" || :)
echo "plugin reads of the bad region: $failed"
test "$failed" -ge 1 || fail "no run reached the bad region"
test "$failed" -le 200 || fail "runs kept trying the bad region"

# Staged writes the plugin refuses (reshape-writeback, the error filter
# failing every write): a run over them cannot be read from the
# plugin (its bytes there are older than the staged ones), so it is
# not made and counted as a fill not kept; each read goes to the plugin
# on its own, with the staged bytes over it.  Every 4K read of the
# stream returns what was written.  At close the refused bytes are
# given up (the error filter still refuses them).
rm -f "$tmp/disk" "$tmp/stats.json"; truncate -s 4M "$tmp/disk"
touch "$tmp/refuse"
nbdkit -U - --filter="$FILTER" --filter=error --filter=delay \
  file "$tmp/disk" delay-read=1ms \
  error-pwrite=EIO error-pwrite-rate=100% error-file="$tmp/refuse" \
  reshape-writeback=true reshape-size=64K reshape-stats="$tmp/stats.json" \
  --run '/usr/bin/python3 -c "
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
want = bytearray(1 << 20)
for off in range(8192 + 100, 1 << 20, 96 * 1024):
    h.pwrite(b\"s\" * 100, off)           # staged, acknowledged
    want[off:off + 100] = b\"s\" * 100
for i in range(256):
    assert h.pread(4096, i * 4096) == want[i * 4096:(i + 1) * 4096], \
        \"read %d: wrong data\" % i
print(\"a stream over refused staged writes read right\")
" "$uri"' 2> "$tmp/err" || { cat "$tmp/err"; fail "stream over staged writes"; }
lost=$(stat_of "$tmp/stats.json" readahead_fills_lost)
echo "readahead fills not kept: $lost"
test "$lost" -ge 1 || fail "no run over refused staged writes was given up"

# A cache request (NBD_CMD_CACHE, what nbdkit's scan filter sends ahead
# of its client) reads its range into the cache: the client's reads
# there then cost the plugin nothing.  Plugin reads counted by the log
# filter; data checked.
nbdkit -U - --filter="$FILTER" --filter=log --filter=delay pattern 8M \
  delay-read=1ms logfile="$tmp/cache.log" \
  --run 'nbdsh -u "$uri" -c "
import struct
assert h.can_cache()
h.cache(2 << 20, 1 << 20)
for off in range(1 << 20, 3 << 20, 65536):
    buf = h.pread(65536, off)
    assert buf[:8] == struct.pack(\">Q\", off) and \
        buf[-8:] == struct.pack(\">Q\", off + 65528), off
"'
n=0
for o in $(sed -n 's/.* Read id=[0-9]* offset=\(0x[0-9a-f]*\) .*/\1/p' \
             "$tmp/cache.log"); do
  [ $((o)) -ge 1048576 ] && [ $((o)) -lt 3145728 ] && n=$((n + 1))
done
echo "cache request of 2M, then 32 reads there: $n plugin reads there"
test "$n" -le 2 || fail "the cache request did not fill the cache ($n reads)"

# Several parts of the disk read at once over a plugin that serializes
# requests (qemu-img reading a compressed qcow2 over curl on nbdkit
# 1.32: 8 chunks in flight, each read as its clusters' extents, 8 at
# a time, contiguous in the file).  nbdkit hands the filter one read
# at a time, in the order they came: 8 extents of one chunk, then 8 of
# the next.  So the chunks look like one waiting client whose stream
# jumps between them, and runs must neither restart at each jump
# nor read again what another chunk's run holds: the
# plugin reads the client's bytes once, in few reads.
nbdkit -U - --filter="$FILTER" "$MODEL" size=64M latency=2ms \
  bandwidth=200M serialize=true reshape-stats="$tmp/stats.json" \
  --run '/usr/bin/python3 -c "
import nbd, random, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
rng = random.Random(1)
ext = [256 << 10]                   # extents of 8K-40K, contiguous
while ext[-1] < (48 << 20):
    ext.append(ext[-1] + 512 * rng.randint(16, 80))
chunks = (len(ext) - 1) // 32
for g in range(0, chunks - 8, 8):   # 8 chunks of 32 extents at once
    for r in range(4):              # each 8 extents at a time
        for c in range(g, g + 8):
            for k in range(c * 32 + r * 8, c * 32 + r * 8 + 8):
                buf = h.pread(ext[k + 1] - ext[k], ext[k])
                assert buf == bytes(len(buf)), k
print(\"read %d chunks of 32 extents, 8 chunks at once\" % chunks)
" "$uri"' || fail "chunks read at once"
client=$(stat_of "$tmp/stats.json" ops.pread.client.bytes)
plugin=$(stat_of "$tmp/stats.json" ops.pread.plugin.bytes)
calls=$(stat_of "$tmp/stats.json" ops.pread.plugin.requests)
unread=$(stat_of "$tmp/stats.json" readahead_unread_bytes)
echo "8 chunks at once, serialized plugin: client $client bytes," \
     "plugin $plugin bytes in $calls reads, $unread never read"
# Bytes read twice: what the plugin read beyond the client's bytes and
# those read ahead that nobody read (the last 7 chunks are not read,
# and the budget bounds those: 16M + 5%).
test $((plugin - client - unread)) -le $((client / 10)) ||
  fail "fills read again what the cache held ($plugin bytes)"
# (A copy read again and never read counts as unread: the whole too,
# against the client's bytes, the unread tail and a run.)
test "$plugin" -le $((client + client / 10 + 8 * 1048576)) ||
  fail "the plugin read $plugin bytes for $client"
test "$unread" -le $((16 * 1048576 + client / 20)) ||
  fail "$unread bytes read ahead and never read"
test "$calls" -le 100 || fail "runs restarted at each jump ($calls reads)"
