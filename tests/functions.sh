# Shared by the tests.  Sourced with "source $srcdir/functions.sh".
# nbdsh and libnbd's Python module live in /usr/bin/python3: keep
# /usr/bin first so a python3 from elsewhere does not hide them.
export PATH="/usr/bin:/bin:$PATH"
set -e
set -u

: "${FILTER:?FILTER must name the built filter (run under make check)}"
test -f "$FILTER" || { echo "$0: $FILTER not built" >&2; exit 1; }

# requires CMD [ARGS]: skip the test (77) unless CMD runs.
requires ()
{
  if ! "$@" >/dev/null 2>&1; then
    echo "$0: '$*' failed: test skipped"
    exit 77
  fi
}

# A scratch directory removed at exit, plus extra cleanup hooks.
tmp=$(mktemp -d "${TMPDIR:-/tmp}/reshape-test.XXXXXX")
cleanup_hooks=""
cleanup ()
{
  local status=$?
  for h in $cleanup_hooks; do $h || :; done
  rm -rf "$tmp"
  exit $status
}
trap cleanup EXIT INT TERM
on_exit () { cleanup_hooks="$cleanup_hooks $1"; }

fail () { echo "$0: FAIL: $*" >&2; exit 1; }

# Run nbdkit with the in-tree filter first in the stack.
nbdkit_reshape () { nbdkit --filter="$FILTER" "$@"; }

# start_server SOCK PIDFILE ARGS...: a background nbdkit on a unix
# socket, stopped at exit.
start_server ()
{
  local sock=$1 pidfile=$2; shift 2
  nbdkit -U "$sock" -P "$pidfile" -f "$@" &
  local i
  for i in $(seq 1 100); do
    test -s "$pidfile" && test -S "$sock" && break
    sleep 0.1
  done
  test -s "$pidfile" || fail "nbdkit did not start: $*"
  server_pids="${server_pids:-} $(cat "$pidfile")"
  on_exit stop_servers
}
stop_servers ()
{
  local p
  for p in ${server_pids:-}; do
    kill "$p" 2>/dev/null || :
    while kill -0 "$p" 2>/dev/null; do sleep 0.1; done
  done
  server_pids=""
}
