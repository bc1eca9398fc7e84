#!/usr/bin/env bash
# Do no harm: a client that asks for little costs the plugin what it
# costs without the filter.  Plugin reads counted by nbdkit's log
# filter, under the filter and without it, for:
#   - nbdinfo (it reads 8K at 0 for the content), nbdinfo --list over
#     11 exports, and one small read, over a serialized plugin with
#     0.3 s reads (eval, as every sh and eval plugin is);
#   - 40 clients at once, each with an export name of its own, each
#     reading 4K (the memory plugin, 2 ms per read): the same reads,
#     and the server's peak memory within 70M of it without the filter.
#   - nbdkit's test-error10: 1000 reads of 512 bytes at 0, over the
#     error filter at 10%: the same place read again is no stream, so
#     every read reaches the plugin (none is served from a block read
#     for the learning), and about a tenth fail.
source "$srcdir/functions.sh"
requires nbdinfo --version
requires nbdsh --version
requires /usr/bin/python3 -c 'import nbd'

# reads LOG: the reads the plugin was sent.
reads () { grep -c ' Read id=' "$1" || :; }

# slow: a serialized eval plugin with 0.3 s reads and 11 exports.
slow=(eval get_size='echo 268435456'
      pread='sleep 0.3; dd if=/dev/zero count=$3 iflag=count_bytes status=none'
      list_exports='for i in $(seq 0 10); do echo "e$i"; done')

# compare NAME COMMAND: the plugin reads COMMAND (a --run command)
# causes under the filter equal those without it.
compare ()
{
  local name=$1 cmd=$2 with without
  rm -f "$tmp/with.log" "$tmp/without.log"
  nbdkit -U - --filter=log "${slow[@]}" logfile="$tmp/without.log" \
    --run "$cmd" > /dev/null
  nbdkit -U - --filter="$FILTER" --filter=log "${slow[@]}" \
    logfile="$tmp/with.log" --run "$cmd" > /dev/null
  without=$(reads "$tmp/without.log")
  with=$(reads "$tmp/with.log")
  echo "$name: $with plugin reads, $without without the filter"
  test "$with" = "$without" ||
    fail "$name: $with plugin reads, $without without the filter"
}
compare "nbdinfo" 'nbdinfo "$uri"'
compare "nbdinfo --list" 'nbdinfo --list "$uri"'
compare "one small read" 'nbdsh -u "$uri" -c "h.pread(512, 1 << 20)"'

# 40 export names at once, 4K each, from 40 processes.
cat > "$tmp/names.py" <<'EOF'
import nbd, os, sys
sock, n = sys.argv[1], int(sys.argv[2])
kids = []
for i in range(n):
    pid = os.fork()
    if pid == 0:
        h = nbd.NBD()
        h.set_export_name("name%d" % i)
        h.connect_unix(sock)
        assert h.pread(4096, i * 4096) == bytes(4096)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    assert os.waitpid(pid, 0)[1] == 0, "a client failed"
EOF
# names LABEL [FILTER]: run them; prints "reads peak-KB".
names ()
{
  local label=$1 pid; shift
  rm -f "$tmp/$label.log"
  start_server "$tmp/$label.sock" "$tmp/$label.pid" "$@" --filter=log \
    --filter=delay memory 64M delay-read=2ms logfile="$tmp/$label.log"
  /usr/bin/python3 "$tmp/names.py" "$tmp/$label.sock" 40 ||
    fail "40 names ($label): a client failed"
  pid=$(cat "$tmp/$label.pid")
  echo "$(reads "$tmp/$label.log") $(awk '/^VmHWM/ {print $2}' \
                                          "/proc/$pid/status")"
  stop_servers
}
set -- $(names without)
without_reads=$1 without_kb=$2
set -- $(names with --filter="$FILTER")
with_reads=$1 with_kb=$2
echo "40 names: $with_reads plugin reads, peak ${with_kb}K;" \
     "without the filter $without_reads, peak ${without_kb}K"
test "$with_reads" = "$without_reads" ||
  fail "40 names: $with_reads plugin reads, $without_reads without the filter"
if [ -z "${RESHAPE_CHECK:-}" ]; then       # checkers have their own memory
  test $((with_kb - without_kb)) -le $((70 * 1024)) ||
    fail "40 names: peak ${with_kb}K, ${without_kb}K without the filter"
fi

# 1000 reads of the same 512 bytes, as nbdkit's test-error10 makes.
nbdkit -U - --filter="$FILTER" --filter=error pattern 1G error-rate=10% \
  reshape-stats="$tmp/error10.json" --run 'nbdsh -u "$uri" -c "
errors = 0
for i in range(1000):
    try:
        h.pread(512, 0)
    except nbd.Error:
        errors += 1
print(errors)
"' > "$tmp/errors" 2> "$tmp/err" || { cat "$tmp/err"; fail "error10 failed"; }
plugin=$(stat_of "$tmp/error10.json" ops.pread.plugin.requests)
echo "1000 reads of 512 bytes at 0: $plugin plugin reads," \
     "$(cat "$tmp/errors") errors"
test "$plugin" = 1000 || fail "the same read again: $plugin plugin reads"
test "$(cat "$tmp/errors")" -ge 50 && test "$(cat "$tmp/errors")" -le 150 ||
  fail "error10: $(cat "$tmp/errors") errors of 1000, not about 100"
