#!/usr/bin/env bash
# reshape-size=auto against no filter and fixed sizes: plugins of
# several shapes x clients x setups (no filter, the default, fixed
# reshape-size from 64K to 8M).  Each cell's workload is sized so that
# the run without the filter takes about 2 s or more: a copy long enough
# to measure the copy, not the start.  Each cell runs its setups in
# alternation, round by round (bench/paired.py): a machine whose speed
# drifts moves all setups of a round alike.
#
# Plugins: the model plugin (bench/model-plugin.c) in six shapes, and
# three real stacks:
#   qcow2dec  nbdkit's qcow2dec filter over the file plugin, a 1G
#             compressed qcow2 with 2M clusters (the seeds' scenario;
#             nbdkit 1.36 or later: skipped with a message before)
#   qemu-nbd  qemu-nbd serving a 256M compressed qcow2 with 2M
#             clusters, through nbdkit's nbd plugin
#   curl      nbdkit's curl plugin against bench/http-server.py: 20 ms
#             per request, then 100 MB/s, 128M
#   cdi       KubeVirt CDI's HTTP import: qemu-img convert -f qcow2 -O
#             raw from nbdkit's curl plugin, bench/http-server.py
#             serving a compressed qcow2 with 64K clusters (about 104M
#             of a 384M disk, bench/mixed-disk.py) after 10 ms per
#             request, then at 100 MB/s; its own setups: the download
#             of the whole file then a local convert, no filter, CDI's
#             filters (cache, cacheextents, retry), the same under
#             readahead, the default, reshape-size=4M.  Its results are
#             a row per nbdkit version: cdi.nbdkit-VERSION.json.
# Results: OUT/PLUGIN.CLIENT.json, OUT a new directory under /tmp
# unless OUT=DIR names one (OUT=bench/results/tune refreshes the
# project's tables; what is there already stays, row by row); then
# bench/tune-report.py writes OUT/README.md and the heat map
# OUT/tune.svg.  Each row records the nbdkit, system, machine and date
# (bench/stamp.sh) and its command.
#
# usage: bench/tune.sh [RUNS [PLUGIN...]] from a built tree (make check
# builds the model plugin).  CLIENTS=... selects clients, SETUPS=...
# setups (default: all that apply).  The setup "profile" (not run by
# default) is the default with reshape-profile=FILE learnt by one
# untimed run of the same cell before: what a second run gets.
# TUNE_OUT=DIR writes the JSON there and no report (bench/spread.sh).
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
plugins=${*:-lat1 objstore clu64k clu2m zero serial qcow2dec qemu-nbd curl cdi}
F=${RESHAPE_FILTER:-"$PWD/filters/reshape/.libs/nbdkit-reshape-filter.so"}
M=${RESHAPE_MODEL:-"$PWD/bench/.libs/nbdkit-model-plugin.so"}
out=$(realpath -m "${TUNE_OUT:-${OUT:-$(mktemp -d /tmp/reshape-tune.XXXXXX)}}")
scratch=$(mktemp -d /dev/shm/reshape-tune.XXXXXX)
export RESHAPE_SCRATCH=$scratch         # written $SCRATCH in the results
helpers=""
trap 'for p in $helpers; do kill $p 2>/dev/null || :; done; rm -rf "$scratch"' EXIT
mkdir -p "$out"
test -f "$M" || make -s check TESTS= >/dev/null

# The model plugin's shapes.
model_args ()
{
  case $1 in
    lat1)     echo "latency=1ms bandwidth=400M" ;;
    objstore) echo "latency=20ms bandwidth=100M" ;;
    clu64k)   echo "latency=100us cluster=64K decode=300us decoders=2" ;;
    clu2m)    echo "latency=100us cluster=2M decode=8ms decoders=2" ;;
    zero)     echo "" ;;
    serial)   echo "latency=1ms bandwidth=400M serialize=true" ;;
  esac
}
is_model () { case $1 in qcow2dec|qemu-nbd|curl|cdi) return 1 ;; esac; }

# workload PLUGIN CLIENT: "SIZE COUNT", the export size and, for the
# clients of small requests, how many they send; about 2 s without the
# filter on this machine (measured), "-" for a cell not run.  The real
# stacks are read-only, and their size is their image's.
workloads="
lat1      nbdcopy       3G     0
lat1      nbdcopy4k     160M   0
lat1      convert-from  2560M  0
lat1      convert-to    384M   0
lat1      naive         256M   1500
lat1      rand1         256M   1500
lat1      rand32        256M   24000
objstore  nbdcopy       640M   0
objstore  nbdcopy4k     8M     0
objstore  convert-from  768M   0
objstore  convert-to    96M    0
objstore  naive         256M   100
objstore  rand1         256M   100
objstore  rand32        256M   1600
clu64k    nbdcopy       512M   0
clu64k    nbdcopy4k     32M    0
clu64k    convert-from  512M   0
clu64k    convert-to    1280M  0
clu64k    naive         256M   2600
clu64k    rand1         256M   2600
clu64k    rand32        256M   9000
clu2m     nbdcopy       128M   0
clu2m     nbdcopy4k     8M     0
clu2m     convert-from  1G     0
clu2m     convert-to    1536M  0
clu2m     naive         256M   230
clu2m     rand1         256M   220
clu2m     rand32        256M   480
zero      nbdcopy       3G     0
zero      nbdcopy4k     512M   0
zero      convert-from  4G     0
zero      convert-to    1G     0
zero      naive         256M   25000
zero      rand1         256M   24000
zero      rand32        256M   70000
serial    nbdcopy       512M   0
serial    nbdcopy4k     8M     0
serial    convert-from  640M   0
serial    convert-to    512M   0
serial    naive         256M   1500
serial    rand1         256M   1500
serial    rand32        256M   1600
qcow2dec  nbdcopy       1G     0
qcow2dec  nbdcopy2m     1G     0
qcow2dec  convert-from  1G     0
qcow2dec  naive         1G     200
qcow2dec  rand1         1G     200
qcow2dec  rand32        1G     960
qemu-nbd  nbdcopy       256M   0
qemu-nbd  nbdcopy2m     256M   0
qemu-nbd  convert-from  256M   0
qemu-nbd  naive         256M   200
qemu-nbd  rand1         256M   200
qemu-nbd  rand32        256M   960
curl      nbdcopy       128M   0
curl      convert-from  128M   0
curl      naive         128M   80
curl      rand1         128M   80
curl      rand32        128M   100
"
workload ()
{
  awk -v p="$1" -v c="$2" '$1 == p && $2 == c { print $3, $4; f = 1 }
                          END { if (!f) print "-" }' <<< "$workloads"
}

# Each client, as a --run command; n: the requests it sends.
client_cmd ()
{
  local c=$1 n=$2
  case $c in
    nbdcopy)      echo 'nbdcopy "$uri" null:' ;;
    nbdcopy4k)    echo 'nbdcopy --request-size=4096 "$uri" null:' ;;
    nbdcopy2m)    echo 'nbdcopy --request-size=2097152 "$uri" null:' ;;
    convert-from) echo "qemu-img convert -f raw -O raw \"\$uri\" $scratch/out.img" ;;
    convert-to)   echo "qemu-img convert -n -f raw -O raw $scratch/src.img \"\$uri\"" ;;
    naive)        echo "qemu-img bench -f raw -c $n -d 1 -s 4096 -S 4096 \"\$uri\"" ;;
    rand1)        echo "/usr/bin/python3 $PWD/bench/random-reads.py \"\$uri\" $n 1" ;;
    rand32)       echo "/usr/bin/python3 $PWD/bench/random-reads.py \"\$uri\" $n 32" ;;
  esac
}

# The nbdkit words below the filter: the plugin and its arguments.
stack ()
{
  local p=$1 size=$2
  case $p in
    qcow2dec) echo "--filter=qcow2dec file $scratch/seed.qcow2" ;;
    qemu-nbd) echo "nbd socket=$scratch/qemu-nbd.sock" ;;
    curl)     echo "curl url=http://127.0.0.1:18079/disk" ;;
    *)        echo "$M size=$size $(model_args "$p") file=$scratch/disk" ;;
  esac
}

# A compressed qcow2 with 2M clusters of SIZE: compressible data (the
# base64 of random bytes), as a disk image's.
make_qcow2 ()
{
  local size=$1 file=$2 bytes
  bytes=$(numfmt --from=iec "$size")
  head -c $((bytes * 3 / 4 + 4)) /dev/urandom | base64 -w 0 |
    head -c "$bytes" > "$scratch/raw.img"
  qemu-img convert -q -c -f raw -O qcow2 -o cluster_size=2M \
    "$scratch/raw.img" "$file"
  rm -f "$scratch/raw.img"
}

# prepare PLUGIN: make what its cells need, or say why it cannot run.
prepare ()
{
  case $1 in
    qcow2dec)
      nbdkit -U - --filter=qcow2dec null --run true 2>/dev/null || {
        echo "tune.sh: qcow2dec: skipped: nbdkit $(nbdkit --version |
          awk '{print $2}') has no qcow2dec filter (1.36 or later)" >&2
        return 1
      }
      make_qcow2 1G "$scratch/seed.qcow2" ;;
    qemu-nbd)
      command -v qemu-nbd >/dev/null ||
        { echo "tune.sh: qemu-nbd: skipped: no qemu-nbd" >&2; return 1; }
      make_qcow2 256M "$scratch/qemu.qcow2"
      qemu-nbd -r -f qcow2 -t -x '' -k "$scratch/qemu-nbd.sock" \
        "$scratch/qemu.qcow2" &
      helpers="$helpers $!"
      for i in $(seq 50); do test -S "$scratch/qemu-nbd.sock" && break
                             sleep 0.1; done ;;
    curl)
      nbdkit curl --dump-plugin >/dev/null 2>&1 ||
        { echo "tune.sh: curl: skipped: no curl plugin" >&2; return 1; }
      head -c 128M /dev/urandom > "$scratch/http.img"
      /usr/bin/python3 bench/http-server.py 18079 "$scratch/http.img" 20 100 \
        > "$scratch/http.out" &
      helpers="$helpers $!"
      for i in $(seq 50); do grep -qs ready "$scratch/http.out" && break
                             sleep 0.1; done ;;
    cdi)
      nbdkit curl --dump-plugin >/dev/null 2>&1 ||
        { echo "tune.sh: cdi: skipped: no curl plugin" >&2; return 1; }
      command -v curl >/dev/null ||
        { echo "tune.sh: cdi: skipped: no curl (the download)" >&2; return 1; }
      /usr/bin/python3 bench/mixed-disk.py 384 1 > "$scratch/cdi.img"
      qemu-img convert -q -c -f raw -O qcow2 -o cluster_size=64K \
        "$scratch/cdi.img" "$scratch/cdi.qcow2"
      # What every setup must write: qemu-img convert of the local qcow2.
      qemu-img convert -q -f qcow2 -O raw "$scratch/cdi.qcow2" \
        "$scratch/cdi.ref"
      cmp "$scratch/cdi.img" "$scratch/cdi.ref"
      rm -f "$scratch/cdi.img"
      echo "tune.sh: cdi: qcow2 of $(stat -c %s "$scratch/cdi.qcow2") bytes"
      /usr/bin/python3 bench/http-server.py 18080 "$scratch/cdi.qcow2" 10 100 \
        > "$scratch/cdi-http.out" &
      helpers="$helpers $!"
      for i in $(seq 50); do grep -qs ready "$scratch/cdi-http.out" && break
                             sleep 0.1; done ;;
  esac
}

# The cdi row: one cell, CDI's import in every setup (SETUPS=... to
# choose), written to a raw file in the scratch dir; after the runs
# each setup's file must equal qemu-img convert's of the local qcow2,
# or the cell fails and writes no results.  Every nbdkit is read-only
# (-r) as CDI's.  The cache filter keeps its file in TMPDIR, the
# scratch dir in memory.  The filter's path is relative to the
# checkout (the commands run there), so that the results name no
# checkout.
cdi_cell ()
{
  local v f url=http://127.0.0.1:18080/cdi.qcow2 cdi s o conv run
  local setups=${SETUPS:-none cdi cdi+readahead default 4M download}
  local args=()
  v=$(nbdkit --version | awk '{ print $2; exit }')
  f=${F#"$PWD/"}
  cdi="--filter=cache --filter=cacheextents --filter=retry"
  if ! nbdkit -U - --filter=cacheextents null --run true 2>/dev/null; then
    echo "tune.sh: cdi: nbdkit $v has no cacheextents filter" \
      "(removed after 1.45): CDI's stack without it" >&2
    cdi="--filter=cache --filter=retry"
  fi
  echo "== cdi: qemu-img convert -f qcow2 -O raw (nbdkit $v)"
  for s in $setups; do
    o=$scratch/cdi-$s.raw
    conv="qemu-img convert -f qcow2 -O raw \"\$uri\" $o"
    case $s in
      none)    run="nbdkit -r -U - curl url=$url --run '$conv'" ;;
      cdi)     run="nbdkit -r -U - $cdi curl url=$url cache-on-read=true \
--run '$conv'" ;;
      cdi+readahead)
               run="nbdkit -r -U - --filter=readahead $cdi curl url=$url \
cache-on-read=true --run '$conv'" ;;
      default) run="nbdkit -r -U - --filter=$f curl url=$url --run '$conv'" ;;
      download)
               run="sh -c 'curl -sSf -o $scratch/cdi-dl.qcow2 $url && \
qemu-img convert -f qcow2 -O raw $scratch/cdi-dl.qcow2 $o'" ;;
      *)       run="nbdkit -r -U - --filter=$f curl url=$url reshape-size=$s \
--run '$conv'" ;;
    esac
    args+=(-n "$s" "$run")
  done
  TMPDIR=$scratch /usr/bin/python3 bench/paired.py --warmup "${WARMUP:-1}" \
    --runs "$runs" --export-json "$scratch/cdi.json" "${args[@]}"
  for s in $setups; do
    cmp "$scratch/cdi-$s.raw" "$scratch/cdi.ref" || {
      echo "tune.sh: cdi: $s wrote another image than qemu-img convert" \
        "of the local qcow2: no results" >&2
      exit 1
    }
  done
  mv "$scratch/cdi.json" "$out/cdi.nbdkit-$v.json"
  echo "bench/tune.sh $runs cdi" > "$out/cdi.nbdkit-$v.command"
  bench/stamp.sh > "$out/cdi.nbdkit-$v.version"
  rm -f "$scratch"/cdi-*.raw "$scratch/cdi-dl.qcow2"
}

# The setups of a cell: fixed sizes from 64K to 8M (32M was the best of
# no cell by more than noise in earlier runs, and takes seconds where
# the others take tenths); not 64K over 2M clusters, where it decodes
# each cluster 32 times (a cell of minutes).  nbdcopy2m (the seeds' own
# fix, --request-size=2M) is only the yardstick for the default.
setups_for ()
{
  if [ -n "${SETUPS:-}" ]; then echo "$SETUPS"; return; fi
  if [ "$2" = nbdcopy2m ]; then echo "none default"; return; fi
  case $1 in
    clu2m|qcow2dec|qemu-nbd) echo "none default 256K 1M 2M 8M" ;;
    *) echo "none default 64K 256K 1M 2M 8M" ;;
  esac
}

setup_filters () { [ "$1" = none ] || echo "--filter=$F"; }
setup_params ()
{
  case $1 in
    none|default) ;;
    profile) echo "reshape-profile=$scratch/learnt.profile" ;;
    *) echo "reshape-size=$1" ;;
  esac
}

clients=${CLIENTS:-nbdcopy nbdcopy2m nbdcopy4k convert-from convert-to naive rand1 rand32}
for p in $plugins; do
  prepare "$p" || continue
  if [ "$p" = cdi ]; then cdi_cell; continue; fi
  bench/stamp.sh > "$out/$p.version"
  # A run of some clients' cells only is added to the command of the
  # run that made the others.
  if [ -n "${CLIENTS:-}" ]; then
    echo "CLIENTS='$CLIENTS' bench/tune.sh $runs $p (those cells)" \
      >> "$out/$p.command"
  else
    echo "bench/tune.sh $runs $p" > "$out/$p.command"
  fi
  for c in $clients; do
    set -- $(workload "$p" "$c")
    [ "$1" != - ] || continue
    size=$1 n=${2:-0}
    if is_model "$p"; then
      # The model's disk is a file in memory, allocated before the runs:
      # written to in place, it costs no page faults in the timed runs.
      rm -f "$scratch/disk"; fallocate -l "$size" "$scratch/disk"
    fi
    if [ "$c" = convert-to ]; then
      rm -f "$scratch/src.img"
      nbdkit -U - pattern "$size" --run "nbdcopy \"\$uri\" $scratch/src.img"
    fi
    cmd=$(client_cmd "$c" "$n")
    echo "== $p: $c ($size${n#0})"
    args=()
    for s in $(setups_for "$p" "$c"); do
      run="nbdkit -U - $(setup_filters "$s") $(stack "$p" "$size") \
$(setup_params "$s") --run '$cmd'"
      if [ "$s" = profile ]; then
        rm -f "$scratch/learnt.profile"
        eval "$run" >/dev/null 2>&1 ||
          echo "tune.sh: warning: learning run failed" >&2
      fi
      args+=(-n "$s" "$run")
    done
    /usr/bin/python3 bench/paired.py --warmup "${WARMUP:-1}" --runs "$runs" \
      --export-json "$out/$p.$c.json" "${args[@]}"
    rm -f "$scratch/out.img" "$scratch/src.img"
  done
done
[ -n "${TUNE_OUT:-}" ] || /usr/bin/python3 "$PWD/bench/tune-report.py" "$out"
echo "tune.sh: results in $out"
