#!/usr/bin/env bash
# Every number that decides something lives in tunables.h, and
# docs/design.md's Thresholds table names each of them, and nothing
# else: the table cannot drift from the code.
source "$srcdir/functions.sh"

h="$srcdir/../filters/reshape/tunables.h"
doc="$srcdir/../docs/design.md"
[ -f "$doc" ] || { without docs/design.md "not in this tree"; exit 77; }

defined=$(sed -n 's/^#define \([A-Z][A-Z0-9_]*\).*/\1/p' "$h" |
            grep -v '^NBDKIT_RESHAPE_' | sort -u)
listed=$(sed -n '/^## Thresholds/,/^## /p' "$doc" |
           awk -F'|' '/^\| [A-Z]/ { print $2 }' |
           tr ',' '\n' | tr -d ' ' | grep . | sort -u)
missing=$(comm -23 <(echo "$defined") <(echo "$listed"))
extra=$(comm -13 <(echo "$defined") <(echo "$listed"))
[ -z "$missing" ] || fail "tunables.h defines, design.md does not list:" $missing
[ -z "$extra" ] || fail "design.md lists, tunables.h does not define:" $extra

echo "$(echo "$defined" | wc -l) numbers, each in design.md"
