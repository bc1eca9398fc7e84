#!/usr/bin/env bash
# The manual page covers what the filter has: every parameter of
# --help with its default, every debug flag; docs/statistics.md every
# statistics counter and top-level JSON key; and the page keeps the
# length of nbdkit's own filter pages (at most 180 lines at 80
# columns: blocksize 138, cache 186).
source "$srcdir/functions.sh"
requires /usr/bin/python3 --version
pod="$srcdir/../docs/nbdkit-reshape-filter.pod"
[ -f "$pod" ] || { without "the manual page's source" "not in this tree"; exit 77; }

nbdkit --filter="$FILTER" null --help |
  sed -n 's/^\(reshape-[a-z]*\)=.*/\1/p' > "$tmp/params"
test "$(wc -l < "$tmp/params")" = 11 || fail "--help: $(cat "$tmp/params")"
while read -r p; do
  grep -q "^=item B<$p=" "$pod" || fail "$p: no =item in the manual page"
done < "$tmp/params"
# Each =item of a parameter says its default (pairs of =items share).
/usr/bin/python3 - "$pod" <<'PYEOF' || fail "a parameter without its default"
import re, sys
text = open(sys.argv[1]).read()
params = text.split("=head1 PARAMETERS")[1].split("=head1 ")[0]
for body in re.split(r"\n=item B<reshape-[a-z]+=>[^\n]*\n", params)[1:]:
    if body.strip() and "default" not in body.lower():
        sys.exit("no default: " + body.strip()[:60])
PYEOF

nbdkit -U - --filter="$FILTER" memory 1M reshape-stats="$tmp/s.json" \
  --run 'nbdinfo "$uri" >/dev/null' || fail "nbdkit failed"
/usr/bin/python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
print("\n".join(list(r) + list(r["counters"])))' "$tmp/s.json" > "$tmp/keys"
test "$(wc -l < "$tmp/keys")" -gt 30 || fail "keys: $(cat "$tmp/keys")"
schema="$srcdir/../docs/statistics.md"
while read -r k; do
  grep -q "\`$k\`" "$schema" || fail "statistics key $k not in docs/statistics.md"
done < "$tmp/keys"

for flag in $(sed -n 's/.*reshape_debug_\([a-z]*\).*/\1/p' \
                "$srcdir"/../filters/reshape/*.c | sort -u); do
  grep -q "^=item B<-D reshape\.$flag=" "$pod" ||
    fail "-D reshape.$flag not an item of the page"
done

if command -v man >/dev/null && [ -f "$builddir/../docs/nbdkit-reshape-filter.1" ]; then
  n=$(MANWIDTH=80 man "$builddir/../docs/nbdkit-reshape-filter.1" 2>/dev/null | wc -l)
  echo "rendered: $n lines"
  test "$n" -le 180 || fail "the manual page renders to $n lines (at most 180)"
fi
echo "ok: the manual page covers every parameter, key and flag"
