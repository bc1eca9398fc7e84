#!/usr/bin/env bash
# The readahead cache is shared by the connections of one export and
# kept coherent: a write, zero or trim on connection B is seen by a
# read on connection A that had the range read ahead.  Two exports
# through one filter never see each other's data, nor do connections
# a plugin without multi-conn serves apart, nor TLS and plain clients
# of one export name.  A delay below makes the plugin slow enough to
# be read ahead for.
source "$srcdir/functions.sh"
requires /usr/bin/python3 -c 'import nbd'

nbdkit -U - --filter="$FILTER" --filter=delay memory 16M delay-read=1ms \
  reshape-stats="$tmp/stats.json" \
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
hits=$(stat_of "$tmp/stats.json" readahead_hits)
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
  reshape-stats="$tmp/stats2.json" --run '/usr/bin/python3 -c "
import nbd, sys
def conn(name):
    h = nbd.NBD(); h.set_export_name(name); h.connect_unix(sys.argv[1]); return h
a, b = conn(\"a\"), conn(\"b\")
for i in range(512):
    assert a.pread(4096, i * 4096) == b\"a\" * 4096
    assert b.pread(4096, i * 4096) == b\"b\" * 4096
print(\"exports kept apart\")
" "$unixsocket"'
hits=$(stat_of "$tmp/stats2.json" readahead_hits)
test "$hits" -gt 500 || fail "two exports: readahead not exercised ($hits hits)"
echo "ok: two exports, $hits readahead hits, no mixing"

# Without multi-conn the plugin may give each connection its own data
# (tmpdisk: a fresh disk each): one connection's reads, read ahead,
# must never serve another's.  A writes a secret and streams over it;
# B reads its own, blank, disk there.
cat > "$tmp/own.py" <<'PYEOF'
import nbd, sys
K, OFF = 4096, 8 << 20
a = nbd.NBD(); a.connect_uri(sys.argv[1])
b = nbd.NBD(); b.connect_uri(sys.argv[1])
assert not a.can_multi_conn()
secret = b"secret-of-conn-A" * (64 * K // 16)
a.pwrite(secret, OFF)
for i in range(48):
    assert a.pread(K, OFF + i * K) == secret[i * K:(i + 1) * K]
for i in range(48):
    got = b.pread(K, OFF + i * K)
    assert got == bytes(K), "B read A's data at +%d: %r" % (i * K, got[:16])
print("without multi-conn: each connection reads its own data")
PYEOF
nbdkit -U - --filter="$FILTER" --filter=delay tmpdisk 16M \
  command='truncate -s $size "$disk"' delay-read=2ms reshape-size=256K \
  reshape-stats="$tmp/stats3.json" \
  --run "/usr/bin/python3 $tmp/own.py \"\$uri\"" ||
  fail "without multi-conn, a connection read another's data"
hits=$(stat_of "$tmp/stats3.json" readahead_hits)
test "$hits" -gt 0 || fail "without multi-conn: readahead not exercised"

# A plugin may serve clients with TLS and without different data under
# one export name (tls-fallback): a plain client must never be served
# what a TLS client's reads fetched (reshape-size=auto fetches the
# whole grain, from offset 0, for a stream of small reads).
if have_filter tls-fallback &&
   /usr/bin/python3 -c 'import nbd; assert nbd.NBD().supports_tls()'; then
  printf 'alice:%s\n' 0123456789abcdef0123456789abcdef > "$tmp/keys.psk"
  cat > "$tmp/tls.py" <<'PYEOF'
import nbd, sys
sock, psk = sys.argv[1], sys.argv[2]
K = 4096
t = nbd.NBD()
t.set_tls(nbd.TLS_REQUIRE)
t.set_tls_psk_file(psk)
t.set_tls_username("alice")
t.connect_unix(sock)
secret = b"secret-behind-TLS" * (1 << 16)
t.pwrite(secret[:1 << 20], 0)
for i in range(16):
    assert t.pread(K, i * K) == secret[i * K:(i + 1) * K]
p = nbd.NBD()
p.set_tls(nbd.TLS_DISABLE)
p.connect_unix(sock)
got = p.pread(512, 0)
assert len(got) == 512 and b"secret" not in got, \
    "a plain client was served %r" % bytes(got[:24])
p.shutdown()
t.shutdown()
print("TLS and plain clients kept apart")
PYEOF
  start_server "$tmp/tls.sock" "$tmp/tls.pid" --tls=on \
    --tls-psk="$tmp/keys.psk" --filter="$FILTER" --filter=tls-fallback \
    --filter=delay memory 16M delay-read=2ms
  /usr/bin/python3 "$tmp/tls.py" "$tmp/tls.sock" "$tmp/keys.psk" ||
    fail "a plain client read what a TLS client's reads fetched"
  stop_servers
else
  without "TLS and plain clients" "no tls-fallback filter or no TLS in libnbd"
fi
