#!/usr/bin/env bash
# Randomized write-back integrity where staged data outlives requests
# (wb-fault-client.py against a model), with and without injected EIO:
#   - names: three export names over one file (the file plugin ignores
#     the name): no name's staged write may undo another's later one;
#   - reconnect: connections (no multi-conn) dropped without flush and
#     made anew at random: the new ones read what the old ones wrote;
#   - sigterm: the client ends without flush and the server is stopped
#     at once, over a slow stack: what is not written back must be
#     reported (one error line at the name's last close), and no more
#     bytes differ than it reports.  Over the delay filter, whose sleeps
#     nbdkit aborts once it quits, some usually is; over a plugin slow
#     without nbdkit_nanosleep (sh, sleep) nothing may be.
# Seeds are printed; RESHAPE_SEEDS replays (default "1 2").
source "$srcdir/functions.sh"
requires /usr/bin/python3 -c 'import nbd'
have_filter delay && have_filter multi-conn ||
  { without "the whole test" "no delay or multi-conn filter"; exit 77; }

seeds=${RESHAPE_SEEDS:-"1 2"}
echo "seeds: $seeds"
ops=${RESHAPE_OPS:-800}
size=$((2 * 1024 * 1024))
wb="reshape-writeback=true reshape-size=64K"

# run NAME RATE SEED CLIENT-ARGS "FILTERS" "PARAMETERS"
run ()
{
  local name=$1 rate=$2 seed=$3 args=$4 filters=$5 params=$6
  echo "== $name, error-rate=$rate, seed $seed"
  # shellcheck disable=SC2086
  wb_fault_case "$name, rate $rate" "$seed" "$args" --filter="$FILTER" \
    $filters --filter=error file "$tmp/disk" error=EIO error-rate=$rate \
    $params $wb
}

# A plugin slow without nbdkit_nanosleep: every write sleeps 5 ms.
slow_sh_plugin "$tmp/slow.sh" "$tmp/disk" 0.005

# sigterm STACK RATE SEED OPS: the server started by hand (nbdkit --run
# ignores the status of a server it stops).
sigterm ()
{
  local stack=$1 rate=$2 seed=$3 n=$4 rc=0 job lost plugin
  echo "== sigterm-$stack, error-rate=$rate, seed $seed"
  rm -f "$tmp/disk" "$tmp/sock" "$tmp/pid"; truncate -s $size "$tmp/disk"
  case $stack in
    delay) plugin="--filter=delay --filter=error file $tmp/disk wdelay=10ms" ;;
    sh) plugin="--filter=error sh $tmp/slow.sh" ;;
  esac
  # shellcheck disable=SC2086
  nbdkit -U "$tmp/sock" -P "$tmp/pid" -f --filter="$FILTER" $plugin \
    error=EIO error-rate=$rate $wb 2> "$tmp/stderr" &
  job=$!
  wait_started "$tmp/sock" "$tmp/pid" > /dev/null
  "$srcdir/wb-fault-client.py" "$seed" "nbd+unix:///?socket=$tmp/sock" \
    $size "$tmp/model" --ops "$n" --no-flush ||
    fail "sigterm, rate $rate: seed $seed: the client failed"
  kill -TERM "$(cat "$tmp/pid")"
  wait "$job" || rc=$?
  ! died_of_signal "$rc" || fail "sigterm: seed $seed: nbdkit died ($rc)"
  lost=$(sed -n 's/.*: \([0-9]*\) acknowledged bytes of export .* lost at its last close.*/\1/p' \
           "$tmp/stderr" | awk '{ n += $1 } END { print n + 0 }')
  echo "exit status $rc, $lost bytes reported lost"
  [ "$rc" -eq 0 ] || fail "sigterm: seed $seed: exit status $rc"
  "$srcdir/compare-model.py" "$tmp/disk" "$tmp/model" "$lost" ||
    fail "sigterm, rate $rate: seed $seed: more lost than reported"
  [ "$stack" != sh ] || [ "$lost" -eq 0 ] ||
    fail "sigterm-sh: seed $seed: a plugin that could write lost data"
}

for rate in 0% 5%; do
  for seed in $seeds; do
    run names $rate $seed "--names 3" "" ""
    run reconnect $rate $seed "--reconnect 0.05" \
      "--filter=multi-conn --filter=delay" \
      "multi-conn-mode=disable wdelay=1ms"
    sigterm delay $rate $seed "$ops"
    sigterm sh $rate $seed 150
  done
done
echo "ok: no acknowledged write lost or undone"
