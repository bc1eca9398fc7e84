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
