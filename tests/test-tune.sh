#!/usr/bin/env bash
# reshape-size=auto (the default) learns each plugin's shape at the
# first connection, and sizes follow from it (model plugin,
# bench/model-plugin.c; no timing is asserted beyond contrasts of 4x
# and more):
#   - 2M compressed clusters with a large decode cost: clients are told
#     2M (4M on a busy machine), a 2M read is never cut, and a
#     client that ignores the hint and streams 256K reads with 64 in
#     flight gets each cluster fetched once;
#   - a plugin without latency: told 64K, requests not cut; and so is
#     one whose only cost is the first touch of each 2M region (a
#     read there again is fast);
#   - 1 ms of latency at 400 MB/s per request: 32M reads are cut (the
#     model and then the measurement say so), but not when the client
#     keeps more of them in flight than the plugin has lanes; 32M
#     writes are tried cut half as often as reads;
#   - 2 ms of latency with up to 8 ms of jitter, and no other request
#     in flight: learnt (a slow 4K read is the plugin's own variance,
#     not a sign that it is busy), told 64K-8M, data checked;
#   - a knee at 64K that a read of 256K shows not to grow (64K reads
#     alone slow): not taken for one;
#   - reshape-profile=FILE: the second run starts from what the first
#     learnt, without probing; a corrupt or foreign profile is ignored
#     with a warning.
# Every byte read is checked.
source "$srcdir/functions.sh"
requires /usr/bin/python3 -c 'import nbd'
requires nbdinfo --version
requires qemu-img --version
test -f "$MODEL" || { echo "model plugin not built"; exit 77; }

# prefault=true: fresh memory of the model's faults in milliseconds on
# a VM compacting memory, which a probe read of 512K paid and took for
# the knee.  One decoder: a read of two clusters costs two decodes.  (With two, a
# single 4M read decodes both clusters at once and costs what 2M does,
# so 2M or 4M is right depending on the machine's load.)  8 ms: well
# below the 15 ms above which the probe goes beside the connections.
clusters="size=64M latency=100us cluster=2M decode=8ms decoders=1 prefault=true"

# preferred PLUGIN-ARGS...: the preferred block size a client is told.
preferred ()
{
  nbdkit -U - --filter="$FILTER" "$@" --run 'nbdinfo --json "$uri"' |
    /usr/bin/python3 -c 'import json, sys
print(json.load(sys.stdin)["exports"][0]["block_size_preferred"])'
}

# told P: the size clients are told for the 2M clusters is 2M, or 4M
# when a busy machine slowed the reads the flat cost is taken from so
# much that the 4M read looked flat (the safe side: nothing is cut).
told ()
{
  case "$1" in
    2097152|4194304) echo "2M clusters: told $1" ;;
    *) fail "2M clusters: told $1, want 2097152 (or 4194304)" ;;
  esac
}

# probe_reads STATS: the reads the probes made (every export's).
probe_reads ()
{
  awk '$1 == "probe:" {n += $2} END {print n + 0}' "$1"
}

# beyond_probe CALLS STATS: the plugin reads that the probe did not make.
beyond_probe ()
{
  local reads
  reads=$(awk '$1 == "reads" {print $2}' "$1")
  echo $((reads - $(probe_reads "$2")))
}

told "$(preferred "$MODEL" $clusters)"

# A stream of 256K reads, 64 in flight, ignoring the hint: each cluster
# is fetched once.  The data is what was written before.
cat > "$tmp/stream.py" <<'EOF'
import nbd, os, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
size = h.get_size()
want = os.urandom(size)
for off in range(0, size, 1 << 20):
    h.pwrite(want[off:off + (1 << 20)], off)
h.flush()
got = bytearray(size)
bufs, offs = [], []
for off in range(0, size, 262144):
    b = nbd.Buffer(262144)
    h.aio_pread(b, off)
    bufs.append(b)
    offs.append(off)
    while h.aio_in_flight() >= 64:
        h.poll(-1)
while h.aio_in_flight() > 0:
    h.poll(-1)
for b, off in zip(bufs, offs):
    got[off:off + 262144] = b.to_bytearray()
assert got == want, "a streamed read returned wrong data"
print("streamed %d bytes in 256K reads, all checked" % size)
EOF
rm -f "$tmp/calls" "$tmp/stats"
nbdkit -U - --filter="$FILTER" "$MODEL" $clusters calls="$tmp/calls" \
  reshape-stats="$tmp/stats" \
  --run "/usr/bin/python3 $tmp/stream.py \$uri"
reads=$(beyond_probe "$tmp/calls" "$tmp/stats")
fetches=$(awk '/^grains fetched for streams/ {print $NF}' "$tmp/stats")
ahead=$(awk '/^grains fetched ahead/ {print $NF}' "$tmp/stats")
echo "2M clusters, 256K stream: $reads plugin reads, $fetches fetches" \
  "($ahead ahead of the stream)"
grep -A4 'reshape-size=auto' "$tmp/stats"
# 32 clusters (a few fetched twice, where the stream starts and reads
# race the first fetches); 256 reads if nothing was coalesced.
test "$reads" -le 40 ||
  fail "the 256K stream was not fetched a cluster at a time ($reads reads)"
# The stream keeps reading: its fetches grow to 4 clusters (the 8M
# readahead cap), and come before it reaches them.  A cluster at a
# time would be 32 fetches.
test "$fetches" -le 16 ||
  fail "the stream's fetches did not grow ($fetches fetches)"
test "$ahead" -ge 1 || fail "nothing was fetched ahead of the stream"

# qemu-img convert reads 2M at a time: never cut.
qemu-img create -q -f raw "$tmp/src.img" 64M
/usr/bin/python3 -c 'import os, sys
open(sys.argv[1], "r+b").write(os.urandom(64 << 20))' "$tmp/src.img"
rm -f "$tmp/calls" "$tmp/stats"
nbdkit -U - --filter="$FILTER" "$MODEL" $clusters calls="$tmp/calls" \
  reshape-stats="$tmp/stats" \
  --run "qemu-img convert -n -f raw -O raw $tmp/src.img \"\$uri\" &&
         qemu-img convert -f raw -O raw \"\$uri\" $tmp/out.img"
cmp "$tmp/src.img" "$tmp/out.img" || fail "qemu-img convert: data differs"
reads=$(beyond_probe "$tmp/calls" "$tmp/stats")
echo "2M clusters, qemu-img convert: $reads plugin reads"
# 32 reads of 2M (if 4M was told, a few 4M grains may be fetched for
# a stream besides); cut, they would be 64 or more.
test "$reads" -le 36 || fail "2M reads were cut ($reads plugin reads)"

# No latency: told 64K, and a 1M read reaches the plugin whole.
p=$(preferred memory 64M)
test "$p" = 65536 || fail "memory: told $p, want 65536"
rm -f "$tmp/stats"
nbdkit -U - --filter="$FILTER" --filter=stats memory 64M \
  statsfile="$tmp/pstats" statsappend=false reshape-stats="$tmp/stats" \
  --run 'nbdsh -u "$uri" -c "h.pread(1 << 20, 0)"'
probe=$(probe_reads "$tmp/stats")
grep -q "read: $((probe + 1)) ops" "$tmp/pstats" ||
  { cat "$tmp/pstats"; fail "memory: a 1M read was cut (want 1 read + the probe's $probe)"; }

# 300 us the first time each 2M region is touched, nothing after: no
# per-request cost to amortize (told 2M or more, a client would gain
# nothing and pay for the buffers).  1G: the probe's places (32 of
# them, evenly spread) are then each in a region of their own.
p=$(preferred "$MODEL" size=1G first-touch=300us)
test "$p" = 65536 || fail "first touch only: told $p, want 65536"
echo "first touch only: told $p"

# 1 ms + 400 MB/s: 32M reads are cut, whole they would take 4x as long.
nbdkit -U - --filter="$FILTER" "$MODEL" size=512M latency=1ms \
  bandwidth=400M reshape-stats="$tmp/stats" \
  --run 'qemu-img bench -f raw -c 24 -d 1 -s 32M -S 32M "$uri" >/dev/null'
grep -E 'reshape-size=auto|reads of 32768K' "$tmp/stats"
grep -q 'reads of 32768K+: cut' "$tmp/stats" ||
  fail "1 ms plugin: 32M reads were not cut"

# The same reads, 8 in flight, with reshape-parallel=4: the client's
# requests already use every lane the plugin has, and cutting them
# would only slow the others (the model plugin has no bandwidth shared
# between requests, so here cutting would look faster, and does
# without the lanes rule: 4 pieces each, 177 reads).  Some requests
# may be tried cut, or cut, where fewer are in flight (the first and
# the last ones, or whenever the client is slow to send: 49 to 88
# reads seen); most go whole.
rm -f "$tmp/calls" "$tmp/stats"
nbdkit -U - --filter="$FILTER" "$MODEL" size=512M latency=1ms \
  bandwidth=400M calls="$tmp/calls" reshape-parallel=4 \
  reshape-stats="$tmp/stats" \
  --run 'qemu-img bench -f raw -c 48 -d 8 -s 32M -S 32M "$uri" >/dev/null'
reads=$(beyond_probe "$tmp/calls" "$tmp/stats")
grep -E 'reads of 32768K' "$tmp/stats"
echo "1 ms plugin, 8 x 32M reads in flight, 4 lanes: $reads plugin reads"
test "$reads" -le 110 ||
  fail "32M reads, 8 in flight over 4 lanes, were cut" \
    "($reads plugin reads for 48 reads)"

# 32M writes, one at a time: the model comes from reads, and for
# writes its promise (13x here) is only a guess, so they are tried cut
# every 4th (reads the model promises twice as fast: every 2nd).  Of
# 8 writes, 2 are tried cut, no more; what was written reads back.
nbdkit -U - --filter="$FILTER" "$MODEL" size=512M latency=1ms \
  bandwidth=400M reshape-stats="$tmp/stats" \
  --run 'nbdsh -u "$uri" -c "
import os
for i in range(8):
    want = os.urandom(32 << 20)
    h.pwrite(want, i << 25)
    assert h.pread(32 << 20, i << 25) == want
"'
line=$(grep 'writes of 32768K' "$tmp/stats")
echo "1 ms plugin, 8 x 32M writes: $line"
tried=$(echo "$line" | sed -n 's|.* [0-9]*/\([0-9]*\) samples.*|\1|p')
test -n "$tried" && test "$tried" -le 2 ||
  fail "32M writes were tried cut more often than every 4th: $line"

# Jitter with nothing else in flight: the probe measures (a rule that
# took every slow 4K read for a busy plugin gave up on 4 of 6 seeds
# tried), and what a client writes it reads back.  Seeds 8, 25, 50 and
# 55 draw jitter that passes two checks of a 64K read: a probe that
# checks a noisy plugin's knee no more than a steady one's told them
# 32K (of 120 seeds, all others were told 128K-2M; the jitter here is
# 4 times the latency).  Seed 55 was still told 32K in about 3 runs in
# 100 with that rule (a read's time near a threshold sent the probe down
# a path whose base reads did not vary enough to count as noisy), and
# in none of 80 since a knee at 64K or below is confirmed by one read
# of four times its size (knee_grows).
for s in 1 2 3 4 5 6 8 25 50 55; do
  nbdkit -f -v -U - --filter="$FILTER" "$MODEL" size=64M latency=2ms \
    bandwidth=200M jitter=8ms seed="$s" prefault=true -D reshape.tune=1 \
    --run 'nbdsh -u "$uri" -c "
import os
want = os.urandom(3 << 20)
h.pwrite(want, 12345)
assert h.pread(len(want), 12345) == want
print(h.get_block_size(nbd.SIZE_PREFERRED))"' > "$tmp/out" 2> "$tmp/log" ||
    { tail -20 "$tmp/log"; fail "jitter, seed $s: the client failed"; }
  p=$(cat "$tmp/out")
  ! grep -q 'not measured' "$tmp/log" ||
    fail "jitter, seed $s: $(grep 'not measured' "$tmp/log" | head -1)"
  test "$p" -ge 65536 && test "$p" -le 8388608 ||
    fail "jitter, seed $s: told $p, want 64K-8M"
  echo "jitter, seed $s: learnt, told $p, data checked"
done

# A knee at 64K that is not one: 64K reads alone take 60 ms, every
# other size about 5 ms, as one unlucky draw of jitter would make them
# (two checks of 64K pass).  The read of 256K that confirms a small
# knee shows it does not grow: not told less than 64K (before the
# confirmation, told 32K).  Data read through the filter is the file's.
/usr/bin/python3 -c 'import os, sys
open(sys.argv[1], "wb").write(os.urandom(64 << 20))' "$tmp/odd.data"
nbdkit -U - --filter="$FILTER" eval \
  get_size='echo 67108864' \
  pread='if [ $3 = 65536 ]; then sleep 0.06; else sleep 0.005; fi
dd if='"$tmp/odd.data"' skip=$4 count=$3 iflag=skip_bytes,count_bytes status=none' \
  reshape-stats="$tmp/stats" \
  --run 'nbdsh -u "$uri" -c "
want = open(\"'"$tmp/odd.data"'\", \"rb\").read()
assert h.pread(3 << 20, 12345) == want[12345:12345 + (3 << 20)]
print(h.get_block_size(nbd.SIZE_PREFERRED))"' > "$tmp/out" ||
  fail "a slow 64K only: the client failed"
p=$(cat "$tmp/out")
grep -A1 'reshape-size=auto' "$tmp/stats"
test "$p" -ge 65536 ||
  fail "a slow 64K only: told $p, want 64K or more (a knee that does not grow)"
echo "a slow 64K only: told $p, data checked"

# reshape-profile: learnt once, told at once the next time.
prof="$tmp/profile"
p1=$(preferred "$MODEL" $clusters reshape-profile="$prof")
head -1 "$prof" | grep -q '^nbdkit-reshape-filter profile 1$' ||
  fail "no profile written: $(cat "$prof")"
nbdkit -U - --filter="$FILTER" "$MODEL" $clusters calls="$tmp/calls" \
  reshape-profile="$prof" \
  --run 'nbdsh -u "$uri" -c "print(h.get_block_size(nbd.SIZE_PREFERRED))"'
reads=$(awk '$1 == "reads" {print $2}' "$tmp/calls")
test "$reads" = 0 || fail "the profile was not used: the plugin was probed"
echo "profile used: told $p1, no probe"
# Corrupt: ignored with a warning, and the plugin probed.
sed -i 's/grain [0-9]*/grain banana/' "$prof"
nbdkit -U - --filter="$FILTER" "$MODEL" $clusters reshape-profile="$prof" \
  --run 'nbdinfo "$uri" >/dev/null' 2> "$tmp/err"
grep -q 'reshape-profile: warning: .* line 2 is corrupt' "$tmp/err" ||
  fail "corrupt profile: $(cat "$tmp/err")"
grep -Eq 'grain (2097152|4194304)' "$prof" ||
  fail "the profile was not rewritten"
# Foreign: another export size.
p=$(preferred "$MODEL" size=32M latency=100us cluster=2M decode=8ms prefault=true \
    decoders=1 reshape-profile="$prof" 2> "$tmp/err")
grep -q 'not what the profile was made on' "$tmp/err" ||
  fail "foreign profile: $(cat "$tmp/err")"
told "$p"
echo "ok: corrupt and foreign profiles ignored with a warning"
# Not a profile at all (a mistyped name): ignored, and left untouched.
echo "precious data" > "$tmp/notaprofile"
p=$(preferred "$MODEL" $clusters reshape-profile="$tmp/notaprofile" \
    2> "$tmp/err")
grep -q 'is not a profile of this filter' "$tmp/err" ||
  fail "foreign file: $(cat "$tmp/err")"
test "$(cat "$tmp/notaprofile")" = "precious data" ||
  fail "a file that is not a profile was overwritten"
echo "ok: a file that is not a profile is left as it was"
