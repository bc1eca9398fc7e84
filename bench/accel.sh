#!/usr/bin/env bash
# Acceleration benchmarks: each workload without a filter, with the
# best existing nbdkit filter for the job, and with this filter, in one
# hyperfine run; plugin calls counted by the model backend
# (bench/model-plugin.c).  Results: OUT/*.json, OUT a new directory
# under /tmp unless OUT=DIR names one (OUT=bench/results refreshes the
# project's tables); then bench/report.py writes OUT/README.md and
# accel.svg.
# usage: bench/accel.sh [RUNS [SECTION...]], from a built tree (make
# check builds the model plugin); SECTIONs: naive deep serial big
# convert optimal scan sweep (default: all).
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
sections=${*:-naive deep serial big convert optimal scan sweep}
want () { case " $sections " in *" $1 "*) return 0 ;; esac; return 1; }
F="$PWD/filters/reshape/.libs/nbdkit-reshape-filter.so"
M="$PWD/bench/.libs/nbdkit-model-plugin.so"
out=$(realpath -m "${OUT:-$(mktemp -d /tmp/reshape-accel.XXXXXX)}")
mkdir -p "$out"
bench/stamp.sh > "$out/stamp"
test -f "$M" || make -s check TESTS= >/dev/null
# Without hyperfine every table would keep its old numbers, silently.
command -v hyperfine >/dev/null ||
  { echo "$0: needs hyperfine (apt-get install hyperfine)" >&2; exit 1; }
slow="latency=1ms bandwidth=400M"

# bench NAME CLIENT-COMMAND then (label, nbdkit words) pairs
bench ()
{
  local name=$1 client=$2; shift 2
  local args=() label stack
  while [ $# -gt 0 ]; do
    label=$1 stack=$2; shift 2
    args+=(-n "$label" "nbdkit -U - $stack --run '$client'")
    # One more run for the plugin calls, outside the timing.
    case "$stack" in
      *"$M"*)
        eval "nbdkit -U - $stack calls=$out/$name.$label.calls \
              --run '$client'" >/dev/null 2>&1 || : ;;
    esac
  done
  hyperfine -N --warmup 1 --runs "$runs" --export-json "$out/$name.json" \
    "${args[@]}" 2>/dev/null | grep -E '^ +[0-9.]+ ± |times faster|^Summary|ran$' || :
}

if want naive; then
echo "== naive sequential 4K reader (depth 1), 1 ms + 400 MB/s per request"
naive='qemu-img bench -f raw -c 8192 -d 1 -s 4096 -S 4096 $uri'
bench naive "$naive" \
  "no-filter"          "$M size=64M $slow" \
  "readahead+cache"    "--filter=readahead --filter=cache $M size=64M $slow" \
  "reshape"            "--filter=$F $M size=64M $slow" \
  "zero-latency"       "$M size=64M"
fi

if want deep; then
echo "== 64-deep 4K writes, 1 ms + 400 MB/s"
deep='qemu-img bench -w -f raw -c 8192 -d 64 -s 4096 -S 4096 $uri'
bench deep "$deep" \
  "no-filter"          "$M size=64M $slow" \
  "cache=writeback"    "--filter=cache $M size=64M $slow cache=writeback" \
  "reshape"            "--filter=$F $M size=64M $slow" \
  "reshape-writeback"  "--filter=$F $M size=64M $slow reshape-writeback=true"
fi

if want serial; then
echo "== serialized plugin, 4K writes 64 deep, 1 ms + 400 MB/s"
serial='qemu-img bench -w -f raw -c 4096 -d 64 -s 4096 -S 4096 $uri'
bench serial "$serial" \
  "no-filter"          "$M size=64M $slow serialize=true" \
  "cache=writeback"    "--filter=cache $M size=64M $slow serialize=true cache=writeback" \
  "reshape-writeback"  "--filter=$F $M size=64M $slow serialize=true reshape-writeback=true"
fi

if want big; then
echo "== 32M reads, 1 ms + 200 MB/s per request"
# A depth-1 client needs one nbdkit thread (-t 1).  With the default
# 16, each request lands on a thread whose 32M buffer nbdkit's core
# allocates and clears on first use, so all 16 requests of this run
# pay that (seconds in a VM, where page faults are dear) whatever the
# filter does; the "16 threads" rows show it.
big='qemu-img bench -f raw -c 16 -d 1 -s 32M -S 32M $uri'
bm="$M size=512M latency=1ms bandwidth=200M"
bench big "$big" \
  "no-filter"          "-t 1 $bm" \
  "blocksize"          "-t 1 --filter=blocksize $bm maxdata=256K" \
  "reshape"            "-t 1 --filter=$F $bm" \
  "zero-latency"       "-t 1 $M size=512M" \
  "no-filter,16-threads" "$bm" \
  "reshape,16-threads" "--filter=$F $bm"
fi

if want convert; then
echo "== qemu-img convert from an export, 1 ms + 400 MB/s"
conv='qemu-img convert -f raw -O raw $uri '"$out"'/convert.img'
bench convert-from "$conv" \
  "no-filter"          "$M size=256M $slow" \
  "readahead+cache"    "--filter=readahead --filter=cache $M size=256M $slow" \
  "reshape"            "--filter=$F $M size=256M $slow"
qemu-img create -q -f raw "$out/src.img" 256M
nbdkit -U - pattern 256M --run "nbdcopy \$uri $out/src.img"
conv='qemu-img convert -n -f raw -O raw '"$out"'/src.img $uri'
echo "== qemu-img convert to an export, 1 ms + 400 MB/s"
bench convert-to "$conv" \
  "no-filter"          "$M size=256M $slow" \
  "cache=writeback"    "--filter=cache $M size=256M $slow cache=writeback" \
  "reshape"            "--filter=$F $M size=256M $slow"
rm -f "$out/src.img" "$out/convert.img"
fi

if want optimal; then
echo "== already-optimal requests: nbdcopy 256K, pattern 4G, no latency"
opt='nbdcopy --request-size=262144 $uri null:'
bench optimal "$opt" \
  "no-filter"          "pattern 4G" \
  "reshape"            "--filter=$F pattern 4G"
fi

if want scan; then
echo "== nbdkit's scan filter above: sequential 256K reads, depth 1, 20 ms + 100 MB/s"
# scan sends cache requests ahead of the client; the plugin cannot
# cache, so alone they do nothing, and above reshape they fill its
# read cache (within the readahead budget).
scanread='qemu-img bench -f raw -c 256 -d 1 -s 256K -S 256K $uri'
sm="$M size=256M latency=20ms bandwidth=100M"
bench scan "$scanread" \
  "no-filter"          "$sm" \
  "scan"               "--filter=scan $sm" \
  "reshape"            "--filter=$F $sm" \
  "scan+reshape"       "--filter=scan --filter=$F $sm"
fi

if want sweep; then
echo "== the request-size sweep: nbdcopy --request-size=2^N over sparse-random 4G"
# The two setups run in alternation (bench/paired.py), at least 8
# rounds: without latency the filter's effect is smaller than this
# machine's drift between two hyperfine runs.
rm -f "$out"/sweep.*.json
for n in $(seq 15 25); do
  rs=$((1 << n))
  c="sparse-random size=4G seed=1 --run 'nbdcopy --request-size=$rs \$uri \$uri'"
  /usr/bin/python3 bench/paired.py --runs $((runs > 8 ? runs : 8)) \
    --export-json "$out/sweep.$n.json" \
    -n no-filter "nbdkit -U - $c" -n reshape "nbdkit -U - --filter=$F $c"
  echo "  2^$n done"
done
fi

/usr/bin/python3 "$PWD/bench/report.py" "$out"
