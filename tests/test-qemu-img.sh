#!/usr/bin/env bash
# qemu-img convert to and from an export through the filter, then
# qemu-img compare against the source.
source "$srcdir/functions.sh"
requires qemu-img --version
requires python3 --version

nbdkit -U - sparse-random 32M seed=42 --run 'nbdcopy "$uri" '"$tmp/src"
truncate -s 32M "$tmp/dst"
nbdkit -U - --filter="$FILTER" --filter=blocksize-policy file "$tmp/dst" \
  blocksize-minimum=4096 blocksize-error-policy=error reshape-size=1M \
  --run 'qemu-img convert -n -f raw -O raw '"$tmp/src"' "$uri" &&
         qemu-img compare -f raw -F raw '"$tmp/src"' "$uri"'
cmp "$tmp/src" "$tmp/dst" || fail "destination differs"
nbdkit -U - --filter="$FILTER" file "$tmp/dst" reshape-size=64K \
  --run 'qemu-img convert -f raw -O raw "$uri" '"$tmp/back"
cmp "$tmp/src" "$tmp/back" || fail "copy back differs"
echo "ok: qemu-img convert both ways, compare identical"

# reshape-size=auto, a client that only writes, over a parallel plugin
# with latency: nothing is learnt, yet qemu-img's 2M writes are tried
# cut (every 4th at first: the measurement then decides).
head -c 64M /dev/urandom > "$tmp/src64"
nbdkit -U - --filter="$FILTER" "$MODEL" size=64M latency=1ms \
  reshape-stats="$tmp/stats.json" \
  --run 'qemu-img convert -n -f raw -O raw '"$tmp/src64"' "$uri" &&
         qemu-img compare -f raw -F raw '"$tmp/src64"' "$uri"' ||
  fail "convert to the model plugin"
pieces=$(python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))["ops"]["pwrite"]["plugin"]["sizes"]
print(sum(n for size, n in s.items() if int(size) < 2 << 20))' \
  "$tmp/stats.json")
echo "writes of 2M, no model: $pieces plugin writes below 2M"
test "$pieces" -gt 0 || fail "no 2M write was tried cut"
