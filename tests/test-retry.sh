#!/usr/bin/env bash
# The stack for remote images that fail now and then (the man page's
# first example): nbdkit's retry-request filter below this one retries
# each plugin request that fails, alone.  Over a plugin that fails 10%
# of its reads (the error filter), qemu-img converts the whole image,
# byte for byte, through the default filter (read-ahead, grains,
# cuts); without the retry the same import fails, so errors did reach
# the stack.  (nbdkit's retry filter, also below, reopens the plugin
# instead: its own test suite covers it.)
source "$srcdir/functions.sh"
requires qemu-img --version
have_filter retry-request || { without "the stack" "no retry-request filter"; exit 77; }

size=128M
nbdkit -U - pattern $size --run 'qemu-img convert -f raw "$uri" -O raw '"$tmp/want" ||
  fail "no reference image"

# stack RETRY OUT: qemu-img convert through the filter over a plugin
# failing 10% of its reads, with retry-request below it if RETRY.
stack ()
{
  local retry="" params=""
  if [ "$1" = yes ]; then
    retry="--filter=retry-request"
    params="retry-request-retries=50 retry-request-delay=1"
  fi
  # shellcheck disable=SC2086
  nbdkit -U - --filter="$FILTER" $retry --filter=error --filter=delay \
    pattern $size delay-read=1ms error-pread=EIO error-pread-rate=10% $params \
    --run 'qemu-img convert -f raw "$uri" -O raw '"$2" 2> "$tmp/err"
}

stack yes "$tmp/got" || fail "the import failed with retry-request below: $(tail -3 "$tmp/err")"
injected=$(grep -c 'injecting EIO' "$tmp/err" || :)
echo "retry-request below: $injected reads failed and were retried"
[ "$injected" -gt 0 ] || fail "the error filter failed no read: nothing tested"
cmp "$tmp/want" "$tmp/got" || fail "the image differs"

if stack no "$tmp/got2"; then
  fail "without retry-request the import succeeded: the errors reached nothing"
fi
echo "ok: retried below the filter, the image is whole; without, the import fails"
