#!/usr/bin/env bash
# Load and limits: 4 connections x 64 in flight of requests up to 32M
# (load-client.py).  nbdkit's peak resident memory with the filter
# (read-modify-write for a 4K-minimum plugin, write-back, readahead)
# stays within the same load without the filter plus the pool cap plus
# 64M; with the smallest pool the same load finishes (no deadlock).
source "$srcdir/functions.sh"
requires /usr/bin/python3 -c 'import nbd'
test -r /proc/self/status || { echo "no /proc: skipped"; exit 77; }
# Memory figures mean nothing under a sanitizer or valgrind.
if [ -n "${RESHAPE_CHECK:-}" ]; then echo "under $RESHAPE_CHECK: skipped"; exit 77; fi

seed=${RESHAPE_SEEDS:-$RANDOM}; seed=${seed%% *}
echo "seed: $seed"
policy="blocksize-minimum=4096 blocksize-error-policy=error"

# peak NAME NBDKIT-ARGS...: run the load, print nbdkit's peak RSS (kB).
peak ()
{
  local name=$1; shift
  start_server "$tmp/sock" "$tmp/pid" --threads=4 "$@"
  timeout 600 "$srcdir/load-client.py" "$seed" \
    "nbd+unix:///?socket=$tmp/sock" >&2 ||
    { stop_servers; fail "$name: load did not finish"; }
  awk '/^VmHWM/ {print $2}' "/proc/$(cat "$tmp/pid")/status"
  stop_servers
}

base=$(peak "no filter" null 1G)
pool_kb=$((64 * 1024))
with=$(peak "filter" --filter="$FILTER" --filter=blocksize-policy null 1G \
       $policy reshape-pool=64M reshape-writeback=true \
       reshape-stats="$tmp/stats.json")
echo "peak RSS: no filter ${base} kB, filter ${with} kB (pool cap ${pool_kb} kB)"
test "$with" -le $((base + pool_kb + 65536)) ||
  fail "peak RSS $with kB above $base + pool $pool_kb + 65536 kB"
grep -E '"(pool|read_modify|staged)' "$tmp/stats.json"

# The smallest pool: everything waits for buffers, nothing hangs.
small=$(peak "64K pool" --filter="$FILTER" --filter=blocksize-policy \
        null 1G $policy reshape-pool=64K reshape-size=16K \
        reshape-readahead=64K reshape-writeback=true)
echo "ok: 64K pool finished, peak RSS ${small} kB"
