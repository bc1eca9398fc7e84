#!/usr/bin/env bash
# Clients are told minimum 1, maximum 64M, and as preferred:
# reshape-size (as settled with the plugin's limits) when given; with
# reshape-size=auto (the default) the plugin's own preferred size if
# above 4K, else a guess, 2M, whatever earlier clients' reads measured
# (nothing is read at the handshake).
# Never more than the export.  nbdcopy and qemu-img listen.
source "$srcdir/functions.sh"
requires nbdinfo --version
requires nbdcopy --version

# sizes [FILTER-ARGS] PLUGIN ARGS -> "min pref max" as nbdinfo sees them
sizes ()
{
  nbdkit -U - "$@" --run 'nbdinfo --json "$uri"' |
    /usr/bin/python3 -c '
import json, sys
e = json.load(sys.stdin)["exports"][0]
# A plugin that says nothing: 0 0 0.
print(e.get("block_size_minimum", 0), e.get("block_size_preferred", 0),
      e.get("block_size_maximum", 0))'
}
expect ()
{
  local want=$1; shift
  local got
  got=$(sizes --filter="$FILTER" "$@")
  test "$got" = "$want" || fail "$*: block sizes '$got', want '$want'"
  echo "ok: $* -> $got"
}
policy="--filter=blocksize-policy"

# Nothing learnt yet: clients hear the guess, 2M (here the export's
# 1M), or the plugin's own preferred size if above 4K (nbdkit 1.38's
# memory plugin says 32K; 1.32's says nothing).
set -- $(sizes memory 1M)
echo "memory 1M without the filter: $*"
plain=$(( $2 > 4096 ? $2 : 1048576 ))
expect "1 $plain 67108864"   memory 1M
expect "1 $plain 67108864"   memory 1M reshape-size=auto
expect "1 1048576 67108864"  memory 1M reshape-size=1M
# The plugin's preferred size wins when larger ...
expect "1 2097152 67108864"  $policy memory 8M blocksize-preferred=2M
# ... a 4K minimum is hidden from clients, and 4K preferred is not
# above the guess.
expect "1 1048576 67108864"  $policy memory 1M blocksize-minimum=4096 \
                                      blocksize-preferred=4096
expect "1 2097152 67108864"  $policy memory 8M blocksize-minimum=4096 \
                                      blocksize-preferred=4096
# ... and a plugin's maximum caps the guess (memory's own preferred
# size, where it has one above 4K, is told instead).
capped=$(( $2 > 4096 ? $2 : 524288 ))
expect "1 $capped 67108864"  $policy memory 8M blocksize-maximum=512K
expect "1 65536 67108864"    $policy memory 1M blocksize-minimum=64K \
                                      blocksize-preferred=64K
# Never more than the export.
expect "1 2048 67108864"     memory 2K reshape-size=1M
expect "1 2048 67108864"     memory 2K

# After a client's stream of reads over a plugin without latency: the
# same as before it, the plugin's own preferred size or the guess, 2M
# (a cut makes it harmless).
cat > "$tmp/stream.py" <<'EOF'
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
for i in range(96):
    h.pread(65536, i * 65536)
EOF
learnt=$(nbdkit -U - --filter="$FILTER" memory 8M --run "
  /usr/bin/python3 $tmp/stream.py \"\$uri\" && nbdinfo --json \"\$uri\"" |
  /usr/bin/python3 -c 'import json, sys
print(json.load(sys.stdin)["exports"][0]["block_size_preferred"])')
want=$(( $2 > 4096 ? $2 : 2097152 ))
test "$learnt" = "$want" || fail "memory: told $learnt after a stream, want $want"
echo "ok: memory: told $want after a client's stream"
# The cap wins over the size, the plugin's cap over ours.
expect "1 65536 67108864"    memory 1M reshape-size=1M reshape-max=64K
expect "1 65536 67108864"    memory 1M reshape-size=1M reshape-max=96K
expect "1 131072 67108864"   $policy memory 1M blocksize-maximum=128K \
                                      reshape-size=1M
# A minimum above the size raises the size.
expect "1 65536 67108864"    $policy memory 1M blocksize-minimum=64K \
                                      blocksize-preferred=64K reshape-size=4K

# client_writes SIZE CLIENT-COMMAND: the sizes of the writes a client
# sends to an export whose reshape-size is SIZE (log filter above).
client_writes ()
{
  nbdkit -U - --filter=log --filter="$FILTER" memory 8M \
    logfile="$tmp/client.log" reshape-size="$1" --run "$2" >&2
  grep -o 'Write id=.* count=0x[0-9a-f]*' "$tmp/client.log" |
    sed 's/.*count=//' | sort -u
  rm -f "$tmp/client.log"
}
nbdkit -U - pattern 8M --run 'nbdcopy "$uri" '"$tmp/src"

# nbdcopy uses MAX(--request-size, preferred): 64K requests become 1M.
counts=$(client_writes 1M 'nbdcopy --request-size=65536 '"$tmp/src"' "$uri"')
test "$counts" = "0x100000" || fail "nbdcopy wrote sizes: $counts"
echo "ok: nbdcopy --request-size=65536 wrote 1M requests"

# qemu-img convert sizes its buffer from the destination's preferred size.
if qemu-img --version >/dev/null 2>&1; then
  counts=$(client_writes 4M 'qemu-img convert -n -f raw -O raw '"$tmp/src"' "$uri"')
  test "$counts" = "0x400000" || fail "qemu-img wrote sizes: $counts"
  echo "ok: qemu-img convert wrote 4M requests"
fi
