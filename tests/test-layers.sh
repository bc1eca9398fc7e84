#!/usr/bin/env bash
# The filter's layers, defined here (HACKING's Layout shows them).  A
# file may include the headers of lower layers and its own, and
# (checked on the built objects with nm) call functions of lower
# layers and its own file: never up, never sideways.  So no two files
# call each other's functions, and a newcomer can read the filter from
# the bottom up.  (A higher layer may hand a lower one a callback: a
# pointer, which nm does not show and which is not a call by name.)
#
#   0  common tunables: arithmetic, scoped locks, the   } pure: no
#      clock; the numbers                                } nbdkit
#   1  walk ranges warn                                  }
#   2  stats params
#   3  pool helpers sockbuf auto
#   4  split
#   5  readahead
#   6  writeback
#   7  reshape (the nbdkit callbacks, the order of the stages, the
#      registry of exports)
source "$srcdir/functions.sh"
requires nm --version

layers="
0 common tunables
1 walk ranges warn
2 stats params
3 pool helpers sockbuf auto
4 split
5 readahead
6 writeback
7 reshape
"
src="$srcdir/../filters/reshape"
objs="$builddir/../filters/reshape/.libs"

layer_of ()
{
  awk -v m="$1" '{ for (i = 2; i <= NF; i++) if ($i == m) print $1 }' \
    <<< "$layers"
}
modules=$(awk 'NF { for (i = 2; i <= NF; i++) print $i }' <<< "$layers")

bad=0
# Every source file belongs to a listed module.
for f in "$src"/*.[ch]; do
  m=$(basename "$f"); m=${m%.?}
  [ -n "$(layer_of "$m")" ] ||
    { echo "$f: module $m has no layer in tests/test-layers.sh"; bad=1; }
done

# Includes go down.
for f in "$src"/*.[ch]; do
  m=$(basename "$f"); m=${m%.?}
  l=$(layer_of "$m")
  for inc in $(sed -n 's/^#include "\([a-z_]*\)\.h"$/\1/p' "$f"); do
    [ "$inc" = "$m" ] && continue
    il=$(layer_of "$inc")
    if [ -z "$il" ]; then
      echo "$f includes $inc.h, which is no module"; bad=1
    elif [ "$il" -ge "$l" ]; then
      echo "$f (layer $l) includes $inc.h (layer $il)"; bad=1
    fi
  done
done

# Calls go down: every function a file uses from another file is
# defined in a lower layer.
for m in $modules; do
  [ -f "$src/$m.c" ] || continue
  o="$objs/nbdkit_reshape_filter_la-$m.o"
  test -f "$o" || fail "$o not built"
  nm -g --defined-only "$o" | awk '$2 ~ /[TDBR]/ { print $3 }' |
    sed "s/\$/ $m/" >> "$tmp/defs"
done
for m in $modules; do
  [ -f "$src/$m.c" ] || continue
  l=$(layer_of "$m")
  for sym in $(nm -u "$objs/nbdkit_reshape_filter_la-$m.o" |
               awk '{ print $2 }'); do
    def=$(awk -v s="$sym" '$1 == s { print $2 }' "$tmp/defs")
    [ -n "$def" ] || continue           # libc, pthread, nbdkit
    dl=$(layer_of "$def")
    if [ "$dl" -ge "$l" ]; then
      echo "$m.c (layer $l) calls $sym of $def.c (layer $dl)"; bad=1
    fi
  done
done

# HACKING's Layout shows the same layers: "layer N  file.c" starts a
# layer, "   file.c" continues it.
hacking=$(awk '
  /^    layer [0-9]+  [a-z_]+\.[ch] / { l = $2; print l, $3; next }
  /^          [0-9]  [a-z_]+\.[ch] /  { l = $1; print l, $2; next }
  /^             [a-z_]+\.[ch] /       { print l, $1 }
' "$srcdir/../HACKING" | sed 's/\.[ch]$//' | sort)
listed=$(awk 'NF { for (i = 2; i <= NF; i++) print $1, $i }' <<< "$layers" |
         sort)
[ "$hacking" = "$listed" ] || {
  diff <(echo "$listed") <(echo "$hacking") | sed 's/^/HACKING: /'
  bad=1
}

[ "$bad" = 0 ] || fail "the layering is broken (see above)"
echo "ok: $(wc -w <<< "$modules") modules, includes and calls only go down"
