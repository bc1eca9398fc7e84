#!/usr/bin/env bash
# The statistics report shows client requests beside the plugin
# requests they became, with size histograms and counters.
source "$srcdir/functions.sh"
requires nbdsh --version

nbdkit -U - --filter="$FILTER" --filter=blocksize-policy memory 16M \
  blocksize-minimum=4096 blocksize-error-policy=error \
  reshape-size=256K reshape-stats="$tmp/stats" \
  --run 'nbdsh -u "$uri" -c "
for i in range(4):
    h.pwrite(bytearray(4 << 20), i << 22)
h.pread(100, 5)
h.flush()
"'
cat "$tmp/stats"
row () { awk -v op="$1" '$1 == op' "$tmp/stats" | head -1; }
# pwrite: 4 client requests of 4M became 64 plugin requests of 256K.
set -- $(row pwrite)
test "$2" = 4 && test "$3" = 16M && test "$4" = 64 && test "$5" = 16M ||
  fail "pwrite row: $*"
# pread: 1 unaligned 100-byte read became one 4K block read.
set -- $(row pread)
test "$2" = 1 && test "$4" = 1 && test "$5" = 4K || fail "pread row: $*"
grep -q '^pwrite sizes' "$tmp/stats" || fail "no pwrite histogram"
grep -E '^ +4M\+ +#+ +4 ' "$tmp/stats" >/dev/null ||
  fail "histogram lacks the 4M client bar"
grep -E '^ +256K\+ .* #+ +64$' "$tmp/stats" >/dev/null ||
  fail "histogram lacks the 256K plugin bar"
grep -qE '^requests split +4$' "$tmp/stats" || fail "split counter"
grep -qE '^partial blocks read +1$' "$tmp/stats" || fail "partial read counter"

# With -v the same report goes to the debug log.
nbdkit -v -U - --filter="$FILTER" memory 1M \
  --run 'nbdinfo "$uri" >/dev/null' 2> "$tmp/verbose"
grep -q 'reshape: nbdkit-reshape-filter statistics' "$tmp/verbose" ||
  fail "-v did not print the report"
echo "ok"
