#!/usr/bin/env bash
# Merging (reshape-merge=true): bursts of 16 adjacent 4K writes and
# reads issued in shuffled order, so groups form, meet and absorb each
# other.  Every read must return its own bytes, the backing file must
# hold every write, and the filter must have merged.  Random (seed
# printed, RESHAPE_SEEDS=N replays).
source "$srcdir/functions.sh"
requires /usr/bin/python3 -c 'import nbd'

seed=${RESHAPE_SEEDS:-$RANDOM}
seed=${seed%% *}
echo "seed: $seed"
truncate -s 4M "$tmp/disk"
nbdkit -U - --filter="$FILTER" --filter=delay file "$tmp/disk" \
  delay-read=1ms delay-write=1ms reshape-merge=true reshape-size=64K \
  reshape-stats="$tmp/stats" \
  --run '/usr/bin/python3 -c "
import nbd, random, sys
rng = random.Random(int(sys.argv[2]))
h = nbd.NBD(); h.connect_uri(sys.argv[1])
model = bytearray(4 << 20)
def burst(base, write):
    order = list(range(16)); rng.shuffle(order)
    bufs = {}
    for i in order:
        off = base + i * 4096
        if write:
            data = bytes([rng.randrange(256)]) * 4096
            model[off:off + 4096] = data
            h.aio_pwrite(data, off)
        else:
            bufs[off] = nbd.Buffer(4096)
            h.aio_pread(bufs[off], off)
    while h.aio_in_flight() > 0:
        h.poll(-1)
    for off, b in bufs.items():
        assert b.to_bytearray() == model[off:off + 4096], \
            \"read at %d returned other data\" % off
for r in range(64):
    base = rng.randrange(0, (4 << 20) - 65536, 4096)
    burst(base, True)
    burst(base, False)
h.flush()
open(sys.argv[3], \"wb\").write(model)
print(\"bursts checked\")
" "$uri" '"$seed $tmp/model" || fail "seed $seed"
cmp "$tmp/disk" "$tmp/model" || fail "seed $seed: backing file differs"
merges=$(awk '/^requests merged/ {print $NF}' "$tmp/stats")
echo "requests merged: $merges"
test "$merges" -gt 512 || fail "seed $seed: only $merges requests merged"

# Regressions (review): a merged group must not carry one member's
# trouble to another.  Connection X keeps two writes at a slow plugin,
# so that its third waits as a group leader; Y's adjacent write joins.
# The interleaving is made with short sleeps, which do not hold under
# valgrind or the sanitizers: there these cases are left out.
if [ -n "${RESHAPE_CHECK:-}" ]; then
  echo "isolation cases skipped under $RESHAPE_CHECK"
  exit 0
fi
cat > "$tmp/isolation.py" <<'PY'
import nbd, os, signal, sys, time
case, uri, disk = sys.argv[1], sys.argv[2], sys.argv[3]
K, M = 4096, 1 << 20
def leader(X, a, b, c):            # a, b at the plugin, c waits
    for off in (a, b, c):
        X.aio_pwrite(b"\1" * K, off); time.sleep(0.05)
if case == "grow":                      # X and Y see other sizes
    X = nbd.NBD(); X.connect_uri(uri)
    os.truncate(disk, 2 * M)
    Y = nbd.NBD(); Y.connect_uri(uri)
    leader(X, M - 4 * K, M - 8 * K, M - K)   # X's leader ends at X's end
    Y.pwrite(b"\2" * K, M)              # beyond X's size
    while X.aio_in_flight(): X.poll(-1)
elif case == "poison":                  # X's range is refused
    X = nbd.NBD(); X.connect_uri(uri)
    Y = nbd.NBD(); Y.connect_uri(uri)
    leader(X, 0, 10 * K, 2 * K)
    Y.pwrite(b"\2" * K, 3 * K)          # must not inherit X's EPERM
    while X.aio_in_flight():
        try: X.poll(-1)
        except nbd.Error: pass
elif case == "kill":                    # X's client dies
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        X = nbd.NBD(); X.connect_uri(uri)
        leader(X, 0, 10 * K, 2 * K); os.write(w, b"x")
        while X.aio_in_flight() > 1: X.poll(-1)
        os.write(w, b"y"); time.sleep(100)
    os.read(r, 1)
    Y = nbd.NBD(); Y.connect_uri(uri)
    c = Y.aio_pwrite(b"\2" * K, 3 * K)
    # Kill X once its two first writes are done (X says so) and the
    # merged one is at the plugin: X then has one reply outstanding,
    # not several (nbdkit 1.32 asserts when two replies race to a dead
    # socket).  Killed that late, the case no longer fails the old
    # merging; the retry it needs is the one the poison case proves.
    os.read(r, 1); time.sleep(0.1)
    os.kill(pid, signal.SIGKILL); os.waitpid(pid, 0)
    while Y.aio_in_flight(): Y.poll(-1)
    Y.aio_command_completed(c)          # raises if it failed
print(case, "ok")
PY
slow="delay-write=500ms reshape-merge=true reshape-size=64K"
truncate -s 1M "$tmp/grow"
nbdkit -U - --filter="$FILTER" --filter=delay file "$tmp/grow" $slow \
  --run "/usr/bin/python3 $tmp/isolation.py grow \$uri $tmp/grow" ||
  fail "a write joined a group of a connection with another export size"
nbdkit -U - --filter="$FILTER" --filter=delay --filter=protect memory 1M \
  protect=8192-12287 $slow \
  --run "/usr/bin/python3 $tmp/isolation.py poison \$uri -" ||
  fail "a member inherited another member's error"
nbdkit -U - --filter="$FILTER" --filter=delay memory 1M $slow \
  --run "/usr/bin/python3 $tmp/isolation.py kill \$uri -" ||
  fail "a member failed because the leader's connection closed"
