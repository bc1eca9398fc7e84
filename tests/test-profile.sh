#!/usr/bin/env bash
# reshape-profile=FILE: what reshape-size=auto learnt, kept across
# restarts and told at once, but only to the same stack (the plugin's
# and lower filters' parameters), export name, size and block sizes:
#   - learnt by one run's stream, told at the next run's first
#     connection with no plugin read;
#   - not applied to another plugin of the same size;
#   - two servers sharing a file keep each other's entries;
#   - a symlink is kept and its target written;
#   - a directory or an unwritable path is refused at start-up;
#   - a corrupt line is skipped with a warning; a file that is not a
#     profile is never written.
source "$srcdir/functions.sh"
requires /usr/bin/python3 -c 'import nbd'
test -f "$MODEL" || { echo "model plugin not built"; exit 77; }
stream="/usr/bin/python3 $srcdir/stream-reads.py"
prof="$tmp/profile"
clusters="size=64M latency=100us cluster=2M decode=8ms decoders=1 prefault=true"

# told PLUGIN-ARGS...: the preferred size the first connection is told.
told ()
{
  nbdkit -U - --filter="$FILTER" "$@" --run '/usr/bin/python3 -c "
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
print(h.get_block_size(nbd.SIZE_PREFERRED))" "$uri"'
}

# Learnt once, told at once the next time, without a plugin read (the
# model's count of calls, written at exit, is a parameter of both runs:
# the stack must be the same).
calls="calls=$tmp/calls"
first=$(told "$MODEL" $clusters $calls reshape-profile="$prof")
nbdkit -U - --filter="$FILTER" "$MODEL" $clusters $calls \
  reshape-profile="$prof" --run "$stream \"\$uri\" 262144 16 >/dev/null"
head -1 "$prof" | grep -q '^nbdkit-reshape-filter profile 3$' ||
  fail "no profile written: $(cat "$prof")"
grep -q ' grain 2097152 ' "$prof" ||
  fail "2M not learnt: $(cat "$prof")"
rm -f "$tmp/calls"
p=$(told "$MODEL" $clusters $calls reshape-profile="$prof")
reads=$(awk '$1 == "reads" {print $2}' "$tmp/calls")
echo "first run told $first; the next run's first connection told $p," \
     "$reads plugin reads"
test "$reads" = 0 || fail "the next run read $reads times before telling"
# (told at least the grain: 8M when a call's fixed cost is large)
case "$p" in 2097152|4194304|8388608) ;; *) fail "profile: told $p" ;; esac

# Another plugin of the same size (other parameters): not applied.
p=$(told "$MODEL" size=64M latency=300ms $calls reshape-profile="$prof")
test "$p" = "$first" || fail "another plugin was told $p from the profile"
echo "another plugin of the same size: told $p, as if nothing was learnt"

# Two servers sharing the file: each learns its own, both kept.  (256M
# each: a loaded machine may need more than 64M to learn in.)
start_server "$tmp/a.sock" "$tmp/a.pid" --filter="$FILTER" "$MODEL" \
  $clusters $calls reshape-profile="$prof"
start_server "$tmp/b.sock" "$tmp/b.pid" --filter="$FILTER" "$MODEL" \
  size=256M latency=100us cluster=2M decode=6ms decoders=1 \
  prefault=true reshape-profile="$prof"
$stream "$tmp/a.sock" 262144 16 >/dev/null
$stream "$tmp/b.sock" 262144 16 >/dev/null
stop_servers
n=$(grep -c '^entry ' "$prof")
cat "$prof"
test "$n" = 2 || fail "two servers sharing a profile: $n entries, want 2"
test "$(cut -d' ' -f2 "$prof" | sort -u | grep -c .)" = 3 ||
  fail "two servers sharing a profile: one's entry lost"
echo "ok: two servers sharing the file kept both entries"

# Through a symlink (relative, to a file not made yet): the link is
# kept and its target written; then, the target there, read through it.
mkdir "$tmp/d"
ln -s d/real.profile "$tmp/plink"
nbdkit -U - --filter="$FILTER" "$MODEL" $clusters \
  reshape-profile="$tmp/plink" --run "$stream \"\$uri\" 262144 16 >/dev/null"
test -L "$tmp/plink" || fail "the profile's symlink was replaced by a file"
grep -q '^entry ' "$tmp/d/real.profile" ||
  fail "the symlink's target was not written: $(ls -l "$tmp" "$tmp/d")"
cp "$tmp/d/real.profile" "$tmp/before"
p=$(told "$MODEL" $clusters reshape-profile="$tmp/plink")
test "$p" != "$first" || fail "the profile was not read through its symlink"
test -L "$tmp/plink" || fail "the profile's symlink was replaced at last"
echo "ok: a symlinked profile is kept, its target written (told $p)"

# Refused at start-up: a directory, a path that cannot be written.
for bad in "$tmp" "$tmp/no/such/dir/profile"; do
  if nbdkit -U - --filter="$FILTER" memory 1M reshape-profile="$bad" \
       --run true 2> "$tmp/err"; then
    fail "reshape-profile=$bad was accepted"
  fi
  grep -q 'reshape-profile' "$tmp/err" || fail "no error for $bad"
  echo "refused: $(head -1 "$tmp/err")"
done

# A corrupt line: skipped with one warning, which does not read as an
# error (not again at the save at exit, which reads the file again),
# and left out of that save.
sed -i '2s/grain [0-9]*/grain banana/' "$prof"
nbdkit -U - --filter="$FILTER" "$MODEL" $clusters reshape-profile="$prof" \
  --run "$stream \"\$uri\" 262144 16 >/dev/null" 2> "$tmp/err"
cat "$tmp/err"
grep -q '^nbdkit: warning: reshape-profile: .* line 2 is corrupt' "$tmp/err" ||
  fail "corrupt profile: $(cat "$tmp/err")"
test "$(grep -c corrupt "$tmp/err")" = 1 ||
  fail "corrupt profile: told more than once: $(cat "$tmp/err")"
! grep -q 'error' "$tmp/err" || fail "a warning reads as an error"
! grep -q banana "$prof" || fail "the corrupt line was saved again"
echo "corrupt line: $(head -1 "$tmp/err")"

# Not a profile at all (a mistyped name): warned of, never written.
echo "precious data" > "$tmp/notaprofile"
nbdkit -U - --filter="$FILTER" "$MODEL" $clusters \
  reshape-profile="$tmp/notaprofile" \
  --run "$stream \"\$uri\" 262144 16 >/dev/null" 2> "$tmp/err"
grep -q 'is not a profile of this filter' "$tmp/err" ||
  fail "foreign file: $(cat "$tmp/err")"
test "$(cat "$tmp/notaprofile")" = "precious data" ||
  fail "a file that is not a profile was overwritten"
echo "ok: a file that is not a profile is left as it was"
