#!/usr/bin/env bash
# reshape-maxdata caps reads and writes, reshape-maxlen zero, trim,
# cache and extents, as the blocksize filter's maxdata and maxlen do
# (reshape-max sets both); with reshape-min, the scenarios of nbdkit's
# own blocksize tests, mapped to these parameters:
#   - short accesses: a 1-byte read reads its 1K block, a 1-byte write
#     or zero is a read-modify-write of it, a 1-byte trim is dropped;
#   - large ones: reads and writes cut at (multiples of) 512K, zero
#     and trim at 1M, every plugin request aligned to 1K, the image the
#     same as one written without the filter;
#   - extents over a plugin that answers one 512-byte extent at a time
#     and refuses requests over 32K: the whole map, and unaligned
#     probes, right.
source "$srcdir/functions.sh"
requires qemu-io --version
requires nbdsh --version

truncate -s 10M "$tmp/plain.img" "$tmp/shaped.img"
start_server "$tmp/plain.sock" "$tmp/plain.pid" --filter=log \
  file "$tmp/plain.img" logfile="$tmp/plain.log"
start_server "$tmp/shaped.sock" "$tmp/shaped.pid" --filter="$FILTER" \
  --filter=log file "$tmp/shaped.img" logfile="$tmp/shaped.log" \
  reshape-min=1024 reshape-maxdata=512K reshape-maxlen=1M \
  reshape-readahead=off
io ()
{
  local s
  for s in plain shaped; do
    qemu-io -f raw "$@" "nbd+unix://?socket=$tmp/$s.sock" > /dev/null ||
      fail "qemu-io $* ($s)"
  done
}
# log PATTERN: how many plugin requests of the shaped server match.
log () { grep -c "$1" "$tmp/shaped.log" || :; }

io -c 'r 1 1' -c 'w 10001 1' -c 'w -z 20001 1' -c 'discard 30001 1'
test "$(log 'Read .*offset=0x0 count=0x400 ')" = 1 ||
  fail "a 1-byte read did not read its 1K block"
test "$(log 'Read .*offset=0x2400 count=0x400 ')" = 1 &&
  test "$(log 'Write .*offset=0x2400 count=0x400 ')" = 1 ||
  fail "a 1-byte write was not a read-modify-write of its block"
test "$(log ' Zero id=')" = 0 && test "$(log 'Write .*offset=0x4c00 count=0x400 ')" = 1 ||
  fail "a 1-byte zero was not written as its block"
test "$(log ' Trim id=')" = 0 || fail "a 1-byte trim reached the plugin"
echo "ok: short accesses"

io -c 'w -P 11 1048575 4094305' -c 'w -z 1050000 1100000' \
   -c 'r -P 0 1050000 1100000' -c 'r -P 11 3000000 1048577' \
   -c 'discard 7340031 2097153'
test "$(log '\(Read\|Write\) .*count=0x80000 ')" -ge 8 ||
  fail "reads and writes were not cut at 512K"
# Cut at multiples of 1M: a 1100000-byte zero from 1050000 is two.
test "$(log ' Zero id=')" = 2 || fail "zero was not cut at 1M"
test "$(log ' Trim id=.*count=0x100000 ')" = 2 || fail "trim was not cut at 1M"
sed -nE 's/.* (Read|Write|Zero|Trim) id=[0-9]+ offset=(0x[0-9a-f]+) count=(0x[0-9a-f]+) .*/\1 \2 \3/p' \
  "$tmp/shaped.log" | while read -r op o c; do
  case $op in Read|Write) cap=524288 ;; *) cap=1048576 ;; esac
  [ $((c)) -le $cap ] || fail "$op of $((c)) bytes reached the plugin"
  [ $((o % 1024)) = 0 ] && [ $((c % 1024)) = 0 ] ||
    fail "unaligned plugin request: $op of $((c)) at $((o))"
done
stop_servers
cmp "$tmp/plain.img" "$tmp/shaped.img" || fail "the images differ"
echo "ok: large accesses cut at 512K (data) and 1M (zero, trim), aligned"

# Extents: one 512-byte extent per call, a hole at [4K, 8K), requests
# over 32K or not a multiple of 512 refused.
exts='
if [ $3 -gt 32768 ] || [ $(( ($3 | $4) % 512 )) != 0 ]; then
  echo "EINVAL bad request $3 at $4" >&2; exit 1
fi
if [ $4 -ge 4096 ] && [ $4 -lt 8192 ]; then echo $4 512 hole,zero
else echo $4 512; fi'
nbdkit -U - --filter="$FILTER" eval get_size='echo 65536' \
  pread='exit 1' extents="$exts" reshape-min=4K reshape-maxlen=32K \
  --run 'nbdsh --base-allocation -u "$uri" -c "
got = []
def collect(ctx, offset, entries, err):
    pos = offset
    for length, flags in zip(entries[0::2], entries[1::2]):
        if got and got[-1][2] == flags and got[-1][0] + got[-1][1] == pos:
            got[-1][1] += length
        else:
            got.append([pos, length, flags])
        pos += length
size = h.get_size()
off = 0
while off < size:
    before = len(got) and got[-1][0] + got[-1][1]
    h.block_status(size - off, off, collect)
    off = got[-1][0] + got[-1][1]
    assert off > before
assert [g[1:] for g in got] == [[4096, 0], [4096, 3], [57344, 0]], got
for off, want in ((1, 0), (512, 0), (4095, 0), (4096, 3), (8191, 3)):
    got = []
    h.block_status(1, off, collect, nbd.CMD_FLAG_REQ_ONE)
    assert got[0][0] == off and got[0][2] == want, (off, got)
print(\"extents ok\")
"' || fail "extents under reshape-maxlen=32K"
echo "ok: extents under reshape-maxlen=32K and reshape-min=4K"
