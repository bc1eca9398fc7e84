#!/usr/bin/env bash
# Benchmark: SO_SNDBUF of the unix-socket client connection.  nbdcopy
# reads 4G in 256K requests through the filter from the pattern plugin
# with reshape-sndbuf off (kernel default) and raised.
# usage: bench/sndbuf.sh [hyperfine options], from a built tree
set -euo pipefail
case ${1:-} in
  -h|--help) sed -n '2,/^set -euo/{/^set/d;s/^# \{0,1\}//;p;}' "$0"; exit 0 ;;
esac
cd "$(dirname "$0")/.."
export PATH="/usr/bin:/bin:$PATH"
command -v hyperfine >/dev/null ||
  { echo "$0: needs hyperfine (apt-get install hyperfine)" >&2; exit 1; }
filter="$PWD/filters/reshape/.libs/nbdkit-reshape-filter.so"
echo "net.core.wmem_max = $(cat /proc/sys/net/core/wmem_max 2>/dev/null || echo '?')"
hyperfine --warmup 1 --runs "${RUNS:-5}" "$@" -L sb off,256K,2M,4M \
  -n "reshape-sndbuf={sb}" \
  "nbdkit -U - --filter=$filter pattern 4G reshape-sndbuf={sb} --run 'nbdcopy --request-size=262144 \$uri null:'"
