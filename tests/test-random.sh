#!/usr/bin/env bash
# Randomized differential test (random-io.py): concurrent unaligned
# requests from several connections, every read checked against a
# model, the backing file checked after nbdkit exits.  Seeds come from
# $RESHAPE_SEEDS or are drawn now; each is printed so a failure can be
# replayed with RESHAPE_SEEDS=N.
source "$srcdir/functions.sh"
requires /usr/bin/python3 -c 'import nbd'

seeds=${RESHAPE_SEEDS:-"$RANDOM $RANDOM $RANDOM"}
echo "seeds: $seeds"
ops=${RESHAPE_OPS:-1500}
disk="$tmp/disk"

# run NAME SIZE RANDOM-IO-ARGS "FILTERS" "PARAMETERS" [EXPORT-SIZE]: a
# file of SIZE bytes, offered as EXPORT-SIZE (default SIZE).
run ()
{
  local name=$1 size=$2 extra=$3 filters=$4 params=$5 seed
  local esize=${6:-$2}
  for seed in $seeds; do
    rm -f "$disk"; truncate -s "$size" "$disk"
    echo "== $name, seed $seed"
    nbdkit -U - --filter="$FILTER" $filters file "$disk" $params \
      reshape-stats="$tmp/stats.json" \
      --run "$srcdir/random-io.py $seed \$uri $esize $tmp/model --ops $ops $extra" \
      2> "$tmp/stderr" || {
        grep -v 'injecting' "$tmp/stderr" | tail -20 >&2
        fail "$name: seed $seed"
      }
    truncate -s "$esize" "$disk"      # the model's length
    "$srcdir/compare-model.py" "$disk" "$tmp/model" ||
      fail "$name: seed $seed: backing file differs from the model"
    case "$params" in
      *writeback=true*)
        staged=$(stat_of "$tmp/stats.json" staged_bytes)
        test "$staged" -gt 0 || fail "$name: seed $seed: nothing staged"
        echo "bytes staged: $staged" ;;
    esac
    case "$name" in
      *readahead*)
        hits=$(stat_of "$tmp/stats.json" readahead_hits)
        # About 50 hits in 1500 operations; in the 300 of the valgrind
        # runs, a few, and none for about 1 seed in 250.
        test "$hits" -gt 0 || [ "$ops" -lt 1000 ] ||
          fail "$name: seed $seed: readahead unused"
        echo "readahead hits: $hits" ;;
    esac
  done
}

policy="blocksize-minimum=4096 blocksize-error-policy=error"

# A plugin that rejects any unaligned request: nothing unaligned may
# get through, and concurrent read-modify-writes must not lose data.
run "4K-minimum plugin" 2097152 "" \
  "--filter=delay --filter=blocksize-policy" "delay-read=1ms $policy"
# No alignment needed: splitting only, small pieces.
run "no minimum, size 4K" 2097152 "" "" "reshape-size=4K reshape-max=8K"
# Export size not a multiple of the minimum: offered rounded down.
run "odd size, reshape-min=4K" $((2 * 1048576 + 1000)) "" "" reshape-min=4K \
  $((2 * 1048576))
# 64K minimum, a cap below the size.
run "64K minimum, max 128K" 2097152 "" "--filter=blocksize-policy" \
  "reshape-size=1M reshape-max=128K blocksize-minimum=64K blocksize-preferred=64K blocksize-error-policy=error"
# Readahead: sequential small reads from every connection among the
# writes, a slow plugin so fills overlap writes; cached data must never
# go stale.  Readahead is for clients that wait for each read, so each
# connection keeps one request in flight (the four still race).
run "readahead, 4K minimum" 2097152 "--seq 0.5 --depth 1" \
  "--filter=delay --filter=blocksize-policy" "delay-read=1ms $policy"
run "readahead, no minimum" 2097152 "--seq 0.7 --depth 1" "--filter=delay" \
  "delay-read=1ms reshape-size=64K"
# Write-back: staged small writes must be seen by every later read,
# zero and trim from any connection, and reach the file at the end.
run "write-back, 4K minimum" 2097152 "--seq 0.6 --seqwrite" \
  "--filter=delay --filter=blocksize-policy" \
  "delay-write=1ms $policy reshape-writeback=true reshape-size=64K"
run "write-back and readahead" 2097152 "--seq 0.6 --seqwrite --depth 1" \
  "--filter=delay" \
  "delay-read=1ms delay-write=1ms reshape-writeback=true reshape-size=64K"
run "write-back with everything" 2097152 "--seq 0.5 --seqwrite" \
  "--filter=delay" \
  "delay-write=1ms reshape-writeback=true reshape-size=64K"
# reshape-size=auto (the default) over a plugin with latency, every
# feature on: learning, cut choices, grains fetched for streams.
run "auto with everything" 2097152 "--seq 0.6 --seqwrite" \
  "--filter=delay" \
  "delay-read=1ms delay-write=1ms reshape-size=auto reshape-writeback=true"
# Injected EIO: errors reach the client, no wrong data, no acknowledged
# write lost.
run "4K minimum, EIO injected" 2097152 "--errors --seq 0.3" \
  "--filter=blocksize-policy --filter=error" \
  "$policy error=EIO error-rate=5%"
