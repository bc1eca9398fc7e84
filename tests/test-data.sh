#!/usr/bin/env bash
# Pass-through data checks with nbdsh: every operation, aligned and not,
# against a plugin with no minimum and one demanding 4K.
source "$srcdir/functions.sh"
requires nbdsh --version

script='
import os
size = h.get_size()
model = bytearray(size)
def write(off, data, flags=0):
    h.pwrite(data, off, flags)
    model[off:off + len(data)] = data
def check(off, n):
    got = h.pread(n, off)
    assert got == model[off:off + n], "mismatch at %d+%d" % (off, n)
for off, n in [(0, 4096), (1, 1), (4095, 2), (1000, 70000),
               (65536 * 3 + 17, 300000), (size - 5000, 5000), (size - 1, 1)]:
    write(off, os.urandom(n))
    check(off, n)
write(123, os.urandom(9000), nbd.CMD_FLAG_FUA)
check(0, size)
h.zero(5000, 4000)
model[4000:9000] = bytes(5000)
h.zero(3 * 65536, 65536, nbd.CMD_FLAG_NO_HOLE)
model[65536:4 * 65536] = bytes(3 * 65536)
check(0, size)
h.flush()
h.cache(100000, 1)
check(0, size)
# Trim: data after it is undefined, but the rest must be untouched.
h.trim(8192, 8192 + 100)
check(0, 8192 + 100)
check(8192 * 2 + 100, size - (8192 * 2 + 100))
# Extents answer for the requested offset.
seen = []
h.block_status(65536, 4097, lambda ctx, off, ents, err: seen.append((off, ents)))
assert seen and seen[0][0] == 4097 and sum(seen[0][1][0::2]) > 0
print("data ok, size", size)
'
for stack in "memory 1M" \
             "--filter=blocksize-policy memory 1M blocksize-minimum=4096 blocksize-error-policy=error" \
             "memory 1000000 reshape-min=512 reshape-size=4K" \
             "--filter=blocksize-policy memory 2M blocksize-minimum=4096 blocksize-preferred=64K blocksize-error-policy=error"; do
  echo "== $stack"
  # shellcheck disable=SC2086
  nbdkit -U - --filter="$FILTER" $stack \
    --run 'nbdsh --base-allocation -u "$uri" -c '"'$script'"
done
