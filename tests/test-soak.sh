#!/usr/bin/env bash
# Soak: one nbdkit with every feature on (readahead, merging,
# write-back) serves rounds of the randomized test for RESHAPE_SOAK
# seconds (default 60; CI runs 180), each round on a fresh export of
# the file plugin's dir= mode.  Every round's reads and backing file
# are checked, and nbdkit's resident memory must not grow: after the
# first rounds it stays within 16M of where it was.
source "$srcdir/functions.sh"
requires /usr/bin/python3 -c 'import nbd'
test -r /proc/self/status || { echo "no /proc: skipped"; exit 77; }
# Memory figures mean nothing under a sanitizer or valgrind.
if [ -n "${RESHAPE_CHECK:-}" ]; then echo "under $RESHAPE_CHECK: skipped"; exit 77; fi

seconds=${RESHAPE_SOAK:-60}
seed=${RESHAPE_SEEDS:-$RANDOM}; seed=${seed%% *}
echo "seed: $seed, $seconds s"
size=2097152
mkdir "$tmp/dir"
start_server "$tmp/sock" "$tmp/pid" --filter="$FILTER" --filter=delay \
  file dir="$tmp/dir" delay-read=1ms delay-write=1ms reshape-size=64K \
  reshape-writeback=true reshape-readahead=1M
pid=$(cat "$tmp/pid")
rss () { awk '/^VmRSS/ {print $2}' "/proc/$pid/status"; }

end=$((SECONDS + seconds)) round=0 first=
while [ $SECONDS -lt $end ] || [ $round -lt 4 ]; do
  round=$((round + 1))
  truncate -s $size "$tmp/dir/r$round"
  # Odd rounds wait for each request (readahead), even ones keep 8 in
  # flight per connection (merging).
  depth=$((round % 2 ? 1 : 8))
  "$srcdir/random-io.py" $((seed + round)) \
    "nbd+unix:///r$round?socket=$tmp/sock" $size "$tmp/model" \
    --ops 600 --seq 0.5 --seqwrite --depth $depth >/dev/null ||
    fail "round $round: seed $((seed + round))"
  # A flush (multi-conn: it covers every connection) writes back what
  # is still staged.
  nbdsh -u "nbd+unix:///r$round?socket=$tmp/sock" -c 'h.flush()'
  "$srcdir/compare-model.py" "$tmp/dir/r$round" "$tmp/model" >/dev/null ||
    fail "round $round: seed $((seed + round)): backing file differs"
  rm -f "$tmp/dir/r$round"
  now=$(rss)
  echo "round $round: RSS $now kB"
  if [ $round -eq 3 ]; then first=$now; fi
  if [ -n "$first" ] && [ "$now" -gt $((first + 16384)) ]; then
    fail "RSS grew from $first kB to $now kB by round $round"
  fi
done
echo "ok: $round rounds, RSS from $first kB to $now kB"
