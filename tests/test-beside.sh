#!/usr/bin/env bash
# reshape-size=auto over a plugin too slow to hold the handshake for the
# probe (30 ms per request; model plugin, bench/model-plugin.c): the
# probe goes on beside the connections, through a context of its own.
#   - the first connection is not held: told 4K (nothing), as without
#     the filter; connections made after the probe are told what it
#     found; data written and read before and after the model came is
#     right;
#   - nbdkit exits at once with a probe still running (1 s per
#     request: the probe would take 15 s or more).
# Under make check-helgrind and check-valgrind too: the probe's thread
# publishes the model while connections run.  (The checkers slow
# everything, so there only "told something" and no timing is checked.)
source "$srcdir/functions.sh"
requires /usr/bin/python3 -c 'import nbd'
requires nbdinfo --version
test -f "$MODEL" || { echo "model plugin not built"; exit 77; }

least=$((512 << 10))
[ -z "${RESHAPE_CHECK:-}" ] || least=8192

cat > "$tmp/beside.py" <<'EOF'
import nbd, os, sys, time
least = int(sys.argv[2])
first = nbd.NBD()
first.connect_uri(sys.argv[1])
told = first.get_block_size(nbd.SIZE_PREFERRED)
assert told == 4096, "first connection told %d: held for the probe" % told
want = os.urandom(8 << 20)
first.pwrite(want, 0)
assert first.pread(8 << 20, 0) == want, "read before the model: wrong"
deadline = time.monotonic() + 300
while True:
    h = nbd.NBD()
    h.connect_uri(sys.argv[1])
    told = h.get_block_size(nbd.SIZE_PREFERRED)
    h.shutdown()
    if told != 4096 or time.monotonic() > deadline:
        break
    time.sleep(0.2)
assert told >= least, "later connections told %d" % told
assert first.pread(8 << 20, 0) == want, "read after the model: wrong"
print("first connection told 4096; later ones %d; data checked" % told)
EOF
nbdkit -U - --filter="$FILTER" "$MODEL" size=64M latency=30ms \
  bandwidth=100M reshape-stats="$tmp/stats" \
  --run "/usr/bin/python3 $tmp/beside.py \$uri $least"
grep 'reshape-size=auto' "$tmp/stats"
grep -q 'probed beside the first' "$tmp/stats" ||
  fail "the probe did not go beside the first connection"

start=$(date +%s)
nbdkit -U - --filter="$FILTER" "$MODEL" size=64M latency=1s \
  --run 'nbdinfo "$uri" >/dev/null' 2>/dev/null
took=$(( $(date +%s) - start ))
echo "1 s per request: nbdkit exited after $took s"
[ -n "${RESHAPE_CHECK:-}" ] || test "$took" -lt 8 ||
  fail "nbdkit waited for the probe ($took s)"
