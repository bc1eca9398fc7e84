#!/usr/bin/env bash
# Parameter-space stress: no combination of parameters may hang the
# server or corrupt data.  Each round starts nbdkit over a delay filter
# with a combination of reshape-pool, reshape-readahead, reshape-min,
# reshape-size, reshape-max, reshape-parallel, write-back and merging,
# including sizes that are multiples of nothing, and runs 8 or more
# concurrent clients of mixed kinds (stress-client.py): synchronous
# sequential 4K readers, 64-deep unaligned writers that read back,
# random readers with 16 in flight.  Every byte is checked; a client
# that has not finished within the watchdog's time fails the round.
#
# The first rounds are fixed; the rest are drawn from the seed
# (printed; RESHAPE_SEEDS=N replays).  RESHAPE_STRESS_ROUNDS sets how
# many random rounds (CI runs more).
source "$srcdir/functions.sh"
requires /usr/bin/python3 -c 'import nbd'
requires nbdcopy --version

seed=${RESHAPE_SEEDS:-$RANDOM}; seed=${seed%% *}
rounds=${RESHAPE_STRESS_ROUNDS:-4}
echo "seed: $seed, $rounds random rounds"
size=$((32 * 1024 * 1024))
watchdog=${RESHAPE_STRESS_TIMEOUT:-120}
# Under valgrind everything is 20-50x slower.
[ -z "${RESHAPE_CHECK:-}" ] || watchdog=$((watchdog * 10))

nbdkit -U - pattern $size --run "nbdcopy \"\$uri\" $tmp/pattern"

# round NAME CLIENTS PARAMETERS...: one nbdkit, one set of clients.
round ()
{
  local name=$1 kinds=$2; shift 2
  local filters="" policy="" p
  # The plugin must see only whole blocks of reshape-min.
  for p in "$@"; do
    case $p in
      reshape-min=*)
        filters=--filter=blocksize-policy
        policy="blocksize-minimum=${p#*=} blocksize-error-policy=error"
        # blocksize-policy's preferred size may not be below its minimum.
        [ "${p#*=}" != 64K ] || policy="$policy blocksize-preferred=64K" ;;
    esac
  done
  echo "== $name: $kinds: $*"
  cp "$tmp/pattern" "$tmp/disk"
  # shellcheck disable=SC2086
  timeout -k 10 $((watchdog + 60)) \
    nbdkit -U - --filter="$FILTER" --filter=delay $filters \
    file "$tmp/disk" delay-read=1ms delay-write=1ms $policy "$@" \
    reshape-stats="$tmp/stats.json" \
    --run "$srcdir/stress-client.py $seed \$uri $size $kinds $watchdog" \
    2> "$tmp/stderr" || {
      tail -20 "$tmp/stderr" >&2
      fail "$name (seed $seed): $*"
    }
  grep -E 'assert|[Aa]bort|Segm' "$tmp/stderr" &&
    fail "$name (seed $seed): nbdkit crashed: $*"
  :
}

# The combination that hung: a window end that is not a whole number
# of minimum blocks needed a bounce buffer while the window held the
# pool.
hang="reshape-pool=1M reshape-readahead=250K reshape-min=4K reshape-size=64K"
round "fixed: sequential readers" ssssssss $hang
hits=$(stat_of "$tmp/stats.json" readahead_hits)
test "$hits" -gt 1000 || fail "the fixed case no longer reads ahead ($hits hits)"
round "fixed: mixed" sswwrrsw $hang reshape-writeback=true
rmw=$(stat_of "$tmp/stats.json" read_modify_writes)
test "$rmw" -gt 0 || fail "the mixed case made no read-modify-write"
round "fixed: smallest pool" sswwrrswr reshape-pool=64K reshape-min=64K \
  reshape-readahead=100K reshape-writeback=true reshape-maxlen=64K

# pick WORDS...: one of them, in $v.  Not through $(...): bash reseeds
# RANDOM in each subshell, and the seed would not replay the rounds.
pick () { local a=("$@"); v=${a[RANDOM % ${#a[@]}]}; }
RANDOM=$seed
for i in $(seq 1 "$rounds"); do
  params=()
  pick 64K 100K 256K 1000000 1M 3M 64M
  params+=(reshape-pool=$v)
  pick off 64K 100K 250K 3000000 8M ""
  [ -z "$v" ] || params+=(reshape-readahead=$v)
  pick "" 512 4K 64K; min=$v
  [ -z "$min" ] || params+=(reshape-min=$min)
  pick "" 4K 64K 256K 2M
  [ -z "$v" ] || params+=(reshape-size=$v)
  # A cap below the minimum is refused at startup (test-params.sh).
  case $min in
    64K) pick "" 64K 100K 3000000 ;;
    *)   pick "" 8K 100K 128K 3000000 ;;
  esac
  [ -z "$v" ] || params+=(reshape-max=$v)
  pick 1 2 16; params+=(reshape-parallel=$v)
  pick true false; params+=(reshape-writeback=$v)
  pick "" 64K 1000000; [ -z "$v" ] || params+=(reshape-maxlen=$v)
  pick sswwrrsw swrswrswr sssswwww wwrrsswwrr; kinds=$v
  round "round $i" "$kinds" "${params[@]}"
done
echo "ok: $((rounds + 3)) rounds, no hang, all data checked"
