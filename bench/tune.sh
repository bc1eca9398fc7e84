#!/usr/bin/env bash
# reshape-size=auto against fixed sizes: model plugins of several
# shapes x clients x setups (no filter, the default, fixed
# reshape-size from 64K to 32M).  Each cell runs its setups in
# alternation, round by round (bench/paired.py): a machine whose speed
# drifts moves all setups of a round alike.
# Results: bench/results/tune/PLUGIN.CLIENT.json; then
# bench/tune-report.py writes bench/results/tune/README.md and the heat
# map bench/results/tune.svg.
#
# usage: bench/tune.sh [RUNS [PLUGIN...]] from a built tree (make check
# builds the model plugin).  PLUGINs: lat1 objstore clu64k clu2m zero
# serial (default: all).  CLIENTS=... selects clients, SETUPS=...
# setups (default: all).
# The setup "profile" is the default with reshape-profile=FILE, the
# file learnt by one untimed run of the same cell before (a second run
# of the same job): what the default does once the probe's one-off
# cost at the first connection is paid.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/bin:/bin:$PATH"
runs=${1:-3}
shift || :
plugins=${*:-lat1 objstore clu64k clu2m zero serial}
clients=${CLIENTS:-nbdcopy nbdcopy4k convert-from convert-to naive rand1 rand32}
setups=${SETUPS:-none default profile 64K 256K 1M 2M 8M 32M}
F=${RESHAPE_FILTER:-"$PWD/filters/reshape/.libs/nbdkit-reshape-filter.so"}
M=${RESHAPE_MODEL:-"$PWD/bench/.libs/nbdkit-model-plugin.so"}
out="$PWD/bench/results/tune"
scratch=$(mktemp -d /dev/shm/reshape-tune.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$out"
test -f "$M" || make -s check TESTS= >/dev/null

# Each plugin: its model parameters and the export size that makes a
# whole-export client take a second or two without a filter.
plugin_args ()
{
  case $1 in
    lat1)     echo "size=256M latency=1ms bandwidth=400M" ;;
    objstore) echo "size=256M latency=20ms bandwidth=100M" ;;
    clu64k)   echo "size=256M latency=100us cluster=64K decode=300us decoders=2" ;;
    clu2m)    echo "size=256M latency=100us cluster=2M decode=8ms decoders=2" ;;
    zero)     echo "size=512M" ;;
    serial)   echo "size=128M latency=1ms bandwidth=400M serialize=true" ;;
  esac
}

# Each client, as a --run command; $n scales the small-request clients
# (requests issued) to the plugin's speed.
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
    rand32)       echo "/usr/bin/python3 $PWD/bench/random-reads.py \"\$uri\" $((n * 8)) 32" ;;
  esac
}

# Small-request count per plugin: about a second at depth 1.
requests ()
{
  case $1 in
    lat1|serial) echo 1000 ;;
    objstore)    echo 200 ;;
    clu64k)      echo 2000 ;;
    clu2m)       echo 120 ;;
    zero)        echo 20000 ;;
  esac
}

# A setup: the filters it stacks, and their parameters.
setup_filters () { [ "$1" = none ] || echo "--filter=$F"; }
setup_params ()
{
  case $1 in
    none|default) ;;
    profile) echo "reshape-profile=$scratch/learnt.profile" ;;
    *) echo "reshape-size=$1" ;;
  esac
}

# The profile setup's file, learnt by one run of the cell's client.  A
# run shorter than a probe beside the connections (which stops with
# its connection) learns nothing: then a connection held open longer
# learns it.
learn_profile ()
{
  local run=$1
  local hold='/usr/bin/python3 -c "import nbd, sys, time; h = nbd.NBD(); h.connect_uri(sys.argv[1]); time.sleep(5)" "$uri"'
  local learnt="grep -qs ^export $scratch/learnt.profile"
  rm -f "$scratch/learnt.profile"
  # A failing run must not end the benchmark (set -e): the cell then
  # measures the profile setup as it is, probing, with a warning.
  eval "$run" >/dev/null 2>&1 || echo "tune.sh: warning: learning run failed" >&2
  $learnt || eval "${run%--run *}--run '$hold'" >/dev/null 2>&1 ||
    echo "tune.sh: warning: held learning run failed" >&2
  $learnt || echo "tune.sh: warning: no profile learnt" >&2
}

# nbdcopy --request-size=4096 copies a smaller export: 4K requests are
# slow enough without a filter.
small_size ()
{
  case $1 in
    lat1)     echo 256M ;;
    objstore) echo 64M ;;
    clu64k)   echo 64M ;;
    clu2m)    echo 16M ;;
    zero)     echo 256M ;;
    serial)   echo 64M ;;
  esac
}

# The model plugin's disk is a file in memory, allocated before the
# runs: written to in place, it costs no page faults in the timed runs
# (on this VM, faulting a fresh 2M page took up to milliseconds while
# the kernel compacted memory, under the model's own lock).
for p in $plugins; do
  pa=$(plugin_args "$p")
  size=${pa#size=}; size=${size%% *}
  rm -f "$scratch/src.img" "$scratch/disk"
  qemu-img create -q -f raw "$scratch/src.img" "$size"
  nbdkit -U - pattern "$size" --run "nbdcopy \"\$uri\" $scratch/src.img"
  fallocate -l "$size" "$scratch/disk"
  for c in $clients; do
    cmd=$(client_cmd "$c" "$(requests "$p")")
    pa="$(plugin_args "$p") file=$scratch/disk"
    [ "$c" != nbdcopy4k ] || pa="size=$(small_size "$p") ${pa#size=* }"
    echo "== $p: $c"
    args=()
    for s in $setups; do
      run="nbdkit -U - $(setup_filters "$s") $M $pa $(setup_params "$s") \
--run '$cmd'"
      [ "$s" != profile ] || learn_profile "$run"
      args+=(-n "$s" "$run")
    done
    /usr/bin/python3 bench/paired.py --warmup "${WARMUP:-1}" --runs "$runs" \
      --export-json "$out/$p.$c.json" "${args[@]}"
    rm -f "$scratch/out.img"
  done
done
/usr/bin/python3 "$PWD/bench/tune-report.py" "$out"
