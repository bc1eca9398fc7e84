#!/usr/bin/env bash
# Staged data the plugin refuses outlives the connection that wrote
# it: the export's later connections read it, and their flushes retry
# it; only at server exit is it given up, with one error line and a
# failing exit status.  The error filter fails writes while
# $tmp/refuse exists.
source "$srcdir/functions.sh"
PROBE="$builddir/.libs/exit-probe.so"
[ -f "$PROBE" ] || { without "the exit probe" "not built"; PROBE=""; }
requires /usr/bin/python3 -c 'import nbd'

cat > "$tmp/kept.py" <<'PYEOF'
import nbd, os, sys, time
sock, disk, refuse, phase = sys.argv[1:5]
uri = "nbd+unix:///?socket=" + sock

def conn():
    h = nbd.NBD()
    h.connect_uri(uri)
    return h

def on_disk():
    with open(disk, "rb") as f:
        f.seek(1000)
        return f.read(4)

if phase == "names":                    # 50 names, each refused
    open(refuse, "w").close()
    for i in range(50):
        h = nbd.NBD()
        h.set_export_name("name%d\nFAKE line" % i)  # log lines escape it
        h.connect_unix(sock)
        h.pwrite(b"N" * 100, 4096 * i)
        h.shutdown()
    sys.exit(0)

if phase == "bound":                    # staging is bounded, not the pool
    open(refuse, "w").close()
    h = conn()
    acked = 0
    for i in range(20):                 # one 8M block each
        try:
            h.pwrite(b"B" * 4096, i * 8 * 1024 * 1024)
            acked += 1
        except nbd.Error:
            pass
    print("bound: %d of 20 writes acknowledged" % acked)
    assert acked == 8, "staging held %d 8M blocks, not 64M" % acked
    sys.exit(0)

a = conn()
a.pwrite(b"AAAA", 1000)                 # staged, acknowledged
open(refuse, "w").close()
try:
    a.flush()
    raise SystemExit("a flush hid a refused write-back")
except nbd.Error:
    pass
a.shutdown()
del a
if phase == "exit":                     # refused until the server exits
    sys.exit(0)
time.sleep(0.5)                         # the close has given up retrying
os.unlink(refuse)
b = conn()
assert on_disk() == bytes(4)
b.flush()                               # any connection's flush retries
assert on_disk() == b"AAAA", "the next flush did not write it back"
c = conn()
assert c.pread(4, 1000) == b"AAAA"
print("ok: kept and written back by a later connection")
PYEOF

run ()
{
  local phase=$1 rc=0 job
  shift
  rm -f "$tmp/sock" "$tmp/pid" "$tmp/refuse" "$tmp/probe" "$tmp/probe.stdio"
  truncate -s 0 "$tmp/disk"; truncate -s 160M "$tmp/disk"
  LD_PRELOAD="${LD_PRELOAD:-}${PROBE:+ $PROBE}" RESHAPE_EXIT_PROBE="$tmp/probe" \
  nbdkit -U "$tmp/sock" -P "$tmp/pid" -f --filter="$FILTER" --filter=error \
    file "$tmp/disk" error-pwrite=EIO error-pwrite-rate=100% \
    error-file="$tmp/refuse" reshape-writeback=true reshape-size=64K \
    "$@" 2> "$tmp/log" &
  job=$!
  wait_started "$tmp/sock" "$tmp/pid" > /dev/null
  /usr/bin/python3 "$tmp/kept.py" "$tmp/sock" "$tmp/disk" "$tmp/refuse" \
    "$phase" || { tail -5 "$tmp/log"; fail "$phase: see above"; }
  kill -TERM "$(cat "$tmp/pid")"
  wait "$job" || rc=$?
  echo "$phase: exit status $rc"
  echo "$rc" > "$tmp/rc"
}

# The plugin recovers: the data is readable, then written back.
run recover
[ "$(cat "$tmp/rc")" -eq 0 ] || fail "recovered, yet exit status non-zero"
! grep -q "lost" "$tmp/log" || fail "recovered, yet something was lost"

# The plugin never recovers: given up at exit, said once, status 1.
run exit
[ "$(cat "$tmp/rc")" -eq 1 ] ||
  fail "acknowledged data given up, yet exit status $(cat "$tmp/rc")"
# ... set once the rest of the process has finished its exit: an exit
# handler registered before main, a library destructor, a stdio stream.
if [ -n "$PROBE" ]; then
  [ "$(sort "$tmp/probe")" = "$(printf 'atexit\ndestructor')" ] &&
    [ "$(cat "$tmp/probe.stdio")" = stdio ] ||
    fail "the failing status cut the exit short: $(cat "$tmp/probe"*)"
fi
[ "$(grep -c "4 acknowledged bytes of 1 export ('') lost at server exit" \
     "$tmp/log")" -eq 1 ] || fail "no single error line: $(tail -5 "$tmp/log")"
# Many names: still one error line, for all of them.
run names
[ "$(cat "$tmp/rc")" -eq 1 ] || fail "names: exit status $(cat "$tmp/rc")"
[ "$(grep -c 'lost at server exit' "$tmp/log")" -eq 1 ] &&
  grep -q "5000 acknowledged bytes of 50 exports ('name[0-9]*\\\\x0aFAKE line' and others)" "$tmp/log" &&
  ! grep -q '^FAKE' "$tmp/log" ||
  fail "names: not one error line for 50 exports: $(grep lost "$tmp/log" | head -3)"
# A huge pool: what is staged and refused stays within 64M.
run bound reshape-pool=1T reshape-size=8M
[ "$(cat "$tmp/rc")" -eq 1 ] || fail "bound: exit status $(cat "$tmp/rc")"
grep -q "32768 acknowledged bytes of 1 export ('') lost" "$tmp/log" ||
  fail "bound: $(grep lost "$tmp/log" | head -3)"
echo "ok: refused data kept per export until exit"
