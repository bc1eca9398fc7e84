#!/usr/bin/env bash
# qemu-img convert to and from an export through the filter, then
# qemu-img compare against the source.
source "$srcdir/functions.sh"
requires qemu-img --version

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
