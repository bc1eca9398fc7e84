#!/usr/bin/env bash
# Merging (reshape-merge=true): bursts of 16 adjacent 4K writes and
# reads issued in shuffled order, so groups form, meet and absorb each
# other.  Every read must return its own bytes, the backing file must
# hold every write, and the filter must have merged.  Random (seed
# printed, RESHAPE_SEEDS=N replays).
source "$srcdir/functions.sh"
requires /usr/bin/python3 -c 'import nbd'

seed=${RESHAPE_SEEDS:-$RANDOM}
seed=${seed%% *}
echo "seed: $seed"
truncate -s 4M "$tmp/disk"
nbdkit -U - --filter="$FILTER" --filter=delay file "$tmp/disk" \
  delay-read=1ms delay-write=1ms reshape-merge=true reshape-size=64K \
  reshape-stats="$tmp/stats" \
  --run '/usr/bin/python3 -c "
import nbd, random, sys
rng = random.Random(int(sys.argv[2]))
h = nbd.NBD(); h.connect_uri(sys.argv[1])
model = bytearray(4 << 20)
def burst(base, write):
    order = list(range(16)); rng.shuffle(order)
    bufs = {}
    for i in order:
        off = base + i * 4096
        if write:
            data = bytes([rng.randrange(256)]) * 4096
            model[off:off + 4096] = data
            h.aio_pwrite(data, off)
        else:
            bufs[off] = nbd.Buffer(4096)
            h.aio_pread(bufs[off], off)
    while h.aio_in_flight() > 0:
        h.poll(-1)
    for off, b in bufs.items():
        assert b.to_bytearray() == model[off:off + 4096], \
            \"read at %d returned other data\" % off
for r in range(64):
    base = rng.randrange(0, (4 << 20) - 65536, 4096)
    burst(base, True)
    burst(base, False)
h.flush()
open(sys.argv[3], \"wb\").write(model)
print(\"bursts checked\")
" "$uri" '"$seed $tmp/model" || fail "seed $seed"
cmp "$tmp/disk" "$tmp/model" || fail "seed $seed: backing file differs"
merges=$(awk '/^requests merged/ {print $NF}' "$tmp/stats")
echo "requests merged: $merges"
test "$merges" -gt 512 || fail "seed $seed: only $merges requests merged"
