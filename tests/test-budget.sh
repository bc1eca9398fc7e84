#!/usr/bin/env bash
# The readahead budget is the process's: what the filter reads that no
# client reads stays within 5% of the clients' reads plus 16M, however
# the clients come (the memory plugin, 1 ms per read):
#   - 200 times in a row a connection that makes 8 sequential 4K reads
#     and closes (each export forgotten at its last close);
#   - 300 connections at once, each with an export name of its own,
#     each making 100 sequential 4K reads, one at a time.
# Counted from the statistics: plugin bytes beyond the clients' reads.
# Only upper bounds: a slow machine makes fewer windows, never more.
source "$srcdir/functions.sh"
requires /usr/bin/python3 -c 'import nbd'

# within NAME PYTHON: run PYTHON (argv[1]: the server's socket) and
# check the bound on what the plugin read.
within ()
{
  local name=$1 client plugin unasked bound
  echo "$2" > "$tmp/client.py"
  # -t 4: each client keeps one read in flight, and 300 connections of
  # nbdkit's 16 threads each would be 4800 threads.
  nbdkit -U - -t 4 --filter="$FILTER" --filter=delay memory 1G \
    delay-read=1ms reshape-stats="$tmp/stats.json" \
    --run "/usr/bin/python3 $tmp/client.py \"\$unixsocket\"" ||
    fail "$name: the client failed"
  client=$(stat_of "$tmp/stats.json" ops.pread.client.bytes)
  plugin=$(stat_of "$tmp/stats.json" ops.pread.plugin.bytes)
  unasked=$(stat_of "$tmp/stats.json" unasked_bytes)
  bound=$((client / 20 + 16 * 1024 * 1024))
  echo "$name: clients read $client, the plugin $plugin," \
       "unasked $unasked (at most $bound)"
  test "$unasked" -le "$bound" || fail "$name: $unasked unasked bytes"
}

within "200 connections in turn" '
import nbd, sys
for i in range(200):
    h = nbd.NBD()
    h.connect_unix(sys.argv[1])
    for j in range(8):
        h.pread(4096, i * 1048576 + j * 4096)
    h.shutdown()
    del h
'

within "300 export names at once" '
import nbd, sys
hs = []
for i in range(300):
    h = nbd.NBD()
    h.set_export_name("e%d" % i)
    h.connect_unix(sys.argv[1])
    hs.append(h)
bufs = [nbd.Buffer(4096) for h in hs]
for r in range(100):
    cs = [h.aio_pread(bufs[i], i * 1048576 + r * 4096)
          for i, h in enumerate(hs)]
    for h, c in zip(hs, cs):
        while not h.aio_command_completed(c):
            h.poll(-1)
'
