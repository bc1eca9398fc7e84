#!/usr/bin/env bash
# One line naming what a results table was measured on: the nbdkit,
# the system, the machine and the date.
# usage: bench/stamp.sh
set -uo pipefail
case ${1:-} in
  -h|--help) sed -n '2,/^set -uo/{/^set/d;s/^# \{0,1\}//;p;}' "$0"; exit 0 ;;
esac
v=$(nbdkit --version 2>/dev/null | awk '{ print $2; exit }')
system=$(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null |
      head -1)
echo "nbdkit ${v:-?}, ${system:-?}, $(nproc) cores${cpu:+ ($cpu)}," \
     "$(date -u +%Y-%m-%d)"
