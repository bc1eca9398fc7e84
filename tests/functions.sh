# Shared by the tests.  Sourced with "source $srcdir/functions.sh".
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

# have_filter NAME / have_plugin NAME: whether this nbdkit has it
# (filters and plugins come and go between versions: cacheextents went
# in 1.45, and a build from source may lack the nbd plugin).
have_filter () { nbdkit -U - --filter="$1" null --run true >/dev/null 2>&1; }
have_plugin () { nbdkit "$1" --dump-plugin >/dev/null 2>&1; }

# without WHAT WHY: say, in the test's log, what is skipped and why.
without () { echo "$0: skipped: $1 ($2)"; }

# A scratch directory removed at exit, plus extra cleanup hooks.
tmp=$(mktemp -d "${TMPDIR:-/tmp}/reshape-test.XXXXXX")
cleanup_hooks=""
cleanup ()
{
  local status=$?
  # A hook that fails (a server that crashed at shutdown) fails the test.
  for h in $cleanup_hooks; do $h || status=1; done
  if [ -n "${RESHAPE_CHECK:-}" ] && ! check_reports; then
    status=1
  fi
  rm -rf "$tmp"
  exit $status
}
trap cleanup EXIT INT TERM

# PATH: first the nbdkit configure chose (NBDKIT, the one matching the
# headers the filter was built with: no other can load it), alone in a
# directory of its own; then /usr/bin, where nbdsh and libnbd's Python
# module live (a python3 from elsewhere must not hide them); then the
# rest.
: "${NBDKIT:=nbdkit}"
mkdir "$tmp/bin"
ln -s "$(command -v "$NBDKIT" || echo "$NBDKIT")" "$tmp/bin/nbdkit"
export PATH="$tmp/bin:/usr/bin:/bin:$PATH"
if [ -n "${NBDKIT_VERSION:-}" ]; then
  v=$(nbdkit --version 2>/dev/null | awk '{ print $2; exit }') || :
  [ "$v" = "$NBDKIT_VERSION" ] || {
    echo "$0: $NBDKIT is nbdkit '$v', the filter was built for" \
         "$NBDKIT_VERSION (configure --with-nbdkit=PATH)" >&2
    exit 1
  }
fi
on_exit () { cleanup_hooks="$cleanup_hooks $1"; }

fail () { echo "$0: FAIL: $*" >&2; exit 1; }

# The learning (reshape-size=auto) is timed, and a loaded machine (CI
# runs two tests at once on two CPUs) can mislead it: a scenario whose
# outcome rests on timing gets up to 3 tries, each with a fresh nbdkit
# (so learnt afresh), and fails the test only if all 3 miss.
#   tries FN ARGS...   run the scenario FN (with set -e off: FN checks
#                      what it runs, and fails at once, with fail, on
#                      what is not timing, such as data that differs)
#   miss MESSAGE       in FN: say why this try missed (returns 1, so
#                      "test ... || miss ... || return")
tries ()
{
  local i
  for i in 1 2 3; do
    "$@" && return 0
    echo "$0: $1: try $i of 3 missed"
  done
  fail "$1: missed 3 tries in a row"
}
miss () { echo "$0: $*"; return 1; }

# RESHAPE_CHECK (set by make): run every nbdkit of the tests under a
# checker.  The --run command gets a clean environment, so only nbdkit
# is checked.  Reports go to $tmp and any error fails the test at exit.
#   sanitizers  the ASan runtime preloaded (--enable-sanitizers builds)
#   memcheck, helgrind, drd   valgrind tools (make check-valgrind,
#               check-helgrind, check-drd)
checked_nbdkit ()
{
  local args=() done="$tmp/run-done.$BASHPID.$RANDOM"
  while [ $# -gt 0 ]; do
    case $1 in
      --run) args+=(--run "unset LD_PRELOAD; $2
                           r=\$?; touch $done; exit \$r"); shift 2 ;;
      *) args+=("$1"); shift ;;
    esac
  done
  case $RESHAPE_CHECK in
    sanitizers)
      # Any other hang at exit fails the test (the timeout), not CI.
      LD_PRELOAD="$RESHAPE_ASAN_RUNTIME" \
      ASAN_OPTIONS="detect_leaks=0:log_path=$tmp/asan" \
      UBSAN_OPTIONS="print_stacktrace=1:log_path=$tmp/ubsan" \
        timeout -k 10 1200 nbdkit "${args[@]}" &
      local top=$!
      reap_exit_deadlock "$top" "$done" &
      local reaper=$! rc=0
      wait "$top" || rc=$?
      kill "$reaper" 2>/dev/null || :
      return $rc ;;
    memcheck|helgrind|drd)
      command valgrind --tool="$RESHAPE_CHECK" \
        --log-file="$tmp/valgrind.%p" \
        --suppressions="$srcdir/valgrind.supp" \
        $( [ "$RESHAPE_CHECK" = memcheck ] &&
           echo --leak-check=full --errors-for-leak-kinds=definite ) \
        nbdkit "${args[@]}" ;;
  esac
}
# With the ASan runtime preloaded, nbdkit's server may deadlock in
# exit(): libp11-kit's destructor calls freelocale, which waits for ever
# for glibc's __libc_setlocale_lock, with no other thread left.  Not the
# filter's doing (docs/design.md, "Sanitizers"): at start-up, before
# any filter loads, libp11-kit's constructor calls newlocale, which
# holds that lock for writing; its malloc is the first the preloaded
# runtime sees, so ASan initializes there, calls dlerror, and dcgettext
# inside it takes the lock for reading (refused: this thread writes)
# and then unlocks it.  The lock's reader count is -1 from then on
# (gdb: __readers 0xfffffff9 in a server with no filter at all); the
# first strerror in the server (write-back's error message, say) turns
# it into a phantom reader that the exit's freelocale waits for.  So
# once the --run command is done and the server has had 10 s to exit,
# a server whose only thread waits there is killed (nbdkit still
# returns the command's status); any other hang is left to the
# timeout, and fails the test.
reap_exit_deadlock ()
{
  local top=$1 done=$2 i p kids
  while [ ! -e "$done" ]; do
    kill -0 "$top" 2>/dev/null || return 0
    sleep 1
  done
  for i in $(seq 10); do
    kill -0 "$top" 2>/dev/null || return 0
    sleep 1
  done
  kids=$(ps -e -o pid=,ppid=,comm= | awk '$3 == "nbdkit" {print $1, $2}')
  for p in $(awk -v t="$top" '
      { parent[$1] = $2 }
      END { for (p in parent) for (q = p; q in parent; q = parent[q])
              if (parent[q] == t) { print p; break } }' <<< "$kids"); do
    if gdb -batch -p "$p" -ex "thread apply all bt" 2>/dev/null |
         awk '/^Thread / { n++ } /freelocale/ { f = 1 } /_dl_fini/ { d = 1 }
              END { exit !(n == 1 && f && d) }'; then
      echo "$0: nbdkit $p deadlocked in exit (libp11-kit, freelocale): killed"
      kill -9 "$p"
    fi
  done
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
  export -f nbdkit checked_nbdkit reap_exit_deadlock
  export tmp RESHAPE_CHECK RESHAPE_ASAN_RUNTIME srcdir
  echo "nbdkit runs under: $RESHAPE_CHECK"
fi

# timed SECONDS COMMAND...: timeout(1) that sees the nbdkit above.
timed () { local t=$1; shift; timeout "$t" bash -c '"$@"' timed "$@"; }

# stat_of FILE KEY: a counter of the JSON statistics report
# (reshape-stats=FILE.json), e.g. readahead_hits, or a key at its top;
# "ops.pread.plugin.requests" reaches further in.
stat_of ()
{
  python3 -c '
import json, sys
v = json.load(open(sys.argv[1]))
path = sys.argv[2].split(".")
if len(path) == 1 and path[0] in v["counters"]:
    path = ["counters"] + path
for k in path:
    v = v[k]
print(v)' "$1" "$2" || fail "no statistics in $1 (key $2)"
}

# Run nbdkit with the in-tree filter first in the stack.
nbdkit_reshape () { nbdkit --filter="$FILTER" "$@"; }

# start_server SOCK PIDFILE ARGS...: a background nbdkit on a unix
# socket, stopped at exit.
start_server ()
{
  local sock=$1 pidfile=$2; shift 2
  rm -f "$sock" "$pidfile"    # an earlier server's: not this one's
  nbdkit -U "$sock" -P "$pidfile" -f "$@" &
  server_jobs="${server_jobs:-} $!"
  wait_started "$sock" "$pidfile" "$*" > /dev/null
  server_pids="${server_pids:-} $(cat "$pidfile")"
  on_exit stop_servers
}
# wait_started SOCK PIDFILE [WHAT]: wait (10 s at most) until nbdkit
# has both made SOCK and written PIDFILE, then print its pid.  nbdkit
# listens before it writes the pidfile, so the socket alone is not
# enough (a test that read the pidfile then failed on Debian 13).
wait_started ()
{
  local i
  for i in $(seq 1 100); do
    test -s "$2" && test -S "$1" && break
    sleep 0.1
  done
  test -s "$2" && test -S "$1" || fail "nbdkit did not start: ${3:-$1}"
  cat "$2"
}
# died_of_signal STATUS: whether a server's exit status says a signal
# other than the SIGTERM it was stopped with ended it (a crash).
died_of_signal () { [ "$1" -gt 128 ] && [ "$1" != 143 ]; }

# stop_servers: SIGTERM to each, then its exit status: a server that
# died of a signal at shutdown (a crash in unload, say) fails the test
# (returns 1: under set -e the test ends, and the exit hook counts it).
stop_servers ()
{
  local p rc bad=""
  for p in ${server_pids:-}; do
    kill "$p" 2>/dev/null || :
  done
  server_pids=""
  for p in ${server_jobs:-}; do
    rc=0
    wait "$p" 2>/dev/null || rc=$?
    # 127: already reaped (a bare "wait" elsewhere), status unknown.
    ! died_of_signal "$rc" || bad="$bad $rc"
  done
  server_jobs=""
  [ -z "$bad" ] || {
    echo "$0: FAIL: nbdkit died of a signal at shutdown (status$bad)" >&2
    return 1
  }
}

# slow_sh_plugin SCRIPT DISK SECONDS: an sh plugin over the file DISK
# whose writes each sleep SECONDS first: slow without nbdkit_nanosleep,
# which nbdkit aborts once it quits (the delay filter's), so it can
# still write while nbdkit stops.
slow_sh_plugin ()
{
  cat > "$1" <<SHEOF
#!/usr/bin/env bash
case "\$1" in
  get_size) stat -L -c %s "$2" ;;
  pread) dd if="$2" skip=\$4 count=\$3 iflag=skip_bytes,count_bytes \
           status=none ;;
  pwrite) sleep $3
          dd of="$2" seek=\$4 oflag=seek_bytes conv=notrunc status=none ;;
  can_write|can_flush|can_trim|flush|trim) exit 0 ;;
  *) exit 2 ;;
esac
SHEOF
  chmod +x "$1"
}

# wb_fault_case NAME SEED CLIENT-ARGS NBDKIT-ARGS...: nbdkit with
# NBDKIT-ARGS (the stack, over the file $tmp/disk, made anew: $size
# bytes of zeros) runs wb-fault-client.py ($ops operations); then no
# crash, nothing logged lost, and the file holds every acknowledged
# write (the client's model).
wb_fault_case ()
{
  local name=$1 seed=$2 args=$3; shift 3
  rm -f "$tmp/disk"; truncate -s "$size" "$tmp/disk"
  nbdkit -U - "$@" \
    --run "$srcdir/wb-fault-client.py $seed \$uri $size $tmp/model --ops $ops $args" \
    2> "$tmp/stderr" || {
      grep -v injecting "$tmp/stderr" | tail -20 >&2
      fail "$name: seed $seed"
    }
  grep -v injecting "$tmp/stderr" | grep -E 'assert|[Aa]bort|Segm|lost' &&
    fail "$name: seed $seed: nbdkit crashed or lost data"
  "$srcdir/compare-model.py" "$tmp/disk" "$tmp/model" ||
    fail "$name: seed $seed: an acknowledged write is lost"
}
