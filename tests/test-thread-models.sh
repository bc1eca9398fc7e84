#!/usr/bin/env bash
# Plugins of every thread model: data correct with several connections.
source "$srcdir/functions.sh"
requires /usr/bin/python3 -c 'import nbd'

seed=${RESHAPE_SEEDS:-$RANDOM}; seed=${seed%% *}
echo "seed: $seed"
for mode in connections all-requests requests; do
  truncate -s 0 "$tmp/disk"; truncate -s 1M "$tmp/disk"
  nbdkit -U - --filter="$FILTER" --filter=noparallel file "$tmp/disk" \
    serialize=$mode reshape-min=4096 \
    --run "nbdinfo \$uri | grep -q can_multi && \
           $srcdir/random-io.py $seed \$uri 1048576 $tmp/model --ops 400 \
             --conns $( [ $mode = connections ] && echo 1 || echo 3 )"
  "$srcdir/compare-model.py" "$tmp/disk" "$tmp/model"
  echo "ok: serialize=$mode"
done
