#!/usr/bin/env bash
# reshape-size=auto against no filter and fixed sizes: plugins of
# several shapes x clients x setups (no filter, the default, fixed
# reshape-size from 64K to 32M).  Each cell's workload is sized so that
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
# Results: bench/results/tune/PLUGIN.CLIENT.json; then
# bench/tune-report.py writes bench/results/tune/README.md and the heat
# map bench/results/tune.svg.
#
# usage: bench/tune.sh [RUNS [PLUGIN...]] from a built tree (make check
# builds the model plugin).  CLIENTS=... selects clients, SETUPS=...
# setups (default: all that apply).  The setup "profile" (not run by
# default) is the default with reshape-profile=FILE learnt by one
# untimed run of the same cell before: what a second run gets.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/bin:/bin:$PATH"
runs=${1:-3}
shift || :
plugins=${*:-lat1 objstore clu64k clu2m zero serial qcow2dec qemu-nbd curl}
F=${RESHAPE_FILTER:-"$PWD/filters/reshape/.libs/nbdkit-reshape-filter.so"}
M=${RESHAPE_MODEL:-"$PWD/bench/.libs/nbdkit-model-plugin.so"}
out="$PWD/bench/results/tune"
scratch=$(mktemp -d /dev/shm/reshape-tune.XXXXXX)
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
is_model () { case $1 in qcow2dec|qemu-nbd|curl) return 1 ;; esac; }

# workload PLUGIN CLIENT: "SIZE COUNT", the export size and, for the
# clients of small requests, how many they send; about 2 s without the
# filter on this machine (measured), "-" for a cell not run.
workload ()
{
  case $1.$2 in
    lat1.nbdcopy)          echo "3G 0" ;;
    lat1.nbdcopy4k)        echo "160M 0" ;;
    lat1.convert-from)     echo "2560M 0" ;;
    lat1.convert-to)       echo "384M 0" ;;
    lat1.naive)            echo "256M 1500" ;;
    lat1.rand1)            echo "256M 1500" ;;
    lat1.rand32)           echo "256M 24000" ;;
    objstore.nbdcopy)      echo "640M 0" ;;
    objstore.nbdcopy4k)    echo "8M 0" ;;
    objstore.convert-from) echo "768M 0" ;;
    objstore.convert-to)   echo "96M 0" ;;
    objstore.naive)        echo "256M 100" ;;
    objstore.rand1)        echo "256M 100" ;;
    objstore.rand32)       echo "256M 1600" ;;
    clu64k.nbdcopy)        echo "512M 0" ;;
    clu64k.nbdcopy4k)      echo "32M 0" ;;
    clu64k.convert-from)   echo "512M 0" ;;
    clu64k.convert-to)     echo "1280M 0" ;;
    clu64k.naive)          echo "256M 2600" ;;
    clu64k.rand1)          echo "256M 2600" ;;
    clu64k.rand32)         echo "256M 9000" ;;
    clu2m.nbdcopy)         echo "128M 0" ;;
    clu2m.nbdcopy4k)       echo "8M 0" ;;
    clu2m.convert-from)    echo "1G 0" ;;
    clu2m.convert-to)      echo "1536M 0" ;;
    clu2m.naive)           echo "256M 230" ;;
    clu2m.rand1)           echo "256M 220" ;;
    clu2m.rand32)          echo "256M 480" ;;
    zero.nbdcopy)          echo "3G 0" ;;
    zero.nbdcopy4k)        echo "512M 0" ;;
    zero.convert-from)     echo "4G 0" ;;
    zero.convert-to)       echo "1G 0" ;;
    zero.naive)            echo "256M 25000" ;;
    zero.rand1)            echo "256M 24000" ;;
    zero.rand32)           echo "256M 70000" ;;
    serial.nbdcopy)        echo "512M 0" ;;
    serial.nbdcopy4k)      echo "8M 0" ;;
    serial.convert-from)   echo "640M 0" ;;
    serial.convert-to)     echo "512M 0" ;;
    serial.naive)          echo "256M 1500" ;;
    serial.rand1)          echo "256M 1500" ;;
    serial.rand32)         echo "256M 1600" ;;
    # The real stacks are read-only, and their size is their image's.
    qcow2dec.nbdcopy|qcow2dec.convert-from) echo "1G 0" ;;
    qcow2dec.naive|qcow2dec.rand1)          echo "1G 200" ;;
    qcow2dec.rand32)                        echo "1G 960" ;;
    qemu-nbd.nbdcopy|qemu-nbd.convert-from) echo "256M 0" ;;
    qemu-nbd.naive|qemu-nbd.rand1)          echo "256M 200" ;;
    qemu-nbd.rand32)                        echo "256M 960" ;;
    curl.nbdcopy|curl.convert-from)         echo "128M 0" ;;
    curl.naive|curl.rand1)                  echo "128M 80" ;;
    curl.rand32)                            echo "128M 100" ;;
    *)                                      echo "-" ;;
  esac
}

# Each client, as a --run command; n: the requests it sends.
client_cmd ()
{
  local c=$1 n=$2
  case $c in
    nbdcopy)      echo 'nbdcopy "$uri" null:' ;;
    nbdcopy4k)    echo 'nbdcopy --request-size=4096 "$uri" null:' ;;
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
  esac
}

# The setups of a cell: no fixed sizes that make a real stack's cell
# take minutes (64K over 2M clusters decodes each cluster 32 times).
setups_for ()
{
  if [ -n "${SETUPS:-}" ]; then echo "$SETUPS"; return; fi
  if is_model "$1"; then echo "none default 64K 256K 1M 2M 8M 32M"
  else echo "none default 256K 1M 2M 8M"; fi
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

clients=${CLIENTS:-nbdcopy nbdcopy4k convert-from convert-to naive rand1 rand32}
for p in $plugins; do
  prepare "$p" || continue
  nbdkit --version | head -1 > "$out/$p.version"
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
    for s in $(setups_for "$p"); do
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
/usr/bin/python3 "$PWD/bench/tune-report.py" "$out"
