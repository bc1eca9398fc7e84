#!/usr/bin/env bash
# The readahead budget holds when the plugin fails: a fill that fails
# is charged for all it read (its read then goes down again), and an
# export whose fills keep failing backs off from filling.  Sequential
# 4K reads (256M), 32 in flight, over a 2 ms plugin behind nbdkit's error
# filter failing 10%, 30% and 50% of the plugin's reads; failed client
# reads are counted, not retried.  What the plugin read beyond the
# clients' reads stays within 5% of them plus 16M.  Every read that
# succeeds is checked (the pattern plugin).
source "$srcdir/functions.sh"
requires /usr/bin/python3 -c 'import nbd'


for rate in 10 30 50; do
  rm -f "$tmp/stats.json"
  nbdkit -U - --filter="$FILTER" --filter=error --filter=delay \
    pattern 1G delay-read=2ms error-pread=EIO error-pread-rate=$rate% \
    reshape-stats="$tmp/stats.json" \
    --run '/usr/bin/python3 -c "
import nbd, struct, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
n, failed = 65536, 0
def done(i, b, err):
    global failed
    if getattr(err, \"value\", err):
        failed += 1
        return 1
    off = i * 4096
    want = b\"\".join(struct.pack(\">Q\", off + k) for k in range(0, 4096, 8))
    assert b.to_bytearray() == want, \"wrong data at %d\" % off
    return 1
for i in range(n):
    while h.aio_in_flight() >= 32:
        h.poll(-1)
    b = nbd.Buffer(4096)
    h.aio_pread(b, i * 4096,
                completion=lambda err, i=i, b=b: done(i, b, err))
while h.aio_in_flight() > 0:
    h.poll(-1)
print(\"failed client reads: %d of %d\" % (failed, n))
" "$uri"' 2> "$tmp/err" || { tail -5 "$tmp/err"; fail "$rate%: the client failed"; }
  client=$(stat_of "$tmp/stats.json" ops.pread.client.bytes)
  plugin=$(stat_of "$tmp/stats.json" ops.pread.plugin.bytes)
  unasked=$(stat_of "$tmp/stats.json" unasked_bytes)
  bound=$((client / 20 + 16 * 1024 * 1024))
  echo "error rate $rate%: clients read $client, the plugin $plugin," \
       "unasked $unasked (at most $bound)"
  test "$unasked" -le "$bound" || fail "$rate%: $unasked unasked bytes"
done
