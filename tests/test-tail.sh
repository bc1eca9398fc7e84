#!/usr/bin/env bash
# An export whose size is not a multiple of reshape-min keeps its tail
# readable and writable, and the plugin still only sees aligned
# requests, except the one request that ends exactly at the end.
source "$srcdir/functions.sh"
requires nbdsh --version

size=10000
truncate -s $size "$tmp/disk"
log="$tmp/plugin.log"
nbdkit -U - --filter="$FILTER" --filter=log file "$tmp/disk" \
  logfile="$log" reshape-min=4096 \
  --run 'nbdsh -u "$uri" -c "
h.pwrite(b\"tail!\", 9995)
h.pwrite(b\"x\" * 3000, 5000)
h.zero(10, 9990)
assert h.pread(5, 9995) == bytes(5)
assert h.pread(3000, 5000) == b\"x\" * 3000
h.pwrite(b\"end\", 9997)
assert h.pread(3, 9997) == b\"end\"
assert h.pread(1, 9999) == b\"d\"
"'
test "$(tail -c 3 "$tmp/disk")" = "end" || fail "the tail did not reach the file"
test "$(stat -c %s "$tmp/disk")" = $size || fail "file size changed"

grep -E ' (Read|Write|Zero|Trim) id=' "$log" |
  sed -E 's/.*offset=(0x[0-9a-f]+) count=(0x[0-9a-f]+).*/\1 \2/' |
  while read -r o c; do
    o=$((o)); c=$((c))
    if [ $((o % 4096)) -ne 0 ]; then fail "unaligned offset $o"; fi
    if [ $((c % 4096)) -ne 0 ] && [ $((o + c)) -ne $size ]; then
      fail "unaligned count $c at $o not ending at the export end"
    fi
  done
echo "ok: tail usable; plugin saw aligned requests only"
