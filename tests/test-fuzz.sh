#!/usr/bin/env bash
# Every command, cache and block status included, after streams of
# reads and between them (fuzz-client.py), over stacks that answer the
# can_* questions differently: nothing a client sends may abort the
# server, and every read matches the model.  Seeds from $RESHAPE_SEEDS
# or drawn now, each printed.
source "$srcdir/functions.sh"
requires /usr/bin/python3 -c 'import nbd'

seeds=${RESHAPE_SEEDS:-"$RANDOM $RANDOM"}
echo "seeds: $seeds"
ops=${RESHAPE_OPS:-300}
size=$((32 * 1024 * 1024))

# run NAME "FILTERS" PLUGIN...: the filter on top of FILTERS PLUGIN.
run ()
{
  local name=$1 filters=$2 seed rc; shift 2
  for seed in $seeds; do
    echo "== $name, seed $seed"
    rc=0
    nbdkit -U - --filter="$FILTER" $filters "$@" \
      --run "$srcdir/fuzz-client.py $seed \$uri $size --ops $ops" \
      2> "$tmp/stderr" || rc=$?
    if [ "$rc" != 0 ]; then
      grep -v 'injecting' "$tmp/stderr" | tail -20 >&2
      ! died_of_signal "$rc" || fail "$name: seed $seed: nbdkit died (status $rc)"
      fail "$name: seed $seed: status $rc"
    fi
  done
}

# A plugin that caches natively, one that does not cache (the filter
# must not pass a cache request to it), one whose cache nbdkit
# emulates, nbdkit's readahead filter below (it turns itself on from
# its own can_cache), a fixed size, write-back.
run "memory" "" memory $size
run "cache none below" "--filter=nocache" memory $size cachemode=none
run "cache emulated below" "--filter=nocache" memory $size cachemode=emulate
run "readahead below" "--filter=readahead" memory $size
run "fixed size, 4K minimum" "--filter=blocksize-policy" memory $size \
  reshape-size=64K blocksize-minimum=4096 blocksize-error-policy=error
run "write-back" "" memory $size reshape-writeback=true
run "read-only" "" memory $size -r
