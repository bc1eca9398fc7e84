#!/usr/bin/env bash
# One line naming what a results table was measured on: the nbdkit,
# the system, the machine and the date.
# usage: bench/stamp.sh
set -uo pipefail
v=$(nbdkit --version 2>/dev/null | awk '{ print $2; exit }')
system=$(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null |
      head -1)
echo "nbdkit ${v:-?}, ${system:-?}, $(nproc) cores${cpu:+ ($cpu)}," \
     "$(date -u +%Y-%m-%d)"
