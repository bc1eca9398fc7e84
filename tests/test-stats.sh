#!/usr/bin/env bash
# The statistics report: a summary of client requests against the
# plugin requests they became, size histograms and the counters that
# moved; as JSON when the file name ends in .json.  A known workload
# is checked against both.
source "$srcdir/functions.sh"
requires nbdsh --version

# 4 writes of 4M cut at 256K; one unaligned 100-byte read padded to the
# plugin's 4K block; one flush.
workload='
for i in range(4):
    h.pwrite(bytearray(4 << 20), i << 22)
h.pread(100, 5)
h.flush()
'
run ()
{
  nbdkit -U - --filter="$FILTER" --filter=blocksize-policy memory 16M \
    blocksize-minimum=4096 blocksize-error-policy=error \
    reshape-size=256K reshape-stats="$1" \
    --run "nbdsh -u \"\$uri\" -c '$workload'"
}

run "$tmp/stats"
cat "$tmp/stats"
row () { awk -v op="$1" '$1 == op' "$tmp/stats" | head -1; }
# The summary: pwrite: 4 client requests of 4M became 64 plugin
# requests of 256K.
set -- $(row pwrite)
test "$2" = 4 && test "$3" = 16M && test "$5" = 64 && test "$6" = 16M &&
  test "$8" = 1:16.0 || fail "pwrite row: $*"
# pread: one unaligned 100-byte read became one 4K block read.
set -- $(row pread)
test "$2" = 1 && test "$3" = 100 && test "$5" = 1 && test "$6" = 4K &&
  test "$8" = 1.0:1 || fail "pread row: $*"
set -- $(row flush)
test "$*" = "flush 1 1 1.0:1" || fail "flush row: $*"
grep -qE '^[0-9]+\.[0-9]+ s from the first client request to the last' \
  "$tmp/stats" || fail "no elapsed time"
grep -qx 'unasked: 3.9K read that no client asked for, 3996.0% of the 100 that clients read' \
  "$tmp/stats" || fail "unasked bytes"
grep -qx 'size: fixed 256K (reshape-size)' "$tmp/stats" ||
  fail "a fixed size is not reported as such"
! grep -q 'auto' "$tmp/stats" || fail "reshape-size=auto named with a fixed size"
# The histograms.
grep -q '^pwrite sizes' "$tmp/stats" || fail "no pwrite histogram"
grep -E '^ +4M\+ +#+ +4 ' "$tmp/stats" >/dev/null ||
  fail "histogram lacks the 4M client bar"
grep -E '^ +256K\+ .* #+ +64$' "$tmp/stats" >/dev/null ||
  fail "histogram lacks the 256K plugin bar"
# Counters: only those not zero, sizes in nbdkit's units.
grep -qE '^  requests split +4$' "$tmp/stats" || fail "split counter"
grep -qE '^  partial blocks read +1$' "$tmp/stats" || fail "partial read counter"
grep -qE '^  partial block padding read +3.9K$' "$tmp/stats" ||
  fail "padding counter"
! sed -n '/^counters/,/^$/p' "$tmp/stats" | grep -qE ' 0$' ||
  fail "a zero counter is listed"
! grep -q ' $' "$tmp/stats" || fail "trailing blanks"

# The same workload as JSON: every counter, the ops, the size.
run "$tmp/stats.json"
cat "$tmp/stats.json"
expect ()
{
  local v
  v=$(stat_of "$tmp/stats.json" "$1")
  test "$v" = "$2" || fail "JSON $1: $v, want $2"
}
expect schema 2
expect ops.pwrite.client.requests 4
expect ops.pwrite.client.bytes $((16 << 20))
expect ops.pwrite.plugin.requests 64
expect ops.pwrite.plugin.bytes $((16 << 20))
expect ops.pread.client.requests 1
expect ops.pread.client.bytes 100
expect ops.pread.plugin.requests 1
expect ops.pread.plugin.bytes 4096
expect ops.flush.client.requests 1
expect ops.flush.plugin.requests 1
expect ops.zero.client.requests 0
expect requests_split 4
expect partial_blocks_read 1
expect padding_bytes 3996
expect unasked_bytes 3996
expect size $((256 << 10))
test "$(stat_of "$tmp/stats.json" ops.pwrite.plugin.sizes)" = \
     "{'262144': 64}" || fail "JSON pwrite plugin sizes"
python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
assert len(r["counters"]) >= 26, "not every counter"
assert r["exports"] == []
' "$tmp/stats.json" || fail "JSON shape"

# reshape-size=auto: the summary names what is known per export.
nbdkit -U - --filter="$FILTER" memory 1M reshape-stats="$tmp/auto" --run 'nbdinfo "$uri" >/dev/null'
grep -qx "size: auto, export '': none" "$tmp/auto" ||
  { cat "$tmp/auto"; fail "auto summary line"; }

# Export names are any bytes (nbdkit takes them; here through the
# URI): the JSON stays valid (each byte that is not printable ASCII is
# one \u00XX: decoded as Latin-1, "name" is the bytes again), and the
# text report quotes names so that none adds a line.
names="caf%E9%20%22q%22 %ED%A0%80 %ED%BF%BF %E0%80%80 %F0%80%80%80
  %F4%90%80%80 %80 %C3 %E2%82 %F8 %C2%80 %C3%A9 x%0Ay%0D%0Asize:%20evil"
run='for n in '"$(echo $names)"'; do
  nbdinfo "nbd+unix:///$n?socket=$unixsocket" > /dev/null || exit 1; done'
for f in names.json names.txt; do
  nbdkit -U - --filter="$FILTER" memory 1M reshape-stats="$tmp/$f" \
    --run "$run" || fail "nbdinfo of odd export names ($f)"
done
python3 - "$tmp/names.json" $names <<'PYEOF' ||
import json, sys, urllib.parse
raw = open(sys.argv[1], "rb").read()
assert max(raw) < 0x80, "the JSON is not ASCII"
r = json.loads(raw.decode("ascii"))
got = {e["name"].encode("latin-1"): e for e in r["exports"]}
assert r["schema"] == 2, r["schema"]
for n in sys.argv[2:]:
    b = urllib.parse.unquote_to_bytes(n)
    assert b in got, "export %r missing from the JSON" % b
print("ok: %d names" % len(sys.argv[2:]))
PYEOF
  { cat "$tmp/names.json"; fail "JSON of odd export names"; }
! grep -q '^size: evil' "$tmp/names.txt" ||
  fail "an export name added a line to the text report"
grep -qF "export 'x\x0ay\x0d\x0asize: evil'" "$tmp/names.txt" ||
  { cat "$tmp/names.txt"; fail "odd export name not quoted in the text report"; }

# With -v the same report goes to the debug log.
nbdkit -v -U - --filter="$FILTER" memory 1M \
  --run 'nbdinfo "$uri" >/dev/null' 2> "$tmp/verbose"
grep -q 'reshape: nbdkit-reshape-filter statistics' "$tmp/verbose" ||
  fail "-v did not print the report"
# A server that fails to start never touches the report's file: not a
# file holding data (a bad reshape-parallel fails after reshape-stats
# is taken), nor one reached through a symlink.  A symlink is refused at
# start-up, its target left alone; a regular file is replaced at exit.
echo "precious data" > "$tmp/precious"
cp "$tmp/precious" "$tmp/old"
ln -s "$tmp/precious" "$tmp/link"
for f in "$tmp/old" "$tmp/link"; do
  if nbdkit -U - --filter="$FILTER" memory 1M reshape-stats="$f" \
       reshape-parallel=abc --run true 2> "$tmp/err"; then
    fail "started with reshape-parallel=abc"
  fi
  test "$(cat "$f")" = "precious data" ||
    fail "reshape-stats=$f: changed by a server that failed to start"
done
if nbdkit -U - --filter="$FILTER" memory 1M reshape-stats="$tmp/link" \
     --run true 2> "$tmp/err"; then
  fail "reshape-stats: a symlink was accepted"
fi
grep -q "reshape-stats: $tmp/link is a symbolic link" "$tmp/err" ||
  fail "symlink refused without a clear error: $(cat "$tmp/err")"
test -L "$tmp/link" && test "$(cat "$tmp/precious")" = "precious data" ||
  fail "reshape-stats: the symlink or its target changed"
echo "refused: $(cat "$tmp/err")"
nbdkit -U - --filter="$FILTER" memory 1M reshape-stats="$tmp/old" --run true
grep -q '^nbdkit-reshape-filter statistics' "$tmp/old" ||
  fail "reshape-stats: a regular file was not replaced at exit"

# While nbdkit runs, the report is rewritten every 5 s, whole: a reader
# sees the reads made so far, and never half a file.
nbdkit -U - --filter="$FILTER" memory 1M reshape-stats="$tmp/live.json" \
  --run 'nbdsh -u "$uri" -c "h.pread(4096, 0)"; sleep 7; cp '"$tmp/live.json $tmp/seen.json" ||
  fail "live report: nbdkit failed"
[ "$(stat_of "$tmp/seen.json" ops.pread.client.requests)" = 1 ] ||
  fail "the report written while nbdkit ran: $(cat "$tmp/seen.json")"

# The report agrees with itself: a stream that was read ahead is no
# export of state none.  -D reshape.auto=1 says the grain chosen.
nbdkit -U - -v -D reshape.auto=1 --filter="$FILTER" --filter=delay \
  memory 8M rdelay=1ms reshape-stats="$tmp/naive" \
  --run 'nbdsh -u "$uri" -c "
for off in range(0, 8 << 20, 4096):
    h.pread(4096, off)
"' 2> "$tmp/debug" || fail "naive reader"
grep -qE '^  readahead hits +[1-9]' "$tmp/naive" || fail "no read-ahead: $(cat "$tmp/naive")"
! grep -q "^size: auto, export '': none" "$tmp/naive" ||
  fail "a stream read ahead is reported as none: $(cat "$tmp/naive")"
grep -q "reshape: auto: export '': grains of" "$tmp/debug" ||
  fail "-D reshape.auto=1 said no grain: $(grep reshape "$tmp/debug" | tail -5)"

# nbdcopy over a 1 ms plugin: how its 2M reads are cut, and why.
nbdkit -U - -v -D reshape.auto=1 --filter="$FILTER" --filter=delay \
  pattern 64M delay-read=1ms --run 'nbdcopy "$uri" null:' 2> "$tmp/debug" ||
  fail "nbdcopy"
grep -E "reshape: auto: export '': reads of 2048K (whole|cut at)" "$tmp/debug" ||
  fail "-D reshape.auto=1 said nothing of nbdcopy's reads"
echo "ok"
