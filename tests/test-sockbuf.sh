#!/usr/bin/env bash
# reshape-sndbuf raises SO_SNDBUF of the accepted unix-socket client
# connection (-U and -s), and of nothing else: not the listening
# socket, not the plugin's own outbound connection.
source "$srcdir/functions.sh"
requires nbdsh --version
case "$(uname -s)" in Linux) ;; *) echo "Linux-only checks: skipped"; exit 77;; esac

# -U: the kernel's own view (ss) of nbdkit's connected socket.
sock="$tmp/sock"
start_server "$sock" "$tmp/pid" --filter="$FILTER" memory 1M \
  reshape-sndbuf=1M reshape-stats="$tmp/stats-U.json"
nbdsh -u "nbd+unix:///?socket=$sock" -c '
import subprocess
print(subprocess.run(["ss", "-x", "-a", "-m", "-p"], capture_output=True,
                     text=True).stdout)' > "$tmp/ss" 2>&1 || :
stop_servers
# One line per socket: ss may put skmem on a continuation line.
awk '/^u_/ { if (l) print l; l = $0; next } { l = l " " $0 } END { print l }' \
  "$tmp/ss" > "$tmp/ss1"
if grep -q skmem "$tmp/ss1"; then
  # Linux doubles the value set (socket(7)): 1M asked is tb2097152.
  grep "ESTAB.*$sock.*nbdkit" "$tmp/ss1" | grep -q 'tb2097152' ||
    { cat "$tmp/ss"; fail "nbdkit's client socket has no 1M send buffer"; }
  if grep "LISTEN.*$sock" "$tmp/ss1" | grep -q 'tb2097152'; then
    fail "the listening socket was changed"
  fi
  echo "ok: ss shows tb2097152 on the accepted connection only"
fi
test "$(stat_of "$tmp/stats-U.json" sockets_raised)" = 1 ||
  fail "-U: want 1 socket raised: $(cat "$tmp/stats-U.json")"
test "$(stat_of "$tmp/stats-U.json" socket_sndbuf_bytes)" -ge 1048576 ||
  fail "-U: obtained less than asked"

# -s: the socket that is stdin and stdout.
nbdsh -c '
h.connect_command(["bash", "-c", "nbdkit \"$@\"", "nbdkit", "-s", "--filter='"$FILTER"'", "memory", "1M",
                   "reshape-sndbuf=1M", "reshape-stats='"$tmp/stats-s.json"'"])
h.pwrite(b"x" * 100, 0)
assert h.pread(100, 0) == b"x" * 100
h.shutdown()'
# nbdkit writes the statistics as it exits, which may come just after
# nbdsh.
for _ in $(seq 100); do
  [ -s "$tmp/stats-s.json" ] && break
  sleep 0.1
done
test "$(stat_of "$tmp/stats-s.json" sockets_raised)" = 1 ||
  fail "-s: want 1 socket raised: $(cat "$tmp/stats-s.json")"
echo "ok: -s mode"

# The nbd plugin's outbound unix connection is not a client connection.
if have_plugin nbd; then
  start_server "$tmp/inner" "$tmp/inner.pid" memory 1M
  nbdkit -U - --filter="$FILTER" nbd socket="$tmp/inner" \
    reshape-sndbuf=1M reshape-stats="$tmp/stats-nbd.json" \
    --run 'nbdsh -u "$uri" -c "h.pwrite(b\"y\", 0)"'
  test "$(stat_of "$tmp/stats-nbd.json" sockets_raised)" = 1 ||
    fail "nbd plugin: want only the client raised: $(cat "$tmp/stats-nbd.json")"
  echo "ok: plugin's outbound socket untouched"
else
  without "the nbd plugin's outbound socket" "this nbdkit has no nbd plugin"
fi

# off: nothing raised.
nbdkit -U - --filter="$FILTER" memory 1M reshape-sndbuf=off \
  reshape-stats="$tmp/stats-off.json" --run 'nbdinfo "$uri" >/dev/null'
test "$(stat_of "$tmp/stats-off.json" sockets_raised)" = 0 ||
  fail "reshape-sndbuf=off raised a socket"
echo "ok: off"

# The default (2M on Linux) waits for the connection's first read reply
# of 256K or more: smaller replies fit the kernel's default buffer.
default_raised ()
{
  nbdkit -U - --filter="$FILTER" memory 1M reshape-stats="$tmp/stats-def.json" \
    --run 'nbdsh -u "$uri" -c "
for i in range(8):
    h.pread(4096, i * 4096)
'"$1"'"'
  stat_of "$tmp/stats-def.json" sockets_raised
}
test "$(default_raised '')" = 0 || fail "default: raised for 4K reads"
test "$(default_raised 'h.pread(256 << 10, 0)')" = 1 ||
  fail "default: not raised at a 256K read"
echo "ok: default raised at the first large read only"

# Without /proc the descriptors are found by trying each one.  Needs a
# private mount namespace (root): skipped quietly where unavailable.
if unshare --mount --propagation private true 2>/dev/null; then
  unshare --mount --propagation private sh -c '
    mount -t tmpfs none /proc || exit 0
    test -e /proc/self/fd && exit 1
    nbdkit -U "$1/np.sock" -P "$1/np.pid" -f --filter="$2" memory 1M \
      reshape-sndbuf=1M reshape-stats="$1/stats-noproc.json" &
    job=$!
    for i in $(seq 100); do
      test -S "$1/np.sock" && test -s "$1/np.pid" && break; sleep 0.1
    done
    test -s "$1/np.pid" || { echo "nbdkit did not start" >&2; exit 1; }
    nbdsh -u "nbd+unix:///?socket=$1/np.sock" -c "h.pwrite(b\"a\", 0)"
    kill $(cat "$1/np.pid")
    wait $job
  ' sh "$tmp" "$FILTER" || fail "no-/proc run failed"
  if [ -f "$tmp/stats-noproc.json" ]; then
    test "$(stat_of "$tmp/stats-noproc.json" sockets_raised)" = 1 ||
      fail "without /proc: want 1 socket raised"
    echo "ok: without /proc"
  fi
fi
