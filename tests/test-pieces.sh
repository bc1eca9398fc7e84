#!/usr/bin/env bash
# The plugin (seen by nbdkit-log-filter below the filter) receives
# pieces cut at reshape-size and never above reshape-max; zero, trim
# and cache are cut only as reshape-max demands; FUA is per piece when
# native, else one flush after the pieces.  (reshape-readahead=off:
# with a read cache, cache requests fill it instead; test-readahead.)
source "$srcdir/functions.sh"
requires nbdsh --version

# reqs LOG KIND: "offset count" of each KIND request, in decimal
reqs ()
{
  grep " $2 id=" "$1" |
    sed -E 's/.*offset=(0x[0-9a-f]+) count=(0x[0-9a-f]+).*/\1 \2/' |
    while read -r o c; do echo "$((o)) $((c))"; done
}
# largest LOG KIND
largest () { reqs "$1" "$2" | awk 'BEGIN{m=0} $2>m{m=$2} END{print m}'; }
howmany () { reqs "$1" "$2" | wc -l; }

script='
h.pwrite(bytearray(b"a" * (3 << 20)), 12345)
assert h.pread(3 << 20, 12345) == b"a" * (3 << 20)
h.zero(1 << 30, 0)
h.trim(1 << 30, 0)
h.cache(1 << 30, 0)
h.block_status(1 << 20, 0, lambda *args: 0)
'
log="$tmp/plugin.log"
nbdkit -U - --filter="$FILTER" --filter=log memory 2G \
  logfile="$log" reshape-size=64K reshape-readahead=off \
  --run 'nbdsh --base-allocation -u "$uri" -c '"'$script'"
test "$(largest "$log" Read)" -le 65536 || fail "read above reshape-size"
test "$(largest "$log" Write)" -le 65536 || fail "write above reshape-size"
test "$(howmany "$log" Write)" -ge 48 || fail "3M write was not split"
test "$(howmany "$log" Zero)" = 1 || fail "a 1G zero was split: $(howmany "$log" Zero)"
test "$(howmany "$log" Trim)" = 1 || fail "a 1G trim was split"
test "$(howmany "$log" Cache)" = 1 || fail "a 1G cache was split"
echo "ok: size 64K: pieces <= 64K, zero/trim/cache whole"

# Pieces cut at reshape-size land on multiples of it (pieces may run
# in parallel, so sort them first).
reqs "$log" Write | sort -n | awk '
  NR > 1 && NR < total { if ($1 % 65536) { print "unaligned cut " $1; exit 1 } }
' total="$(howmany "$log" Write)" || fail "cut points not at reshape-size"

# reshape-max caps everything, extents included.
log="$tmp/max.log"
nbdkit -U - --filter="$FILTER" --filter=log memory 2G \
  logfile="$log" reshape-size=1M reshape-max=96K reshape-readahead=off \
  --run 'nbdsh --base-allocation -u "$uri" -c '"'$script'"
for k in Read Write Zero Trim Cache Extents; do
  m=$(largest "$log" $k)
  test "$m" -le 98304 || fail "$k of $m above reshape-max 96K"
  test "$m" -gt 0 || fail "no $k reached the plugin"
done
test "$(howmany "$log" Zero)" -ge $(( (1 << 30) / 98304 )) ||
  fail "1G zero not cut at reshape-max"
echo "ok: max 96K caps read, write, zero, trim, cache, extents"

# FUA: native -> on every piece; emulated -> pieces without, one flush.
# fua_log MODE: plugin log of one 1M FUA write cut into 16 pieces
fua_log ()
{
  nbdkit -U - --filter="$FILTER" --filter=log --filter=fua memory 4M \
    logfile="$tmp/$1.log" fuamode="$1" reshape-size=64K \
    --run 'nbdsh -u "$uri" -c "h.pwrite(bytearray(1 << 20), 0, nbd.CMD_FLAG_FUA)"'
  echo "$tmp/$1.log"
}
log=$(fua_log native)
test "$(grep ' Write id=' "$log" | grep -c 'fua=1')" = 16 ||
  fail "native FUA not on every piece"
test "$(grep -c ' Flush id=' "$log")" = 0 || fail "flush with native FUA"
log=$(fua_log emulate)
test "$(grep ' Write id=' "$log" | grep -c 'fua=0')" = 16 ||
  fail "emulated FUA: pieces should go without FUA"
test "$(grep -c ' Flush id=' "$log")" = 1 ||
  fail "emulated FUA: want exactly one flush, got $(grep -c ' Flush id=' "$log")"
grep ' Write id=\| Flush id=' "$log" | tail -1 | grep -q Flush ||
  fail "the flush must come after the pieces"
echo "ok: FUA native per piece, emulated as one flush after"

# A plugin that emulates FUA with a flush it does not advertise: the
# filter must not call that flush itself (nbdkit asserts), so FUA goes
# down on every piece and nbdkit does the rest.
truncate -s 1M "$tmp/fua.img"
nbdkit -U - --filter="$FILTER" eval \
  get_size='echo 1048576' \
  pread='dd if='"$tmp/fua.img"' skip=$4 count=$3 iflag=skip_bytes,count_bytes status=none' \
  pwrite='dd of='"$tmp/fua.img"' seek=$4 count=$3 oflag=seek_bytes iflag=count_bytes conv=notrunc status=none' \
  can_write='exit 0' can_flush='exit 3' flush='exit 0' can_fua='echo emulate' \
  reshape-size=4K \
  --run 'nbdsh -u "$uri" -c "
h.pwrite(b\"z\" * 10000, 100, nbd.CMD_FLAG_FUA)
assert h.pread(10000, 100) == b\"z\" * 10000
"' || fail "FUA write to a plugin with a hidden flush"
echo "ok: FUA with an unadvertised flush"

# A request left whole is not cut at multiples of 4G-1 (the cap of a
# plugin without a maximum), only at powers of 2: a write across offset
# 4G-1 of a 5G export reaches the plugin with no piece starting there.  (Cut there, nbdcopy between two
# connections of sparse-random failed a write: its 1-byte piece raced
# the piece before it inside one of the plugin's 4K blocks.)
nbdkit -U - --filter="$FILTER" --filter=log memory 5G \
  logfile="$tmp/4g.log" \
  --run 'nbdsh -u "$uri" -c "
h.pwrite(b\"q\" * 8192, 4294967295 - 4096)
assert h.pread(8192, 4294967295 - 4096) == b\"q\" * 8192
"' || fail "a write across 4G-1"
grep -q ' Write id=' "$tmp/4g.log" || fail "no write logged"
if grep ' Write id=' "$tmp/4g.log" | grep -q 'offset=0xffffffff '; then
  cat "$tmp/4g.log"; fail "a write across 4G-1 was cut at 4G-1"
fi
echo "ok: a write across 4G-1 was not cut there"
