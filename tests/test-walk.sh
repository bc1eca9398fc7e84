#!/usr/bin/env bash
# The range walker's invariants (tests/walk-fuzz.c): 300000 random
# requests always, and a short libFuzzer run when it was built.
source "$srcdir/functions.sh"

seed=${RESHAPE_SEEDS:-$RANDOM}
seed=${seed%% *}
"$builddir/walk-check" "$seed" 300000
if [ -x "$builddir/walk-fuzz" ]; then
  mkdir "$tmp/corpus"
  "$builddir/walk-fuzz" -max_total_time=15 -seed="$seed" \
    -artifact_prefix="$tmp/" "$tmp/corpus" \
    > "$tmp/fuzz.log" 2>&1 || { tail -30 "$tmp/fuzz.log"; fail "walk-fuzz"; }
  tail -1 "$tmp/fuzz.log"
else
  echo "libFuzzer not available: fuzz run skipped"
fi
