#!/usr/bin/env bash
# Every can_* flag, the size, read-only state and export list are
# passed through: nbdinfo sees the same with and without the filter,
# block sizes aside (the filter advertises its own), and can_cache
# with a read cache (reshape-readahead on: cache requests fill it).
source "$srcdir/functions.sh"
requires nbdinfo --version

# info [--filter...] PLUGIN ARGS: nbdinfo --json, block sizes dropped
info ()
{
  nbdkit -U - "$@" --run 'nbdinfo --json --list "$uri"' |
    /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin)
for e in d["exports"]:
    for k in list(e):
        if k.startswith("block_size") or k == "uri":
            del e[k]
print(json.dumps(d, sort_keys=True, indent=1))'
}

n=0
check ()
{
  info "$@" > "$tmp/plain"
  info --filter="$FILTER" "$@" reshape-readahead=off > "$tmp/reshaped"
  if ! cmp -s "$tmp/plain" "$tmp/reshaped"; then
    diff -u "$tmp/plain" "$tmp/reshaped" || :
    fail "flags differ for: $*"
  fi
  # With a read cache, every flag but can_cache as without the filter.
  info --filter="$FILTER" "$@" | sed 's/"can_cache": false/"can_cache": true/' \
    > "$tmp/cached"
  sed 's/"can_cache": false/"can_cache": true/' "$tmp/plain" > "$tmp/want"
  cmp -s "$tmp/want" "$tmp/cached" ||
    { diff -u "$tmp/want" "$tmp/cached" || :; fail "flags differ for: $*"; }
  n=$((n+1))
}

check memory 1M
check -r memory 1M
check null 1M
check pattern 1M
check sparse-random 1M
check --filter=nozero memory 1M
check --filter=nozero memory 1M zeromode=emulate
check --filter=nozero memory 1M zeromode=plugin fastzeromode=slow
check --filter=fua memory 1M fuamode=discard
check --filter=fua memory 1M fuamode=emulate
check --filter=fua memory 1M fuamode=native
check --filter=fua memory 1M fuamode=force
check --filter=noextents memory 1M
check --filter=multi-conn memory 1M multi-conn-mode=disable
check --filter=multi-conn memory 1M multi-conn-mode=plugin
if have_filter cacheextents; then
  check --filter=cacheextents memory 1M
else
  without "--filter=cacheextents" "nbdkit $(nbdkit --version | awk '{print $2}') has no such filter; removed in 1.45"
fi
check --filter=nocache memory 1M cachemode=none
check --filter=nocache memory 1M cachemode=emulate
check --filter=noparallel memory 1M
check --filter=fua --filter=nozero memory 1M fuamode=pass
echo "file plugin, several exports:"
mkdir "$tmp/dir"
truncate -s 1M "$tmp/dir/a"; truncate -s 3M "$tmp/dir/b"
check file dir="$tmp/dir"
echo "$n stacks compared"
# A plugin that cannot cache: with the filter's read cache, clients may
# send cache requests (they fill it).
info --filter="$FILTER" --filter=nocache memory 1M cachemode=none |
  grep -q '"can_cache": true' ||
  fail "no cache advertised with a read cache"
echo "ok: cache advertised with a read cache"
