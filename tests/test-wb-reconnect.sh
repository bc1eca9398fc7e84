#!/usr/bin/env bash
# A client that writes (acknowledged, not flushed), drops the
# connection and reconnects at once reads what it wrote, even while
# the closing connection is still writing it back to a slow plugin
# without multi-conn (whose staged pages are each connection's own
# while it is open).
source "$srcdir/functions.sh"
requires /usr/bin/python3 -c 'import nbd'
have_filter delay && have_filter multi-conn ||
  { without "the whole test" "no delay or multi-conn filter"; exit 77; }

truncate -s 4M "$tmp/disk"
for round in 1 2 3; do
  n=$(nbdkit -U - --filter="$FILTER" --filter=multi-conn --filter=delay \
        file "$tmp/disk" multi-conn-mode=disable wdelay=20ms \
        reshape-writeback=true reshape-size=64K \
        --run "/usr/bin/python3 $srcdir/wb-blocks.py reconnect \"\$uri\" 32 r$round")
  echo "round $round: $n of 32 read back after reconnecting"
  [ "$n" = 32 ] || fail "round $round: $((32 - n)) of 32 read back stale"
done
echo "ok: a reconnecting client reads its writes"
