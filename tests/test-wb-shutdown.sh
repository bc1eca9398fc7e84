#!/usr/bin/env bash
# A server told to stop (SIGTERM) while acknowledged writes are still
# staged writes them back before it exits, or, when the plugin cannot
# take them, says what was lost in one error line at the export's last
# close (retried for 5 s first).  The client writes 32 small blocks
# and exits without flush; the server is stopped at once, while the
# closing connection still writes back.
#   - through the delay filter, which cannot sleep once nbdkit quits:
#     what does not arrive must be in the loss line, whose bytes are
#     at least what is missing;
#   - through a plugin slow without nbdkit_nanosleep (sh, sleep): all
#     32 arrive, and nothing is lost.
# nbdkit --run ignores the status of a server it had to stop, so each
# server here is started and stopped by hand.
source "$srcdir/functions.sh"
requires /usr/bin/python3 -c 'import nbd'
have_filter delay || { without "the whole test" "no delay filter"; exit 77; }

# stop_case NAME: start nbdkit with the remaining arguments, write, stop
# it, and check what arrived against its status and log.
stop_case ()
{
  local name=$1; shift
  local sock="$tmp/sock" pidf="$tmp/pid" rc=0 job n lines
  rm -f "$sock" "$pidf"
  truncate -s 0 "$tmp/disk"; truncate -s 4M "$tmp/disk"
  nbdkit -U "$sock" -P "$pidf" -f --filter="$FILTER" "$@" \
    reshape-writeback=true reshape-size=64K 2> "$tmp/log" &
  job=$!
  wait_started "$sock" "$pidf" "$name" > /dev/null
  /usr/bin/python3 "$srcdir/wb-blocks.py" write "nbd+unix:///?socket=$sock" \
    32 "$name"
  kill -TERM "$(cat "$pidf")"
  wait "$job" || rc=$?
  ! died_of_signal "$rc" || fail "$name: nbdkit died of a signal ($rc)"
  n=$(/usr/bin/python3 "$srcdir/wb-blocks.py" count "$tmp/disk" 32 "$name")
  lines=$(grep -c "lost at its last close" "$tmp/log" || :)
  lost=$(sed -n "s/.* \([0-9]*\) acknowledged bytes of export .* lost at its last close.*/\1/p" \
         "$tmp/log")
  echo "$name: $n of 32 arrived, exit status $rc, $lines error lines (${lost:-0} bytes)"
  [ "$rc" -eq 0 ] || fail "$name: exit status $rc"
  if [ "$n" -lt 32 ]; then
    [ "$lines" -eq 1 ] ||
      fail "$name: lost blocks, $lines loss lines: $(tail -5 "$tmp/log")"
    [ "${lost:-0}" -ge $(( (32 - n) * 512 )) ] ||
      fail "$name: $((32 - n)) blocks missing, ${lost:-0} bytes reported lost"
  else
    [ "$lines" -eq 0 ] || fail "$name: all arrived, yet 'lost' was logged"
  fi
  echo "$n" > "$tmp/arrived"
}

stop_case delay --filter=delay file "$tmp/disk" wdelay=20ms

# A plugin whose slowness is not nbdkit_nanosleep: everything arrives.
slow_sh_plugin "$tmp/slow.sh" "$tmp/disk" 0.02
stop_case slow-sh sh "$tmp/slow.sh"
[ "$(cat "$tmp/arrived")" -eq 32 ] ||
  fail "slow-sh: a plugin that can still write lost acknowledged writes"
echo "ok: stopped servers write back, or say what was lost"
