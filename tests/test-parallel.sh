#!/usr/bin/env bash
# The pieces of one split request run at the same time when the plugin
# is fully parallel (bounded by reshape-parallel), and one at a time
# when it is not.  The model plugin counts requests in flight.
source "$srcdir/functions.sh"
requires nbdsh --version
test -f "$MODEL" || { echo "model plugin not built"; exit 77; }

# peak PARAMS...: most plugin requests in flight during one 4M read
peak ()
{
  nbdkit -U - --filter="$FILTER" "$MODEL" size=8M latency=20ms \
    calls="$tmp/calls" "$@" \
    --run 'nbdsh -u "$uri" -c "
assert h.pread(4 << 20, 12345) == bytes(4 << 20)"'
  awk '$1 == "max_inflight" { print $2 }' "$tmp/calls"
}

p=$(peak reshape-size=256K)
echo "default fan-out: $p in flight"
test "$p" -ge 8 && test "$p" -le 16 || fail "want 8..16 pieces in flight, got $p"
p=$(peak reshape-size=256K reshape-parallel=3)
test "$p" = 3 || fail "reshape-parallel=3: $p in flight"
p=$(peak reshape-size=256K reshape-parallel=1)
test "$p" = 1 || fail "reshape-parallel=1: $p in flight"
p=$(peak reshape-size=256K serialize=true)
test "$p" = 1 || fail "serializing plugin got $p requests at once"
echo "ok: fan-out bounded, off for a serializing plugin"

# Helpers only where the plugin has latency to overlap: after a first
# split request, a plugin that answers 4K pieces at once gets them one
# at a time; one that takes 1 ms per piece keeps its helpers.
# splits_in_parallel PARAMS...: of 8 reads of 1M in 4K pieces (the
# model's memory prefaulted: a VM's page faults make 4K pieces slow)
splits_in_parallel ()
{
  nbdkit -U - --filter="$FILTER" "$MODEL" size=8M prefault=true reshape-size=4K \
    reshape-stats="$tmp/stats.json" "$@" \
    --run 'nbdsh -u "$uri" -c "
for i in range(8):
    assert h.pread(1 << 20, i << 20) == bytes(1 << 20)"'
  stat_of "$tmp/stats.json" split_reads_parallel
}
# (Under valgrind or the sanitizers every piece is slow.)
if [ -z "${RESHAPE_CHECK:-}" ]; then
  p=$(splits_in_parallel)
  echo "no latency: $p of 8 split requests with helpers"
  test "$p" -le 2 || fail "a plugin without latency got helpers $p times"
fi
p=$(splits_in_parallel latency=1ms)
echo "1 ms: $p of 8 split requests with helpers"
test "$p" = 8 || fail "a plugin with latency got helpers only $p times"

# Reads and writes are timed apart: fast writes (memory) between slow
# reads (delay filter) must not take the reads' helpers away.
nbdkit -U - --filter="$FILTER" --filter=delay memory 8M delay-read=2ms \
  reshape-size=4K reshape-stats="$tmp/stats-mixed.json" \
  --run 'nbdsh -u "$uri" -c "
h.pwrite(b\"w\" * (128 << 10), 0)
for i in range(5):
    # (rewriting memory already there: no allocation, a fast write)
    h.pwrite(b\"w\" * (128 << 10), 0)
    assert h.pread(1 << 20, 0)[:128 << 10] == b\"w\" * (128 << 10)"'
p=$(stat_of "$tmp/stats-mixed.json" split_reads_parallel)
echo "slow reads between fast writes: $p of 5 reads with helpers"
test "$p" = 5 || fail "reads after fast writes lost their helpers ($p of 5)"
