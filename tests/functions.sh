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
  if [ -n "${RESHAPE_CHECK:-}" ] && ! check_reports; then
    status=1
  fi
  rm -rf "$tmp"
  exit $status
}
trap cleanup EXIT INT TERM
on_exit () { cleanup_hooks="$cleanup_hooks $1"; }

fail () { echo "$0: FAIL: $*" >&2; exit 1; }

# RESHAPE_CHECK (set by make): run every nbdkit of the tests under a
# checker.  The --run command gets a clean environment, so only nbdkit
# is checked.  Reports go to $tmp and any error fails the test at exit.
#   sanitizers  the ASan runtime preloaded (--enable-sanitizers builds)
#   memcheck, helgrind, drd   valgrind tools (make check-valgrind,
#               check-helgrind, check-drd)
checked_nbdkit ()
{
  local args=()
  while [ $# -gt 0 ]; do
    case $1 in
      --run) args+=(--run "unset LD_PRELOAD; $2"); shift 2 ;;
      *) args+=("$1"); shift ;;
    esac
  done
  case $RESHAPE_CHECK in
    sanitizers)
      # A hang at exit (see .ci/checks) fails the test, not CI.
      LD_PRELOAD="$RESHAPE_ASAN_RUNTIME" \
      ASAN_OPTIONS="detect_leaks=0:log_path=$tmp/asan" \
      UBSAN_OPTIONS="print_stacktrace=1:log_path=$tmp/ubsan" \
        timeout -k 10 1200 nbdkit "${args[@]}" ;;
    memcheck|helgrind|drd)
      command valgrind --tool="$RESHAPE_CHECK" \
        --log-file="$tmp/valgrind.%p" \
        --suppressions="$srcdir/valgrind.supp" \
        $( [ "$RESHAPE_CHECK" = memcheck ] &&
           echo --leak-check=full --errors-for-leak-kinds=definite ) \
        nbdkit "${args[@]}" ;;
  esac
}
check_reports ()
{
  local f bad=0
  for f in "$tmp"/asan.* "$tmp"/ubsan.* "$tmp"/valgrind.*; do
    test -s "$f" || continue
    if grep -qE 'ERROR: AddressSanitizer|runtime error|ERROR SUMMARY: [1-9]' "$f"
    then
      echo "$0: $RESHAPE_CHECK report $f:" >&2
      cat "$f" >&2
      bad=1
    fi
  done
  return $bad
}
if [ -n "${RESHAPE_CHECK:-}" ]; then
  nbdkit () { checked_nbdkit "$@"; }
  # Also for "bash -c 'nbdkit ...'" started by timed and by clients.
  export -f nbdkit checked_nbdkit
  export tmp RESHAPE_CHECK RESHAPE_ASAN_RUNTIME srcdir
  echo "nbdkit runs under: $RESHAPE_CHECK"
fi

# timed SECONDS COMMAND...: timeout(1) that sees the nbdkit above.
timed () { local t=$1; shift; timeout "$t" bash -c '"$@"' timed "$@"; }

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
