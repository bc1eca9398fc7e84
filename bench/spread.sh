#!/usr/bin/env bash
# How much the default's time moves from run to run, in the two cells
# the project is judged by: the seeds' (nbdcopy with its defaults over
# nbdkit's qcow2dec filter, 1G with 2M clusters, against the hand fix
# nbdcopy --request-size=2M without the filter) and KubeVirt CDI's
# import (qemu-img convert -f qcow2 from the curl plugin, against
# downloading the file and converting it).  bench/tune.sh runs them,
# RUNS rounds of every setup in alternation; this writes min, median
# and max of each to OUT/README.md (OUT a new directory under /tmp
# unless OUT=DIR names one: OUT=bench/results/spread refreshes the
# project's table).
#
# usage: bench/spread.sh [RUNS]   (5; nbdkit 1.36 or later for qcow2dec)
set -euo pipefail
case ${1:-} in
  -h|--help) sed -n '2,/^set -euo/{/^set/d;s/^# \{0,1\}//;p;}' "$0"; exit 0 ;;
  ''|*[!0-9]*) [ -z "${1:-}" ] || { echo "spread.sh: RUNS must be a number" >&2; exit 1; } ;;
esac
cd "$(dirname "$0")/.."
export PATH="/usr/bin:/bin:$PATH"
runs=${1:-5}
out=$(realpath -m "${OUT:-$(mktemp -d /tmp/reshape-spread.XXXXXX)}")
mkdir -p "$out"
rm -f "$out"/*.json "$out"/*.version
TUNE_OUT=$out SETUPS="download none default" bench/tune.sh "$runs" cdi
TUNE_OUT=$out CLIENTS="nbdcopy nbdcopy2m" SETUPS="none default" \
  bench/tune.sh "$runs" qcow2dec
rm -f "$out"/*.command
echo "bench/spread.sh $runs" > "$out/command"
bench/stamp.sh > "$out/stamp"
/usr/bin/python3 - "$out" "$runs" <<'PY'
import glob, json, os, statistics, sys
out, runs = sys.argv[1], sys.argv[2]
names = {"nbdcopy2m": "the hand fix (--request-size=2M)"}
rows = []
for f in sorted(glob.glob(os.path.join(out, "*.json"))):
    cell = os.path.basename(f)[:-5]
    for r in json.load(open(f))["results"]:
        t = r["times"]
        setup = r["command"]
        if cell.endswith("nbdcopy2m"):
            setup = "hand fix" if setup == "none" else setup + " (2M requests)"
        rows.append((cell, setup, min(t), statistics.median(t), max(t)))
with open(os.path.join(out, "README.md"), "w") as w:
    w.write("# Run-to-run spread of the seeds' and CDI's cells\n\n")
    w.write("`bench/spread.sh %s`: %s rounds, setups in alternation "
            "(bench/paired.py), times in seconds.\n\n" % (runs, runs))
    for v in sorted(glob.glob(os.path.join(out, "*.version"))):
        w.write("- %s: %s\n" % (os.path.basename(v)[:-8], open(v).read().strip()))
    w.write("\n| cell | setup | min | median | max | max/min |\n")
    w.write("|---|---|---:|---:|---:|---:|\n")
    for c, s, lo, med, hi in rows:
        w.write("| %s | %s | %.3f | %.3f | %.3f | %.2f |\n" % (c, s, lo, med, hi, hi / lo))
print(open(os.path.join(out, "README.md")).read())
PY
