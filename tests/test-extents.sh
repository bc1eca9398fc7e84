#!/usr/bin/env bash
# Block status at unaligned offsets, with REQ_ONE (as qemu sends it),
# over a plugin whose first extent may end before the client's offset,
# and through the blocksize filter below (which once tripped an nbdkit
# assertion).  Answers must describe the client's offset.
source "$srcdir/functions.sh"
requires nbdsh --version

# Data at 0-4K and 96K-100K, holes elsewhere.
truncate -s 1M "$tmp/sparse"
printf 'x%.0s' $(seq 4096) | dd of="$tmp/sparse" conv=notrunc status=none
printf 'y%.0s' $(seq 4096) |
  dd of="$tmp/sparse" bs=1024 seek=96 conv=notrunc status=none

script='
for off, want_hole in [(0, False), (8192, True), (16384, True),
                       (98304 + 17, False), (102400 + 3, True)]:
    for flags in (0, nbd.CMD_FLAG_REQ_ONE):
        seen = []
        h.block_status(65536, off,
                       lambda ctx, o, ents, err: seen.append((o, ents)),
                       flags)
        o, ents = seen[0]
        assert o == off and ents[0] > 0, (off, seen)
        hole = bool(ents[1] & nbd.STATE_HOLE)
        assert hole == want_hole, "offset %d: hole=%s" % (off, hole)
print("extents ok")
'
for stack in "file $tmp/sparse reshape-min=65536" \
             "--filter=blocksize file $tmp/sparse minblock=4096 reshape-min=65536"; do
  echo "== $stack"
  # shellcheck disable=SC2086
  nbdkit -U - --filter="$FILTER" $stack \
    --run 'nbdsh --base-allocation -u "$uri" -c '"'$script'"
done
