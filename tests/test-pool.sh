#!/usr/bin/env bash
# A tiny pool with many requests in flight: requests wait for buffers
# instead of failing or growing the pool, and nothing deadlocks.
source "$srcdir/functions.sh"
requires /usr/bin/python3 -c 'import nbd'

truncate -s 4M "$tmp/disk"
# 64K pool, 64K minimum blocks: one bounce buffer at a time for 4
# connections x 16 unaligned requests in flight.  timeout catches a hang.
seed=${RESHAPE_SEEDS:-$RANDOM}; seed=${seed%% *}; echo "seed: $seed"
timed 300 nbdkit -U - --filter="$FILTER" --filter=blocksize-policy \
  file "$tmp/disk" reshape-pool=64K reshape-stats="$tmp/stats.json" \
  blocksize-minimum=64K blocksize-preferred=64K blocksize-error-policy=error \
  --run "$srcdir/random-io.py $seed \$uri 4194304 $tmp/model \
         --conns 4 --depth 16 --ops 1500" ||
  fail "random I/O through a 64K pool failed or hung"
"$srcdir/compare-model.py" "$tmp/disk" "$tmp/model"
cat "$tmp/stats.json"
high=$(stat_of "$tmp/stats.json" pool_high_bytes)
waits=$(stat_of "$tmp/stats.json" pool_waits)
reused=$(stat_of "$tmp/stats.json" pool_reuses)
test "$high" -le 65536 || fail "pool grew past its cap: $high"
test "$waits" -gt 0 || fail "no request waited: the cap was not exercised"
test "$reused" -gt 0 || fail "no buffer was reused"
echo "ok: pool high-water $high, $waits waits, $reused reuses"
