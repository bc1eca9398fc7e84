#!/usr/bin/env bash
# Write-back under plugin failures keeps the semantics of a disk's
# volatile write cache (wb-fault-client.py): acknowledged data stays
# readable, on every connection, until it is in the plugin, whatever
# write-back fails meanwhile; a flush succeeds only when everything
# staged before it is in the plugin; nothing acknowledged is lost.
# The error filter beneath fails every kind of request at several
# rates.  nbdkit's cache filter (cache=writeback) runs the same client
# first, as the reference.  Random (seeds printed, RESHAPE_SEEDS=N
# replays).
source "$srcdir/functions.sh"
requires /usr/bin/python3 -c 'import nbd'

seeds=${RESHAPE_SEEDS:-"$RANDOM $RANDOM"}
echo "seeds: $seeds"
ops=${RESHAPE_OPS:-1500}
size=$((4 * 1024 * 1024))
policy="blocksize-minimum=4096 blocksize-error-policy=error"

# run NAME RATE SEED "FILTERS" "PARAMETERS"
run ()
{
  local name=$1 rate=$2 seed=$3 filters=$4 params=$5
  echo "== $name, error-rate=$rate, seed $seed"
  # shellcheck disable=SC2086
  wb_fault_case "$name, rate $rate" "$seed" "" $filters --filter=error \
    file "$tmp/disk" error=EIO error-rate=$rate $params
  deferred=$(grep -c 'deferred write' "$tmp/stderr" || :)
  total_deferred=$((total_deferred + deferred))
  echo "deferred write failures: $deferred"
}

total_deferred=0
for rate in 2% 5% 10%; do
  for seed in $seeds; do
    run "reference: cache=writeback" $rate $seed \
      "--filter=cache" "cache=writeback"
    run "write-back" $rate $seed "--filter=$FILTER" \
      "reshape-writeback=true reshape-size=64K"
    run "write-back, 4K-minimum plugin" $rate $seed \
      "--filter=$FILTER --filter=blocksize-policy" \
      "$policy reshape-writeback=true reshape-size=64K"
  done
done
# The test means something only if write-backs did fail.
test "$total_deferred" -gt 0 || fail "no deferred write-back ever failed"
echo "ok: $total_deferred deferred write-back failures, no acknowledged byte lost"
