#!/usr/bin/env bash
# qemu-io through the filter over a plugin that needs 4K alignment:
# unaligned writes and reads, verified by qemu-io's pattern checks.
source "$srcdir/functions.sh"
requires qemu-io --version

nbdkit -U - --filter="$FILTER" --filter=blocksize-policy memory 4M \
  blocksize-minimum=4096 blocksize-error-policy=error \
  --run 'qemu-io -f raw "$uri" \
    -c "write -P 0x11 0 1M" \
    -c "write -P 0x22 513 1000" \
    -c "write -P 0x33 4000 200000" \
    -c "write -z 300000 5000" \
    -c "read -P 0x11 0 513" \
    -c "read -P 0x22 513 1000" \
    -c "read -P 0x11 1513 2487" \
    -c "read -P 0x33 4000 200000" \
    -c "read -P 0x11 204000 96000" \
    -c "read -P 0 300000 5000" \
    -c "read -P 0x11 305000 743576" \
    -c "flush"' > "$tmp/out" 2>&1 || { cat "$tmp/out"; fail "qemu-io"; }
cat "$tmp/out"
grep -q "Pattern verification failed" "$tmp/out" && fail "pattern mismatch"
test "$(grep -c '^read ' "$tmp/out")" = 7 || fail "not every read ran"
