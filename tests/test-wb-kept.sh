#!/usr/bin/env bash
# Staged data never outlives its export name's last connection.  That
# close retries what the plugin refuses for 5 s: a plugin that recovers
# meanwhile gets it all, and the server exits 0; what is still refused
# then is given up there, in one error line naming the export and the
# bytes, and no later write of any name fails because of it.  The
# error filter fails writes while $tmp/refuse exists.
source "$srcdir/functions.sh"
requires /usr/bin/python3 -c 'import nbd'

cat > "$tmp/kept.py" <<'PYEOF'
import nbd, os, sys, threading, time
sock, disk, refuse, phase = sys.argv[1:5]

def conn(name=""):
    h = nbd.NBD()
    h.set_export_name(name)
    h.connect_unix(sock)
    return h

def on_disk():
    with open(disk, "rb") as f:
        f.seek(1000)
        return f.read(4)

def until(what, seconds):
    end = time.monotonic() + seconds
    while not what() and time.monotonic() < end:
        time.sleep(0.1)
    return what()

if phase == "names":                    # 50 names, each refused
    open(refuse, "w").close()
    for i in range(50):
        h = conn("name%d\nFAKE line" % i)   # log lines escape it
        h.pwrite(b"N" * 100, 4096 * i)
        del h                           # its close retries for 5 s
    sys.exit(0)

if phase == "flood":                    # 32 blocks, then every write refused
    h = conn()
    for i in range(32):
        h.pwrite(b"F" * 4096, i * 65536)
    open(refuse, "w").close()
    try:
        h.flush()
        raise SystemExit("a flush hid a refused write-back")
    except nbd.Error:
        pass
    h.shutdown()                        # retries for 5 s, then gives up
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
if phase == "recover":                  # within the close's 5 s
    threading.Timer(1, os.unlink, [refuse]).start()
a.shutdown()                            # the name's last connection
if phase == "recover":
    assert until(lambda: on_disk() == b"AAAA", 10), \
        "the closing connection did not write it back"
    print("ok: written back by the close once the plugin recovered")
    sys.exit(0)
# Never recovers: given up at the close, after 5 s (a.shutdown waits).
assert until(lambda: "lost at its last close" in open(sys.argv[5]).read(), 15), \
    "nothing given up at the last close"
os.unlink(refuse)
b = conn("other")                       # another name, same file
b.pwrite(b"BBBB", 1000)                 # no EIO for the given-up bytes
b.flush()
assert on_disk() == b"BBBB"
assert conn().pread(4, 1000) == b"BBBB"
print("ok: given up at the last close; another name writes there")
PYEOF

run ()
{
  local phase=$1 rc=0 job
  shift
  rm -f "$tmp/sock" "$tmp/pid" "$tmp/refuse"
  truncate -s 0 "$tmp/disk"; truncate -s 160M "$tmp/disk"
  nbdkit -U "$tmp/sock" -P "$tmp/pid" -f --filter="$FILTER" --filter=error \
    file "$tmp/disk" error-pwrite=EIO error-pwrite-rate=100% \
    error-file="$tmp/refuse" reshape-writeback=true reshape-size=64K \
    "$@" 2> "$tmp/log" &
  job=$!
  wait_started "$tmp/sock" "$tmp/pid" > /dev/null
  /usr/bin/python3 "$tmp/kept.py" "$tmp/sock" "$tmp/disk" "$tmp/refuse" \
    "$phase" "$tmp/log" || { tail -5 "$tmp/log"; fail "$phase: see above"; }
  sleep 1
  kill -TERM "$(cat "$tmp/pid")"
  wait "$job" || rc=$?
  echo "$phase: exit status $rc"
  [ "$rc" -eq 0 ] || fail "$phase: exit status $rc"
}

# D: the plugin recovers within the retry time: in the file, exit 0.
run recover
! grep -q "lost" "$tmp/log" || fail "recovered, yet something was lost"

# A: it never recovers: given up at the close, said once; another
# name's later write over those bytes succeeds.
run exit
[ "$(grep -c "4 acknowledged bytes of export '' lost at its last close" \
     "$tmp/log")" -eq 1 ] || fail "no single error line: $(tail -5 "$tmp/log")"
# Many names: one line each, names escaped.
run names
[ "$(grep -c 'lost at its last close' "$tmp/log")" -eq 50 ] &&
  grep -q "100 acknowledged bytes of export 'name7\\\\x0aFAKE line' lost" "$tmp/log" &&
  ! grep -q '^FAKE' "$tmp/log" ||
  fail "names: not one error line per name: $(grep lost "$tmp/log" | head -3)"
# A plugin that refuses everything: the close's 5 s of retries say so
# once, and what was lost once (the error filter's own lines aside).
run flood
lines=$(grep -c 'reshape' "$tmp/log" || :)
echo "flood: $lines lines of the filter's"
[ "$lines" -le 10 ] && [ "$(grep -c 'lost at its last close' "$tmp/log")" -eq 1 ] &&
  grep -q "131072 acknowledged bytes of export '' lost" "$tmp/log" ||
  fail "flood: $(grep reshape "$tmp/log" | sort | uniq -c | sort -rn | head -5)"
# A huge pool: what is staged and refused stays within 64M.
run bound reshape-pool=1T reshape-size=8M
grep -q "32768 acknowledged bytes of export '' lost" "$tmp/log" ||
  fail "bound: $(grep lost "$tmp/log" | head -3)"
echo "ok: refused data given up at each name's last close"
