#!/usr/bin/env bash
# Every bad parameter value is refused at start-up with exactly one
# error line, which names the parameter, the value given and what is
# accepted, and nbdkit exits non-zero.
source "$srcdir/functions.sh"
requires nbdkit --version

# bad KEY=VALUE EXPECTED-TEXT
bad ()
{
  local param=$1 want=$2 n
  if nbdkit_reshape null 1M "$param" --run true > "$tmp/out" 2>&1; then
    fail "$param was accepted"
  fi
  n=$(grep -c 'error' "$tmp/out")
  test "$n" = 1 || fail "$param: $n error lines: $(cat "$tmp/out")"
  grep -q -- "${param%%=*}" "$tmp/out" ||
    fail "$param: message does not name the parameter: $(cat "$tmp/out")"
  case $param in
    reshape-stats=/*|reshape-sise=*) ;;
    *) grep -qF -- "'${param#*=}'" "$tmp/out" ||
         fail "$param: message does not name the value: $(cat "$tmp/out")" ;;
  esac
  grep -q -- "$want" "$tmp/out" ||
    fail "$param: message lacks '$want': $(cat "$tmp/out")"
  echo "refused as expected: $param: $(cat "$tmp/out")"
}
good ()
{
  nbdkit_reshape null 1M "$@" --run true ||
    fail "valid parameters refused: $*"
}

bad reshape-size=3000        "power of 2 from 4K to 32M"
bad reshape-size=2K          "power of 2 from 4K to 32M"
bad reshape-size=64M         "power of 2 from 4K to 32M"
bad reshape-size=banana      "power of 2 from 4K to 32M"
bad reshape-size=-4096       "power of 2 from 4K to 32M"
bad reshape-min=3            "power of 2 from 1 to 64K"
bad reshape-min=128K         "power of 2 from 1 to 64K"
bad reshape-max=256          "from 512 to 4G-1"
bad reshape-max=4G           "from 512 to 4G-1"
bad reshape-max=1.5M         "from 512 to 4G-1"
bad reshape-maxdata=100      "from 512 to 4G-1"
bad reshape-maxlen=5G        "from 512 to 4G-1"
bad reshape-maxlen=big       "from 512 to 4G-1"
bad reshape-pool=1K          "from 64K to 1T"
bad reshape-sndbuf=1         "'off' or a size from 4K to 256M"
bad reshape-sndbuf=1G        "'off' or a size from 4K to 256M"
bad reshape-sndbuf=maybe     "'off' or a size from 4K to 256M"
bad reshape-stats=/nonexistent/dir/stats "cannot write"
bad reshape-parallel=0       "a number from 1 to 64"
bad reshape-parallel=65      "a number from 1 to 64"
bad reshape-parallel=1x      "accepted: a number from 1 to 64"
bad reshape-parallel=abc     "accepted: a number from 1 to 64"
bad reshape-parallel=4K      "accepted: a number from 1 to 64"
bad reshape-readahead=32K     "'off' or a size from 64K to 64M"
bad reshape-readahead=128M    "'off' or a size from 64K to 64M"
bad reshape-writeback=perhaps "accepted: true or false (also yes/no, on/off, 1/0, t/f, y/n)"
bad reshape-writeback=maybe   "accepted: true or false"
bad reshape-writeback=2       "accepted: true or false"
bad reshape-writeback=        "accepted: true or false"
bad reshape-sise=1M          "unknown parameter"
bad reshape-stats=           "the path of a file"
# 0 means the word only where there is one.
bad reshape-min=0            "power of 2 from 1 to 64K"
bad reshape-max=0            "from 512 to 4G-1"
bad reshape-pool=0           "from 64K to 1T"

good reshape-size=4K reshape-min=1 reshape-max=512 reshape-pool=64K
good reshape-size=32M reshape-min=64K reshape-max=4294967295
good reshape-sndbuf=off reshape-parallel=1
good reshape-parallel=64 reshape-readahead=off
good reshape-readahead=64K reshape-writeback=yes
good reshape-writeback=true
good reshape-writeback=false
good reshape-writeback=on
good reshape-writeback=No
good reshape-maxdata=32M reshape-maxlen=4294967295 reshape-pool=1t
good reshape-max=1M reshape-maxlen=64K reshape-size=2048s
good reshape-readahead=64M
good reshape-maxdata=+64K reshape-pool=+1M    # as nbdkit_parse_size
good reshape-sndbuf=0
# Booleans: every form nbdkit_parse_bool takes, in any case.
for b in true false TRUE yes no Y n on OFF 1 0 t F; do
  good reshape-writeback=$b
done
# Where a parameter takes a word (auto, off), a size of 0 means it.
good reshape-size=0
good reshape-readahead=0 reshape-sndbuf=0K
good reshape-sndbuf=2M reshape-stats="$tmp/stats"
test -s "$tmp/stats" || fail "reshape-stats file not written"

# Write-back over a read-only export: said once, not refused.
nbdkit_reshape -r memory 1M reshape-writeback=true \
  --run 'nbdinfo "$uri" >/dev/null && nbdinfo "$uri" >/dev/null' \
  2> "$tmp/out" || fail "-r with reshape-writeback=true refused"
test "$(grep -c 'reshape-writeback=true has no effect' "$tmp/out")" = 1 ||
  fail "-r with reshape-writeback=true: $(cat "$tmp/out")"

# refused EXPECTED ARGS...: nbdkit refuses ARGS with exactly one
# error line, which contains EXPECTED.
refused ()
{
  local want=$1 n
  shift
  if "$@" > "$tmp/out" 2>&1; then
    fail "accepted: $*"
  fi
  n=$(grep -c 'error' "$tmp/out") || :
  test "$n" = 1 || fail "$*: $n error lines: $(cat "$tmp/out")"
  grep -qF -- "$want" "$tmp/out" ||
    fail "$*: message lacks '$want': $(cat "$tmp/out")"
  echo "refused as expected: $*: $(cat "$tmp/out")"
}

# Both given and in conflict: refused at start-up (not at every
# connection), naming both parameters with their values as written.
refused "reshape-max=4K is below reshape-min=64K" \
  nbdkit_reshape null 1M reshape-max=4K reshape-min=64K --run true
refused "reshape-maxdata=4k is below reshape-min=65536" \
  nbdkit_reshape null 1M reshape-min=65536 reshape-maxdata=4k --run true
refused "reshape-maxlen=64s is below reshape-min=64K" \
  nbdkit_reshape null 1M reshape-min=4K reshape-maxlen=64s reshape-min=64K \
    --run true
good reshape-min=4K reshape-max=4K

# A cap below the plugin's own minimum refuses the connection with one
# line from nbdkit (nbdinfo asks twice: NBD_OPT_INFO, then _GO), naming
# the parameter as written and the plugin's number.
# conn_refused EXPECTED ARGS...
conn_refused ()
{
  local want=$1 n
  shift
  if nbdkit -U - --filter="$FILTER" "$@" --run 'nbdinfo "$uri"' \
       > "$tmp/out" 2>&1; then
    fail "accepted: $*"
  fi
  n=$(grep -c '^nbdkit: .*error' "$tmp/out") || :
  test "$n" = 1 || fail "$*: $n error lines: $(cat "$tmp/out")"
  grep -qF -- "$want" "$tmp/out" ||
    fail "$*: message lacks '$want': $(cat "$tmp/out")"
  echo "refused as expected: $*: $(grep '^nbdkit' "$tmp/out")"
}
policy="--filter=blocksize-policy memory 1M blocksize-minimum=4096"
below="is below the plugin's minimum block size (4096)"
conn_refused "reshape-max=1K $below" $policy reshape-max=1K
conn_refused "reshape-maxdata=2048 $below" $policy reshape-maxdata=2048
conn_refused "reshape-maxlen=1K $below" $policy reshape-maxlen=1K
# ... and a plugin maximum below reshape-min names both.
conn_refused "the plugin's maximum block size (32768) is below reshape-min=64K" \
  --filter=blocksize-policy memory 1M blocksize-maximum=32K reshape-min=64K

# --help: the descriptions in one column, every default given.
nbdkit --filter="$FILTER" null --help > "$tmp/help"
grep '^reshape-' "$tmp/help" > "$tmp/params"
test "$(wc -l < "$tmp/params")" = 11 || fail "$(cat "$tmp/help")"
cols=$(awk '{ match ($0, /^[^ ]+ +/); print RLENGTH }' "$tmp/params" |
       sort -u)
test "$cols" = 30 || fail "--help: ragged columns ($cols): $(cat "$tmp/params")"
if grep -v '(default: ' "$tmp/params"; then
  fail "--help: a parameter without its default"
fi

# Twice in one stack: refused with a clear message.
if nbdkit --filter="$FILTER" --filter="$FILTER" null 1M --run true \
     > "$tmp/out" 2>&1; then
  fail "the filter was accepted twice in one stack"
fi
grep -q "only once in a stack" "$tmp/out" || fail "$(cat "$tmp/out")"

# Mistakes that still serve: one warning line each, and the server runs.
# warned "TEXT" ARGS...
warned ()
{
  local want=$1; shift
  nbdkit -U - --filter="$FILTER" "$@" --run 'nbdinfo --size "$uri"' \
    > "$tmp/out" 2>&1 || fail "$*: refused: $(cat "$tmp/out")"
  test "$(grep -c "warning: .*$want" "$tmp/out")" = 1 ||
    fail "$*: not one warning '$want': $(cat "$tmp/out")"
  echo "warned as expected: $*"
}
warned "reshape-size=1M is above reshape-max=64K" memory 1M \
  reshape-size=1M reshape-max=64K
warned "bytes are less than one block of 4096" memory 1000 reshape-min=4K
warned "reshape-writeback=true has no effect" -r memory 1M \
  reshape-writeback=true
if have_filter blocksize; then
  warned "do not stack nbdkit's blocksize filter" --filter=blocksize \
    memory 1M minblock=4096
else
  without "the blocksize filter's warning" "no blocksize filter"
fi

# The report, written by rename at exit, would replace the plugin's
# own file: refused with one error naming both.
truncate -s 1M "$tmp/disk"
if nbdkit_reshape file "$tmp/disk" reshape-stats="$tmp/disk" --run true \
     > "$tmp/out" 2>&1; then
  fail "reshape-stats over the plugin's file= was accepted"
fi
test "$(grep -c error "$tmp/out")" = 1 &&
  grep -q "reshape-stats: '$tmp/disk' is the file that file= names" "$tmp/out" ||
  fail "reshape-stats over file=: $(cat "$tmp/out")"
test "$(stat -c %s "$tmp/disk")" = 1048576 || fail "the plugin's file changed"
echo "refused as expected: reshape-stats over the plugin's file"
