#!/usr/bin/env bash
# A read-only export stays read-only through the filter: reads work and
# match, writes are refused.
source "$srcdir/functions.sh"
requires nbdsh --version

nbdkit -U - pattern 1M --run 'nbdcopy "$uri" '"$tmp/want"
nbdkit -r -U - --filter="$FILTER" pattern 1M \
  --run 'nbdsh -u "$uri" -c "
assert h.is_read_only()
h.set_strict_mode(0)    # send the writes: the server must refuse
want = open(\"'"$tmp/want"'\", \"rb\").read()
assert h.pread(10000, 12345) == want[12345:22345]
for f in (lambda: h.pwrite(b\"x\", 0), lambda: h.zero(10, 0),
          lambda: h.trim(10, 0)):
    try:
        f()
        raise SystemExit(\"a write was accepted on a read-only export\")
    except nbd.Error as e:
        print(\"refused:\", e.string)
"'
