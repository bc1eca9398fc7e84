#!/usr/bin/env bash
# Faults: the error filter beneath, failing every kind of request at
# several rates, with readahead and write-back on.  Every answer must
# be the right data or a clean error; every write whose flush succeeded
# must be in the backing file after nbdkit exits (fault-client.py).
# Random (seeds printed, RESHAPE_SEEDS=N replays).
source "$srcdir/functions.sh"
requires /usr/bin/python3 -c 'import nbd'

seeds=${RESHAPE_SEEDS:-"$RANDOM $RANDOM"}
echo "seeds: $seeds"
size=4194304
policy="blocksize-minimum=4096 blocksize-error-policy=error"

# run NAME "RATES" "FILTERS" "PARAMETERS"
run ()
{
  local name=$1 rates=$2 filters=$3 params=$4 seed rate
  for rate in $rates; do
    for seed in $seeds; do
      echo "== $name, error-rate=$rate, seed $seed"
      rm -f "$tmp/disk"; truncate -s $size "$tmp/disk"
      nbdkit -U - --filter="$FILTER" $filters --filter=error \
        file "$tmp/disk" error=EIO error-rate=$rate $params \
        reshape-stats="$tmp/stats.json" \
        --run "$srcdir/fault-client.py $seed \$uri $size $tmp/model" \
        2> "$tmp/stderr" || {
          grep -v injecting "$tmp/stderr" | tail -20 >&2
          fail "$name, rate $rate: seed $seed"
        }
      grep -v 'injecting' "$tmp/stderr" | grep -E 'assert|[Aa]bort|Segm' &&
        fail "$name, rate $rate: seed $seed: nbdkit crashed"
      "$srcdir/compare-model.py" "$tmp/disk" "$tmp/model" ||
        fail "$name, rate $rate: seed $seed: a flushed write is lost"
      for k in readahead_hits staged_bytes read_modify_writes; do
        echo "  $k $(stat_of "$tmp/stats.json" $k)"
      done
    done
  done
}

# A flush succeeds only when every deferred write before it did: with
# read-modify-write under write-back, several plugin requests stand
# behind each staged range, so lower rates keep batches finishing.
# (The delay makes the plugin slow enough to be read ahead for.)
run "write-back and readahead" "1% 5% 10%" "--filter=delay" \
  "delay-read=1ms reshape-writeback=true reshape-size=64K reshape-readahead=1M"
run "write-back, readahead, 4K-minimum plugin" "1% 2%" \
  "--filter=delay --filter=blocksize-policy" \
  "delay-read=1ms $policy reshape-writeback=true reshape-size=64K reshape-readahead=1M"
run "defaults with merging, 4K-minimum plugin" "1% 5% 10%" \
  "--filter=blocksize-policy" \
  "$policy reshape-size=64K"
