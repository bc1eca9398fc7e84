#!/usr/bin/env bash
# reshape-size=auto over a plugin too slow to hold the handshake for the
# probe (30 ms per request): the probe goes on beside the connections,
# reading through the first one's plugin context.
#   - the first connection is not held: told 1M (a 4K read took 30 ms,
#     and a 1M read no more than half as long again; 512K if that read
#     was late); connections made after the probe are told what it
#     found; data written and read before and
#     after the model came is right (8M reads before it are weighed
#     for cutting by the first reads' cost per call and per byte, and
#     some are cut), and so is a stream of 4K reads
#     after it, which grains fetched ahead serve.  Over the model
#     plugin (bench/model-plugin.c), and over the file plugin's dir=
#     mode, whose exports have names, under the delay filter;
#   - connections that arrive while the first read is timed go on with
#     it, and a probe still running when the connection ends stops
#     (3 s per request: the probe would take 20 s or more);
#   - a connection made while such a probe stops waits for it, then
#     probes for itself (2 s per request);
#   - a probe beside a client that keeps the plugin busy gives up (or,
#     if its reads happened to go first, measures) rather than learn a
#     shape from reads that waited in the client's queue.
# Under make check-helgrind and check-valgrind too: the probe's thread
# publishes the model while connections run.  (The checkers slow
# everything, so there only "told something" and no timing is checked.)
source "$srcdir/functions.sh"
requires /usr/bin/python3 -c 'import nbd'
test -f "$MODEL" || { echo "model plugin not built"; exit 77; }

least=$((512 << 10))
quick=yes
[ -z "${RESHAPE_CHECK:-}" ] || least=8192 quick=

cat > "$tmp/beside.py" <<'EOF'
import nbd, os, re, sys, time
uri, least, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
first = nbd.NBD()
first.connect_uri(uri)
told = first.get_block_size(nbd.SIZE_PREFERRED)
# What the 1M read gave (1M, unless it was slowed: under the checkers,
# or 11 ms late on a busy machine, 512K; 32 ms late, 256K), as logged.
hint = int(re.search(r"told (\d+)K meanwhile", open(log).read()).group(1))
assert told == hint << 10, "first connection told %d, logged %dK" % (told, hint)
assert 256 << 10 <= told <= 1 << 20, \
    "first connection told %d" % told
want = os.urandom(8 << 20)
first.pwrite(want, 0)
# Before the model, 8M reads are cut by the first reads' (every other
# one, to measure it) and whole.
for i in range(4):
    assert first.pread(8 << 20, 0) == want, "read %d before the model: wrong" % i
# A probe that gave up (the checkers may slow its reads as if the
# plugin were busy) is made again by a new connection, kept open: the
# probe reads through it.
deadline = time.monotonic() + 300
gave_up, kept = 0, []
while "probed beside the first" not in open(log).read():
    assert time.monotonic() < deadline, "the probe did not end in 300 s"
    n = open(log).read().count("tune: export '%s': not measured" %
                               uri.split("?")[0].split("/")[-1])
    if n > gave_up:
        gave_up = n
        kept.append(nbd.NBD())
        kept[-1].connect_uri(uri)
    time.sleep(0.2)
h = nbd.NBD()
h.connect_uri(uri)
told = h.get_block_size(nbd.SIZE_PREFERRED)
h.shutdown()
assert told >= least, "later connections told %d" % told
assert first.pread(8 << 20, 0) == want, "read after the model: wrong"

# A stream of 4K reads on the first connection, 64 in flight, is
# fetched by grains, ahead of it.
got = bytearray(8 << 20)
bufs = []
for off in range(0, 8 << 20, 4096):
    b = nbd.Buffer(4096)
    first.aio_pread(b, off)
    bufs.append((off, b))
    while first.aio_in_flight() >= 64:
        first.poll(-1)
while first.aio_in_flight() > 0:
    first.poll(-1)
for off, b in bufs:
    got[off:off + 4096] = b.to_bytearray()
assert got == want, "a stream of 4K reads after the model: wrong"
print("%s: first connection told %dK; later ones %d; data checked" %
      (uri.split("?")[0], hint, told))
EOF

# beside URI AHEAD nbdkit-words...: run beside.py, stderr (but debug
# output) checked;
# AHEAD=yes: its stream must have been fetched ahead (the model
# plugin's grain is smaller than the pool can lend; not under the
# checkers, which slow the probe's reads out of shape), and the 8M
# reads were weighed for cutting before the probe was over, by the
# first reads (the model plugin's 1M read costs a third more than its
# 4K read: a bandwidth to cut by), found worth trying, and one was cut
# (a second piece: -D reshape.split=1).
beside ()
{
  local uri=$1 ahead=$2 n early over gain cut; shift 2
  rm -f "$tmp/stats"
  nbdkit -U - --filter="$FILTER" -v -D reshape.tune=1 -D reshape.split=1 \
    "$@" \
    reshape-stats="$tmp/stats" \
    --run "/usr/bin/python3 $tmp/beside.py \"$uri\" $least $tmp/err" \
    2> "$tmp/err" ||
    { cat "$tmp/err"; fail "beside.py failed"; }
  grep 'reshape-size=auto' "$tmp/stats"
  grep -q 'probed beside the first' "$tmp/stats" ||
    fail "the probe did not go beside the first connection"
  ! grep -v 'debug: ' "$tmp/err" | grep -i 'error' || fail "errors logged"
  n=$(awk '/^grains fetched ahead/ {print $NF}' "$tmp/stats")
  echo "grains fetched ahead of the stream: $n"
  [ "$ahead" != yes ] || [ -n "${RESHAPE_CHECK:-}" ] || test "$n" -ge 1 ||
    fail "the 4K stream was not fetched ahead"
  [ "$ahead" = yes ] && [ -z "${RESHAPE_CHECK:-}" ] || return 0
  over=$(grep -n 'probed beside the first' "$tmp/err" | head -1 | cut -d: -f1)
  head -n "$over" "$tmp/err" > "$tmp/before"
  early=$(grep "tune: '[^']*' reads of 8192K: whole (the model" \
    "$tmp/before" | head -1)
  gain=$(echo "$early" | sed -n 's/.*the model: \([0-9.]*\)x faster.*/\1/p')
  cut=$(grep -c 'debug: reshape: piece [1-9]' "$tmp/before")
  echo "before the probe was over: 8M reads weighed: ${gain:-never}x; \
$cut second pieces or later"
  [ -n "$gain" ] || fail "8M reads were not weighed before the probe was over"
  awk -v g="$gain" 'BEGIN { exit !(g >= 1.25) }' ||
    fail "the first reads' model found no gain in cutting 8M reads"
  test "$cut" -ge 1 || fail "no 8M read was cut before the probe was over"
}
beside '$uri' yes "$MODEL" size=64M latency=30ms bandwidth=100M
mkdir "$tmp/dir"
truncate -s 64M "$tmp/dir/disk.img"
beside 'nbd+unix:///disk.img?socket=$unixsocket' no --filter=delay \
  file dir="$tmp/dir" delay-read=30ms

# 3 s per request: two connections at once are told 1M after the first
# reads (two of 4K and one of 1M, 3 s each), not after the probe; their
# end stops it.
cat > "$tmp/two.py" <<'EOF'
import nbd, sys, threading, time
res = []
def connect():
    start = time.monotonic()
    h = nbd.NBD()
    h.connect_uri(sys.argv[1])
    res.append((h.get_block_size(nbd.SIZE_PREFERRED),
                time.monotonic() - start))
    h.shutdown()
ts = [threading.Thread(target=connect) for _ in range(2)]
for t in ts: t.start()
for t in ts: t.join()
print("two connections at once: told, seconds:", res)
assert [r[0] for r in res] == [1 << 20] * 2, "not told 1M: %s" % res
if len(sys.argv) > 2:
    assert max(r[1] for r in res) < 14, "a handshake waited for the probe"
EOF
start=$(date +%s)
nbdkit -U - --filter="$FILTER" "$MODEL" size=64M latency=3s \
  --run "/usr/bin/python3 $tmp/two.py \$uri $quick" 2> "$tmp/err" ||
  { cat "$tmp/err"; fail "two.py failed"; }
took=$(( $(date +%s) - start ))
echo "3 s per request: nbdkit exited after $took s"
[ -z "$quick" ] || test "$took" -lt 20 ||
  fail "nbdkit waited for the probe ($took s)"

# 2 s per request: a first connection starts the probe (its handshake
# waits for three 2 s reads, then the probe goes beside) and ends; a
# connection made while that probe stops (its read in flight lasts up
# to 2 s) waits for it, then probes for itself, rather than keep the
# static sizes with no probe to come.  The second connects as soon as
# nbdkit logs that the probe stops; under the checkers, which may take
# longer than that read to get it through its handshake, only "it
# works" is checked.
cat > "$tmp/after.py" <<'EOF2'
import nbd, sys, threading, time
uri, log = sys.argv[1], sys.argv[2]
first = nbd.NBD()
first.connect_uri(uri)
ending = threading.Thread(target=first.shutdown)
ending.start()
deadline = time.monotonic() + 60
while "the probe stops" not in open(log).read():
    assert time.monotonic() < deadline, "the probe was never stopped"
    time.sleep(0.01)
h = nbd.NBD()
h.connect_uri(uri)
print("connection made as the first ended: told",
      h.get_block_size(nbd.SIZE_PREFERRED))
h.shutdown()
ending.join()
EOF2
nbdkit -U - --filter="$FILTER" -v -D reshape.tune=1 "$MODEL" size=64M \
  latency=2s --run "/usr/bin/python3 $tmp/after.py \$uri $tmp/err" \
  2> "$tmp/err" || { cat "$tmp/err"; fail "after.py failed"; }
grep 'tune:' "$tmp/err"
n=$(grep -c 'the probe goes on beside the connections' "$tmp/err")
[ -z "$quick" ] || test "$n" -eq 2 ||
  fail "the connection made as the first ended did not probe ($n probes)"

# A probe beside a busy client: over a plugin that decodes one 2M
# cluster at a time (20 ms), the first connection keeps 8 reads in
# flight, so that every probe read waits behind them.  Such reads say
# nothing of the plugin's shape (all look alike: "flat" up to 16M, and
# clients were told 8M for good): the probe gives up.  So does the
# probe of a second connection made while the first is still busy,
# whose first 4K reads wait too (judged by the first probe's fastest).
# (The model's decoder is not first come first served: a probe whose
# reads happened to go first may measure the plugin instead, and then
# there is no second probe.)  Nothing learnt, and no connection after
# them, is told more than 2M (what the plugin is; 1M while they probe
# again).
cat > "$tmp/busy.py" <<'EOF2'
import nbd, re, sys, threading, time
uri, log = sys.argv[1], sys.argv[2]
def ended():
    text = open(log).read()
    return text.count("tune: export '': not measured") + \
        text.count("tune: export '': cost flat")
h = nbd.NBD()
h.connect_uri(uri)
size = h.get_size()
stop = threading.Event()
bufs, n, failed = [], 0, []
def done(err):
    if err.value:
        failed.append("a read failed: errno %d" % err.value)
    return 1
def busy():
    global n
    off = 0
    try:
        while not stop.is_set():
            while h.aio_in_flight() < 8:
                b = nbd.Buffer(256 << 10)
                # Retired as it completes (1), its error noted;
                # the buffers kept in bufs stay valid.
                h.aio_pread(b, off, completion=done)
                n += 1
                if len(bufs) < 64:
                    bufs.append(b)
                off = (off + (256 << 10)) % size
            h.poll(-1)
        while h.aio_in_flight() > 0:
            h.poll(-1)
    except Exception as e:
        failed.append(e)
        stop.set()
def wait_ended(k):
    deadline = time.monotonic() + 120
    while ended() < k:
        assert time.monotonic() < deadline, "the probe never ended"
        assert not failed, "the busy client failed: %s" % failed
        time.sleep(0.05)
t = threading.Thread(target=busy)
t.start()
g = None
try:
    wait_ended(1)
    # A probe whose reads the decoder happened to take first may
    # measure the plugin: then there is no second probe to make.
    if "tune: export '': not measured" in open(log).read():
        g = nbd.NBD()
        g.connect_uri(uri)
        wait_ended(2)
finally:
    stop.set()
    t.join()
assert not failed, "the busy client: %s" % failed
assert all(b.to_bytearray() == bytes(256 << 10) for b in bufs), \
    "a read of the busy connection: wrong"
k = nbd.NBD()
k.connect_uri(uri)
told = k.get_block_size(nbd.SIZE_PREFERRED)
print("after %d probe(s) beside %d reads: told %d" %
      (2 if g else 1, n, told))
assert told <= 2 << 20, "told %d after a busy probe" % told
learnt = [int(x) for x in re.findall(r"clients told (\d+)K", open(log).read())]
assert all(x <= 2048 for x in learnt), "learnt to tell %sK" % learnt
k.shutdown()
if g:
    g.shutdown()
h.shutdown()
EOF2
nbdkit -U - --filter="$FILTER" -v -D reshape.tune=1 "$MODEL" size=64M \
  latency=100us cluster=2M decode=20ms decoders=1 \
  --run "/usr/bin/python3 $tmp/busy.py \$uri $tmp/err" \
  2> "$tmp/err" || { cat "$tmp/err"; fail "busy.py failed"; }
grep 'tune:' "$tmp/err"

# A probe read that does not return (a stalled backend): the first
# probe read, 4K at offset 0, waits on a FIFO, holding the first
# connection's handshake.  Another client, which never reads there,
# gets in after at most 10 s with the static sizes, and reads right;
# once the read returns, new connections go on too.  Not under the
# checkers: the server is stopped while the first connection may still
# be closing (its probe, told to stop, ends at its next read), and
# under helgrind that once failed the test without a report and once
# with one (before unload waited for such probes: probe_stop_all).
if [ -n "${RESHAPE_CHECK:-}" ]; then
  without "a stalled probe read" "under $RESHAPE_CHECK"
  exit 0
fi
/usr/bin/python3 -c 'import os, sys
open(sys.argv[1], "wb").write(os.urandom(4 << 20))' "$tmp/stall.data"
mkfifo "$tmp/stall"
# The stall happens once: released, the FIFO is gone.
release () { timeout 5 sh -c 'echo > "$1"' sh "$tmp/stall" || :; rm "$tmp/stall"; }
# stall_server: the server whose first probe read waits on the FIFO
# (and says so: $tmp/stalled).
stall_server ()
{
  start_server "$tmp/stall.sock" "$tmp/stall.pid" --filter="$FILTER" eval \
    thread_model='echo parallel' get_size='echo 4194304' \
    pread='if [ "$3" = 4096 ] && [ "$4" = 0 ] && [ -p "'"$tmp"'/stall" ]; then
  touch "'"$tmp"'/stalled"; cat "'"$tmp"'/stall" >/dev/null; fi
sleep 0.02; dd if="'"$tmp"'/stall.data" skip=$4 count=$3 iflag=skip_bytes,count_bytes status=none'
}
stall_server
# first_stalls SOCK: connect in a thread, return once the probe read of
# that connection's handshake waits on the FIFO.
cat > "$tmp/first.py" <<'PYEOF'
import nbd, os, sys, threading, time
def first_stalls(sock, marker):
    first = nbd.NBD()
    threading.Thread(target=first.connect_unix, args=(sock,),
                     daemon=True).start()
    end = time.monotonic() + 30
    while not os.path.exists(marker):
        assert time.monotonic() < end, "no probe read in 30 s"
        time.sleep(0.01)
    return first
PYEOF
cat > "$tmp/stall.py" <<'PYEOF'
import nbd, sys, time
from first import first_stalls
sock, data = sys.argv[1], open(sys.argv[2], "rb").read()
first = first_stalls(sock, sys.argv[3])  # its handshake waits on the probe
t0 = time.time()
h = nbd.NBD()
h.connect_unix(sock)
assert h.pread(65536, 1 << 20) == data[1 << 20:(1 << 20) + 65536], \
    "wrong data"
print("another client in after %.1f s, its read right" % (time.time() - t0))
PYEOF
PYTHONPATH=$tmp timeout 60 /usr/bin/python3 "$tmp/stall.py" \
  "$tmp/stall.sock" "$tmp/stall.data" "$tmp/stalled" || { release; fail "a stalled probe read kept clients out"; }
release
timeout 60 nbdsh -u "nbd+unix:///?socket=$tmp/stall.sock" \
  -c 'print("after the read returned: connected")' ||
  fail "no connection after the stalled read returned"
stop_servers

# The same stall, but the client whose handshake waits goes away and
# nbdkit is told to quit as soon as the read returns: that connection
# never closes (its handshake failed), so its probe is still reading
# when nbdkit unloads the plugin.  nbdkit must exit cleanly, not crash
# in the unloaded plugin (stop_servers fails on a signal).
rm -f "$tmp/stalled"; mkfifo "$tmp/stall"
stall_server
PYTHONPATH=$tmp timeout 60 /usr/bin/python3 -c 'import sys
from first import first_stalls
first_stalls(sys.argv[1], sys.argv[2])' "$tmp/stall.sock" "$tmp/stalled" ||
  fail "the first probe read never reached the plugin"
release
stop_servers
echo "stalled handshake, then quit: nbdkit exited cleanly"
