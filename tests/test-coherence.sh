#!/usr/bin/env bash
# The readahead cache is shared by the connections of one export and
# kept coherent: a write, zero or trim on connection B is seen by a
# read on connection A that had the range read ahead.  Two exports
# through one filter never see each other's data.  A delay below makes
# the plugin slow enough to be read ahead for.
source "$srcdir/functions.sh"
requires /usr/bin/python3 -c 'import nbd'

nbdkit -U - --filter="$FILTER" --filter=delay memory 16M delay-read=1ms \
  reshape-stats="$tmp/stats" \
  --run '/usr/bin/python3 -c "
import nbd, sys
a = nbd.NBD(); a.connect_uri(sys.argv[1])
b = nbd.NBD(); b.connect_uri(sys.argv[1])
def stream(h, start, n):
    return b\"\".join(h.pread(4096, start + i * 4096) for i in range(n))
# A reads sequentially: the filter reads ahead well past 1M.
assert stream(a, 0, 256) == bytes(1 << 20)
b.pwrite(b\"B\" * 5000, (1 << 20) + 100)       # inside the window
b.zero(4096, (1 << 20) + 8192)
a.pwrite(b\"A\" * 4096, (1 << 20) + 65536)       # own write too
b.trim(1 << 16, 2 << 20)
got = stream(a, 1 << 20, 128)
want = bytearray(128 * 4096)
want[100:5100] = b\"B\" * 5000
want[8192:12288] = bytes(4096)
want[65536:69632] = b\"A\" * 4096
assert got == want, \"stale data after writes from the other connection\"
print(\"coherent\")
" "$uri"'
hits=$(awk '/^readahead hits/ {print $NF}' "$tmp/stats")
test "$hits" -gt 200 || fail "readahead did not serve the reads ($hits hits)"
echo "ok: coherent across connections, $hits readahead hits"

# Two exports (file plugin, dir= mode): A's cached data never reaches B.
mkdir "$tmp/dir"
/usr/bin/python3 -c '
import sys
open(sys.argv[1] + "/a", "wb").write(b"a" * (4 << 20))
open(sys.argv[1] + "/b", "wb").write(b"b" * (4 << 20))' "$tmp/dir"
nbdkit -U - --filter="$FILTER" --filter=delay file dir="$tmp/dir" \
  delay-read=1ms \
  reshape-stats="$tmp/stats2" --run '/usr/bin/python3 -c "
import nbd, sys
def conn(name):
    h = nbd.NBD(); h.set_export_name(name); h.connect_unix(sys.argv[1]); return h
a, b = conn(\"a\"), conn(\"b\")
for i in range(512):
    assert a.pread(4096, i * 4096) == b\"a\" * 4096
    assert b.pread(4096, i * 4096) == b\"b\" * 4096
print(\"exports kept apart\")
" "$unixsocket"'
hits=$(awk '/^readahead hits/ {print $NF}' "$tmp/stats2")
test "$hits" -gt 500 || fail "two exports: readahead not exercised ($hits hits)"
echo "ok: two exports, $hits readahead hits, no mixing"
