#!/usr/bin/env bash
# The filter loads by absolute path, describes itself, and serves data.
source "$srcdir/functions.sh"
requires nbdkit --version
requires nbdinfo --version

nbdkit_reshape null --help > "$tmp/help"
grep -q 'reshape-size=auto|<SIZE>' "$tmp/help" || fail "--help lacks reshape-size"
nbdkit_reshape null --dump-plugin > "$tmp/dump" ||
  fail "--dump-plugin through the filter"

nbdkit -U - --filter="$FILTER" pattern 1M \
  --run 'nbdinfo --size "$uri"' > "$tmp/size"
test "$(cat "$tmp/size")" = 1048576 || fail "size: $(cat "$tmp/size")"

# Data through the filter equals data without it.
nbdkit -U - pattern 3M --run 'nbdcopy "$uri" '"$tmp/plain"
nbdkit -U - --filter="$FILTER" pattern 3M \
  --run 'nbdcopy "$uri" '"$tmp/reshaped"
cmp "$tmp/plain" "$tmp/reshaped" || fail "pattern data differs"
