#!/usr/bin/env bash
# reshape-profile=FILE is accepted and ignored, so that scripts that
# pass it keep working: with any value (a file, an unwritable path, a
# directory, empty) the server starts, says one warning line naming
# the parameter, reads and writes nothing there, and exits 0.
source "$srcdir/functions.sh"

mkdir "$tmp/dir"
printf 'not a profile\n' > "$tmp/kept"
for value in "$tmp/new" /proc/nonexistent/profile "$tmp/dir" "$tmp/kept" ""; do
  nbdkit -U - --filter="$FILTER" memory 1M reshape-profile="$value" \
    --run 'nbdsh -u "$uri" -c "h.pread(4096, 0)"' 2> "$tmp/err" ||
    fail "reshape-profile='$value': the server failed: $(cat "$tmp/err")"
  n=$(grep -c 'reshape-profile' "$tmp/err")
  test "$n" = 1 ||
    fail "reshape-profile='$value': $n lines name it, want 1: $(cat "$tmp/err")"
  grep 'reshape-profile' "$tmp/err" | grep -q 'warning' ||
    fail "reshape-profile='$value': not a warning: $(cat "$tmp/err")"
done
test ! -e "$tmp/new" || fail "reshape-profile wrote a file"
test -z "$(ls "$tmp/dir")" || fail "reshape-profile wrote into a directory"
test "$(cat "$tmp/kept")" = "not a profile" || fail "reshape-profile touched a file"
echo "reshape-profile: accepted with one warning, nothing written"
