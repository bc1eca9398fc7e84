#!/usr/bin/env bash
# What each part of reshape-size=auto buys on real rows: the default,
# then the default with one part switched off (-D reshape.ablate=N:
# 1 grains, 4 cuts, 8 runs fetched ahead over a plugin that serializes
# requests, 16 the forgetting), against each row's references, round
# by round in alternation (a machine whose speed drifts moves a round
# alike).  BEFORE=PATH adds another build of the filter (the commit
# before a change) as one more setup; PARTS="default:0" runs the
# default alone against the references (and BEFORE).
#
# Rows:
#   seed    nbdcopy with its defaults over nbdkit's qcow2dec filter, a
#           1G compressed qcow2 with 2M clusters (nbdkit 1.36 or later;
#           skipped before); references: the hand fix (nbdcopy
#           --request-size=2M, no filter), no filter
#   cdi     KubeVirt CDI's import: qemu-img convert -f qcow2 from the
#           curl plugin, bench/http-server.py serving a compressed
#           qcow2 with 64K clusters (384M disk) after 10 ms per request
#           at 100 MB/s; references: download then convert, no filter
#   par     nbdcopy with its defaults over the model plugin, 18 ms +
#           120 MB/s per call in parallel, 640M; references: no
#           filter, reshape-size=1M
#   writes  qemu-img convert to the model plugin, 12 ms + 150 MB/s,
#           256M; references: no filter, reshape-size=256K
#   cached  5000 sequential 4K reads, 32 in flight, over the model
#           plugin at 15 ms + 150 MB/s, a third of its calls answered
#           at once (a cache below); reference: no filter
#   turn    the same over a plugin that answers its first 200 calls at
#           once, then takes 15 ms + 150 MB/s; reference: no filter
#   naive   a client reading 16M in 4K reads, one at a time, over a
#           plugin answering each read after 2 ms (the delay filter);
#           references: no filter, nbdkit's readahead over cache
#
# usage: bench/ablation.sh [RUNS [ROW...]]   (3; all rows) from a
# built tree.  Writes OUT (default: a new directory under /tmp, named
# at the end) with README.md: each setup's median, min and max, and
# its median over the default's.
set -euo pipefail
case ${1:-} in
  -h|--help) sed -n '2,/^set -euo/{/^set/d;s/^# \{0,1\}//;p;}' "$0"; exit 0 ;;
  ''|*[!0-9]*) [ -z "${1:-}" ] ||
                 { echo "$0: RUNS must be a number (--help)" >&2; exit 1; } ;;
esac
cd "$(dirname "$0")/.."
export PATH="/usr/bin:/bin:$PATH"
runs=${1:-3}
shift || :
rows=${*:-seed cdi par writes cached turn naive}
F=$PWD/filters/reshape/.libs/nbdkit-reshape-filter.so
M=$PWD/bench/.libs/nbdkit-model-plugin.so
out=${OUT:-$(mktemp -d /tmp/reshape-ablation.XXXXXX)}
mkdir -p "$out"
scratch=$(mktemp -d /var/tmp/reshape-ablation.XXXXXX)
server=""
trap '[ -z "$server" ] || kill "$server" 2>/dev/null; rm -rf "$scratch"' EXIT
test -f "$F" && test -f "$M" || { echo "$0: build first (make check)" >&2; exit 1; }
parts=${PARTS:-"default:0 no-grains:1 no-cuts:4 no-ahead:8 no-forgetting:16"}

# seconds CMD...: the elapsed seconds, or "failed"
seconds ()
{
  local t0
  t0=$(date +%s.%N)
  "$@" > /dev/null 2>&1 || { echo failed; return 0; }
  awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }'
}

# filter SETUP: the nbdkit options of a setup of the filter (before
# the plugin); param SETUP: its parameter (after)
filter ()
{
  case $1 in
    none|download|hand) ;;
    readahead+cache) echo "--filter=readahead --filter=cache" ;;
    before) echo "--filter=$BEFORE" ;;
    size=*) echo "--filter=$F" ;;
    *) echo "--filter=$F -D reshape.ablate=${1#*:}" ;;
  esac
}
param ()
{
  case $1 in size=*) echo "reshape-$1" ;; esac
}

prepare ()
{
  case $1 in
    seed)
      nbdkit -U - --filter=qcow2dec null --run true 2>/dev/null || return 1
      head -c $((768 << 20)) /dev/urandom | base64 -w 0 |
        head -c $((1 << 30)) > "$scratch/raw.img"
      qemu-img convert -q -c -f raw -O qcow2 -o cluster_size=2M \
        "$scratch/raw.img" "$scratch/seed.qcow2"
      rm -f "$scratch/raw.img"; cat "$scratch/seed.qcow2" > /dev/null ;;
    cdi)
      nbdkit curl --dump-plugin > /dev/null 2>&1 && command -v curl > /dev/null ||
        return 1
      /usr/bin/python3 bench/mixed-disk.py 384 1 > "$scratch/disk.img"
      qemu-img convert -q -c -f raw -O qcow2 -o cluster_size=64K \
        "$scratch/disk.img" "$scratch/cdi.qcow2"
      /usr/bin/python3 bench/http-server.py 18182 "$scratch/cdi.qcow2" 10 100 \
        > "$scratch/http.out" &
      server=$!
      for _ in $(seq 50); do grep -qs ready "$scratch/http.out" && break; sleep 0.1; done ;;
    writes) head -c $((256 << 20)) /dev/urandom > "$scratch/src.img" ;;
  esac
}

# run ROW SETUP: one timed run
run ()
{
  local url=http://127.0.0.1:18182/cdi.qcow2 f p
  f=$(filter "$2"); p=$(param "$2")
  # shellcheck disable=SC2086
  case $1:$2 in
    seed:hand) seconds nbdkit -U - --filter=qcow2dec file "$scratch/seed.qcow2" \
                 --run 'nbdcopy --request-size=2097152 "$uri" null:' ;;
    seed:*) seconds nbdkit -U - $f --filter=qcow2dec file "$scratch/seed.qcow2" \
              $p --run 'nbdcopy "$uri" null:' ;;
    cdi:download) seconds sh -c "curl -sSf -o '$scratch/dl.qcow2' '$url' &&
                    qemu-img convert -f qcow2 -O raw '$scratch/dl.qcow2' '$scratch/dl.raw'" ;;
    cdi:*) seconds nbdkit -r -U - $f curl url="$url" $p \
             --run "qemu-img convert -f qcow2 -O raw \"\$uri\" '$scratch/out.raw'" ;;
    par:*) seconds nbdkit -U - $f "$M" size=640M latency=18ms bandwidth=120M $p \
             --run 'nbdcopy "$uri" null:' ;;
    writes:*) seconds nbdkit -U - $f "$M" size=256M latency=12ms bandwidth=150M $p \
                --run "qemu-img convert -n -f raw -O raw '$scratch/src.img' \"\$uri\"" ;;
    naive:*) seconds nbdkit -U - $f --filter=delay pattern 256M delay-read=2ms $p \
               --run 'nbdsh -u "$uri" -c "
for off in range(0, 16 << 20, 4096):
    h.pread(4096, off)
"' ;;
    cached:*|turn:*)
      seconds nbdkit -U - $f "$M" size=64M latency=15ms bandwidth=150M \
        "$(case $1 in cached) echo cached=33 ;; *) echo fast-calls=200 ;; esac)" \
        --run "/usr/bin/python3 tests/stream-reads.py \"\$uri\" 4096 32 $((5000 * 4096))" ;;
  esac
}

refs ()
{
  case $1 in
    seed) echo "hand none" ;;
    cdi) echo "download none" ;;
    par) echo "none size=1M" ;;
    writes) echo "none size=256K" ;;
    cached|turn) echo "none" ;;
    naive) echo "none readahead+cache" ;;
  esac
}

{
  echo "# What each part of reshape-size=auto buys"
  echo
  echo "\`bench/ablation.sh $runs $rows\`${BEFORE:+ (BEFORE=$BEFORE)}:" \
       "$(hostname), nbdkit $(nbdkit --version | awk '{print $2}'), $(date -u +%F)."
  echo "Seconds, median (min-max) of $runs rounds; the last column is the"
  echo "median over the default's (a part buys what switching it off costs)."
} > "$out/README.md"
for row in $rows; do
  prepare "$row" || { echo "ablation: $row: skipped (this nbdkit lacks it)" |
                        tee -a "$out/README.md"; continue; }
  setups="$(refs "$row") $parts ${BEFORE:+before}"
  : > "$out/$row.times"
  for r in $(seq "$runs"); do
    for s in $setups; do
      echo "$s $(run "$row" "$s")" >> "$out/$row.times"
    done
  done
  [ -z "$server" ] || { kill "$server"; server=""; }
  rm -f "$scratch"/*.img "$scratch"/*.qcow2 "$scratch"/*.raw
  /usr/bin/python3 - "$row" "$out/$row.times" >> "$out/README.md" <<'PY'
import statistics, sys
row, path = sys.argv[1], sys.argv[2]
times = {}
for line in open(path):
    s, t = line.split()
    times.setdefault(s, []).append(t)
def med(s):
    v = [float(t) for t in times[s] if t != "failed"]
    return (statistics.median(v), min(v), max(v)) if v else None
d = med("default:0")
print("\n## %s\n\n| setup | seconds | /default |\n|---|---|---|" % row)
for s in times:
    m = med(s)
    if m is None:
        print("| %s | failed | |" % s)
        continue
    print("| %s | %.3f (%.3f-%.3f) | %s |" % (s.split(":")[0],
          m[0], m[1], m[2], "%.2fx" % (m[0] / d[0]) if d else ""))
PY
done
echo "ablation: $out/README.md"
cat "$out/README.md"
