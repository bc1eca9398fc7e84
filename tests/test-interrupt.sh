#!/usr/bin/env bash
# SIGTERM and client disconnects in the middle of heavy load, with
# write-back on: every write acknowledged to the client (staged or
# not) is in the backing file once nbdkit has exited.  And kill -9 of
# nbdkit loses no write acknowledged before an acknowledged flush.  No layer that
# sleeps sits beneath: nbdkit aborts sleeps at shutdown, and the man
# page says so under reshape-writeback.
source "$srcdir/functions.sh"
requires /usr/bin/python3 -c 'import nbd'

seed=${RESHAPE_SEEDS:-$RANDOM}; seed=${seed%% *}
echo "seed: $seed"
params="reshape-writeback=true reshape-size=64K"

# case NAME VICTIM: load, then after a second kill the client (-9)
# or nbdkit (TERM); then stop nbdkit and check the file.
run ()
{
  local name=$1 victim=$2 client
  echo "== $name"
  rm -f "$tmp/disk" "$tmp/log" "$tmp/sock" "$tmp/pid"
  truncate -s 1G "$tmp/disk"; : > "$tmp/log"
  nbdkit -U "$tmp/sock" -P "$tmp/pid" -f --filter="$FILTER" \
    file "$tmp/disk" $params &
  local job=$! rc=0
  local pid; pid=$(wait_started "$tmp/sock" "$tmp/pid") || exit 1
  "$srcdir/interrupt-client.py" "$seed" "nbd+unix:///?socket=$tmp/sock" \
    "$tmp/log" & client=$!
  # Under load: a second, and more than 50 writes acknowledged (a
  # loaded machine may need longer to get there).
  sleep 1
  for _ in $(seq 300); do
    [ "$(wc -l < "$tmp/log")" -gt 50 ] && break
    sleep 0.1
  done
  case $victim in
    client) kill -9 $client || :; sleep 0.5; kill "$pid" ;;
    nbdkit) kill "$pid" ;;
  esac
  wait $client 2>/dev/null || :
  wait $job || rc=$?
  ! died_of_signal "$rc" ||
    fail "$name: nbdkit died of a signal (status $rc)"
  test "$(wc -l < "$tmp/log")" -gt 50 ||
    fail "$name: too little load ($(wc -l < "$tmp/log") writes acknowledged)"
  "$srcdir/check-acked.py" "$tmp/disk" "$tmp/log" || fail "$name: seed $seed"
}

run "client killed under load" client
run "SIGTERM to nbdkit under load" nbdkit

# kill -9: small writes staged, a flush every 20; what was acknowledged
# before the last acknowledged flush is in the file.
cat > "$tmp/flusher.py" <<'PYEOF'
import sys, nbd
h = nbd.NBD(); h.connect_uri(sys.argv[1])
log = open(sys.argv[2], "a", buffering=1)
i = 0
try:
    while True:
        h.pwrite(bytes([i % 251 + 1]) * 1000, i * 4096 + 100)
        i += 1
        if i % 20 == 0:
            h.flush()
            log.write("%d\n" % i)
except nbd.Error:
    pass
PYEOF
rm -f "$tmp/disk" "$tmp/log" "$tmp/sock" "$tmp/pid"
truncate -s 64M "$tmp/disk"; : > "$tmp/log"
nbdkit -U "$tmp/sock" -P "$tmp/pid" -f --filter="$FILTER" \
  file "$tmp/disk" $params &
job=$!
pid=$(wait_started "$tmp/sock" "$tmp/pid") || exit 1
/usr/bin/python3 "$tmp/flusher.py" "nbd+unix:///?socket=$tmp/sock" "$tmp/log" &
client=$!
for _ in $(seq 300); do
  [ "$(wc -l < "$tmp/log")" -gt 20 ] && break
  sleep 0.1
done
kill -9 "$pid"
wait $job 2>/dev/null || :
wait $client 2>/dev/null || :
/usr/bin/python3 - "$tmp/disk" "$tmp/log" <<'PYEOF' || fail "kill -9: a flushed write is lost"
import sys
disk = open(sys.argv[1], "rb").read()
flushed = int(open(sys.argv[2]).read().split()[-1])
for i in range(flushed):
    if disk[i * 4096 + 100:i * 4096 + 1100] != bytes([i % 251 + 1]) * 1000:
        sys.exit("write %d, acknowledged before flush %d, is lost" % (i, flushed))
print("kill -9: the %d writes acknowledged before the last flush are in the file" % flushed)
PYEOF
