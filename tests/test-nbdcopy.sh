#!/usr/bin/env bash
# nbdcopy through the filter, several request sizes, data compared.
source "$srcdir/functions.sh"
requires nbdcopy --version

nbdkit -U - sparse-random 24M seed=7 --run 'nbdcopy "$uri" '"$tmp/src"
for rs in 4096 65536 1048576 33554432; do
  truncate -s 0 "$tmp/dst"; truncate -s 24M "$tmp/dst"
  nbdkit -U - --filter="$FILTER" --filter=blocksize-policy file "$tmp/dst" \
    blocksize-minimum=4096 blocksize-error-policy=error reshape-size=256K \
    --run "nbdcopy --request-size=$rs $tmp/src \$uri"
  cmp "$tmp/src" "$tmp/dst" || fail "nbdcopy --request-size=$rs: differs"
  nbdkit -U - --filter="$FILTER" file "$tmp/dst" \
    --run "nbdcopy --request-size=$rs \$uri $tmp/back"
  cmp "$tmp/src" "$tmp/back" || fail "nbdcopy back, --request-size=$rs"
  echo "ok: --request-size=$rs"
done
