#!/usr/bin/env bash
# An export whose size is not a multiple of the minimum block size is
# offered rounded down to whole blocks (as nbdkit's blocksize filter
# does): the plugin is never sent a request it could refuse, and reads,
# writes, zero, trim and extents all work up to the new end, data
# checked.
source "$srcdir/functions.sh"
requires nbdsh --version
requires nbdcopy --version
requires nbdinfo --version

# The plugin refuses anything not a multiple of 4K: 1M + 1 bytes.
policy="blocksize-minimum=4096 blocksize-error-policy=error"
stack="--filter=$FILTER --filter=blocksize-policy memory size=1048577 $policy"
head -c 1048576 /dev/urandom > "$tmp/data"
nbdkit -U - $stack --run "
  nbdinfo --size \"\$uri\" > $tmp/size &&
  nbdcopy $tmp/data \"\$uri\" &&
  nbdcopy \"\$uri\" $tmp/back &&
  nbdinfo --map \"\$uri\" > $tmp/map &&
  nbdsh -u \"\$uri\" -c '
h.zero(4000, 1048576 - 4000)
assert h.pread(4000, 1048576 - 4000) == bytes(4000)
h.trim(4096, 1048576 - 4096)
h.pwrite(b\"end\", 1048576 - 3)
assert h.pread(3, 1048576 - 3) == b\"end\"
h.zero(1, 1048575)
assert h.pread(3, 1048576 - 3) == b\"en\\0\"
'"
test "$(cat "$tmp/size")" = 1048576 ||
  fail "export size $(cat "$tmp/size"), want 1048576 (rounded down)"
cmp "$tmp/data" "$tmp/back" || fail "nbdcopy: data differs"
awk 'END { if ($1 + $2 != 1048576) exit 1 }' "$tmp/map" ||
  { cat "$tmp/map"; fail "extents do not end at the rounded size"; }
echo "ok: 1M + 1 bytes under a 4K minimum: 1M offered, copied, checked"

# The file plugin with reshape-min=4K: 10000 bytes offered as 8192,
# every plugin request aligned, the bytes past the last block untouched.
size=10000
head -c $size /dev/urandom > "$tmp/disk"
cp "$tmp/disk" "$tmp/orig"
log="$tmp/plugin.log"
nbdkit -U - --filter="$FILTER" --filter=log file "$tmp/disk" \
  logfile="$log" reshape-min=4096 \
  --run 'nbdsh -u "$uri" -c "
assert h.get_size() == 8192
h.pwrite(b\"tail!\", 8187)
h.pwrite(b\"x\" * 3000, 5000)
assert h.pread(3000, 5000) == b\"x\" * 3000
h.zero(10, 8182)
assert h.pread(10, 8182) == bytes(10)
"'
test "$(stat -c %s "$tmp/disk")" = $size || fail "file size changed"
cmp <(tail -c $((size - 8192)) "$tmp/disk") \
    <(tail -c $((size - 8192)) "$tmp/orig") ||
  fail "bytes past the last whole block changed"
grep -E ' (Read|Write|Zero|Trim) id=' "$log" |
  sed -E 's/.*offset=(0x[0-9a-f]+) count=(0x[0-9a-f]+).*/\1 \2/' |
  while read -r o c; do
    o=$((o)); c=$((c))
    if [ $((o % 4096)) -ne 0 ] || [ $((c % 4096)) -ne 0 ]; then
      fail "unaligned request $c at $o"
    fi
    if [ $((o + c)) -gt 8192 ]; then fail "request $c at $o past 8192"; fi
  done
echo "ok: 10000 bytes offered as 8192; the plugin saw aligned requests only"
