#!/usr/bin/env bash
# Benchmark: 64 in-flight unaligned 3584-byte writes (16M) to a backend
# that answers after 1 ms and demands 4K blocks; data verified after.
#   no filter   the same writes to the same backend WITHOUT the 4K
#               demand (it would refuse them): the floor
#   blocksize   nbdkit-blocksize-filter minblock=4096 (global RMW lock)
#   reshape     this filter (per-block range locks)
# usage: bench/unaligned-writes.sh [hyperfine options], from a built tree
set -euo pipefail
case ${1:-} in
  -h|--help) sed -n '2,/^set -euo/{/^set/d;s/^# \{0,1\}//;p;}' "$0"; exit 0 ;;
esac
cd "$(dirname "$0")/.."
export PATH="/usr/bin:/bin:$PATH"
command -v hyperfine >/dev/null ||
  { echo "$0: needs hyperfine (apt-get install hyperfine)" >&2; exit 1; }
filter="$PWD/filters/reshape/.libs/nbdkit-reshape-filter.so"
work="$PWD/bench/unaligned-writes.py"
size=${SIZE:-3584} total=${TOTAL:-16777216} depth=${DEPTH:-64}
slow="--filter=delay"
policy="--filter=blocksize-policy"
policy_args="blocksize-minimum=4096 blocksize-error-policy=error"
delay_args="delay-read=1ms delay-write=1ms"
run="--run '$work \$uri $size $total $depth'"

hyperfine --warmup 1 --runs "${RUNS:-3}" "$@" \
  -n "no filter" "nbdkit -U - $slow memory 64M $delay_args $run" \
  -n "blocksize filter" "nbdkit -U - --filter=blocksize $slow $policy memory 64M minblock=4096 $policy_args $delay_args $run" \
  -n "reshape filter" "nbdkit -U - --filter=$filter $slow $policy memory 64M $policy_args $delay_args $run"
