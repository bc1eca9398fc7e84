#!/usr/bin/env bash
# Write-back across export names: names may share storage (a plugin
# that ignores the name, as memory does), so nothing staged under one
# name may be written back over a later write under another.  And
# names may be different storage (file dir=): nothing staged under one
# name goes to another's storage.  (nbdkit 1.32 cannot open a context
# of another name for a plugin that asks for the name: there the
# later write fails, with an error, and the earlier one stays staged.)
# Over a plugin that serializes requests, no request of one name may
# use another name's connection: such a write fails with EIO, and the
# log says why.
source "$srcdir/functions.sh"
requires /usr/bin/python3 -c 'import nbd'

cat > "$tmp/names.py" <<'PYEOF'
import nbd, sys
sock, mode = sys.argv[1], sys.argv[2]

def conn(name):
    h = nbd.NBD()
    h.set_export_name(name)
    h.connect_unix(sock)
    return h

x, y = conn("x"), conn("y")
x.pwrite(b"AAAA", 1000)                  # staged under x
x.pwrite(b"aaaa", 70000)
if mode == "shared":
    assert y.pread(4, 1000) == bytes(4)  # x has not flushed: either
    y.pwrite(b"BBBB", 1000)              # later than x's write
    y.zero(4, 70000)                     # so is this
    y.flush()
    x.flush()
    z = conn("z")
    got = z.pread(4, 1000), z.pread(4, 70000)
    assert got == (b"BBBB", bytes(4)), \
        "an older write under x undid a later one under y: %r" % (got,)
elif mode == "serial":
    try:
        y.pwrite(b"BBBB", 1000)
        raise SystemExit("a write over x's staged bytes did not wait for them")
    except nbd.Error as e:
        assert "Input/output error" in e.string, e.string
    x.flush()
    y.pwrite(b"BBBB", 1000)              # x's bytes are in the plugin now
    y.flush()
    assert x.pread(4, 1000) == b"BBBB"
else:
    try:
        y.pwrite(b"BBBB", 1000)
        wrote = True
    except nbd.Error:
        wrote = False                    # refused: x's block unreachable
    assert x.pread(4, 1000) == b"AAAA", "x lost its write"
    assert x.pread(4, 70000) == b"aaaa", "x lost its write"
    x.flush()
    if not wrote:
        y.pwrite(b"BBBB", 1000)          # x's data is in x's file now
    y.flush()
    assert y.pread(4, 1000) == b"BBBB", "y lost its write"
print("ok:", mode)
PYEOF

start_server "$tmp/mem.sock" "$tmp/mem.pid" --filter="$FILTER" \
  memory 1M reshape-writeback=true reshape-size=64K
/usr/bin/python3 "$tmp/names.py" "$tmp/mem.sock" shared ||
  fail "one storage under two names: a staged write undid a later one"
stop_servers

if have_filter noparallel; then
  NAMES="$tmp/names.py" nbdkit -U - --filter="$FILTER" --filter=noparallel \
    memory 1M serialize=requests reshape-writeback=true reshape-size=64K \
    --run '/usr/bin/python3 "$NAMES" "$unixsocket" serial' \
    2> "$tmp/serial.err" || { cat "$tmp/serial.err"; fail "serialized plugin"; }
  grep -q "export 'x' is connected, but the plugin serializes requests" \
    "$tmp/serial.err" || fail "serialized plugin: no cause named: $(cat "$tmp/serial.err")"
else
  without "serialized plugin" "no noparallel filter"
fi

mkdir "$tmp/dir"
for n in x y; do truncate -s 1M "$tmp/dir/$n"; done
start_server "$tmp/dir.sock" "$tmp/dir.pid" --filter="$FILTER" \
  file dir="$tmp/dir" reshape-writeback=true reshape-size=64K
/usr/bin/python3 "$tmp/names.py" "$tmp/dir.sock" separate ||
  fail "separate storage under two names: a write went astray"
stop_servers
cmp -n 4 -i 1000:0 "$tmp/dir/x" <(printf AAAA) ||
  fail "x's staged write did not reach x's own file"
cmp -n 4 -i 1000:0 "$tmp/dir/y" <(printf BBBB) ||
  fail "y's write did not reach y's file"
cmp -n 4 -i 70000:0 "$tmp/dir/x" <(printf aaaa) ||
  fail "x's staged write did not reach x's own file (70000)"
cmp -n 4 -i 1000:0 "$tmp/dir/y" <(printf BBBB) ||
  fail "y's file was overwritten"
echo "ok: export names never undo each other's writes"
