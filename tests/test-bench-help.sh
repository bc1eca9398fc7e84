#!/usr/bin/env bash
# Every benchmark script (the executable files) answers --help with
# its usage and exits 0 without building, running or writing anything
# (Python runs with -B: its byte-code cache is the interpreter's, not
# the script's).
source "$srcdir/functions.sh"
requires /usr/bin/python3 --version
bench="$srcdir/../bench"
[ -d "$bench" ] || { without "bench/" "not in this tree"; exit 77; }

touch "$tmp/stamp"
sleep 1
n=0
for f in "$bench"/*.sh "$bench"/*.py; do
  [ -x "$f" ] || continue               # a module (cli.py), not a script
  case $f in
    *.sh) out=$(cd "$tmp" && bash "$f" --help) ;;
    *.py) out=$(cd "$tmp" && /usr/bin/python3 -B "$f" --help) ;;
  esac || fail "$f --help: exit $?"
  grep -qi "usage" <<< "$out" || fail "$f --help: no usage: $out"
  n=$((n + 1))
done
written=$(find "$bench" "$tmp" -newer "$tmp/stamp" -type f)
test -z "$written" || fail "--help wrote: $written"
echo "$n scripts answer --help"
