#!/usr/bin/env bash
# What one-shot commands cost through the filter (the default,
# reshape-size=auto) against no filter, on plugins of every shape: a
# serialized eval plugin with 0.3 s reads (as every sh and eval plugin
# is), and the model plugin's shapes.  Goal: each at most 10% + 0.3 s
# slower than without the filter, and no more plugin reads (those are
# counted by tests/test-oneshot.sh).  Setups in alternation, round by
# round (bench/paired.py).  Results: OUT/*.json and OUT/README.md, OUT
# a new directory under /tmp unless OUT=DIR names one
# (OUT=bench/results/oneshot refreshes the project's table).
#
# usage: bench/oneshot.sh [RUNS] from a built tree.
set -euo pipefail
case ${1:-} in
  -h|--help) sed -n '2,/^set -euo/{/^set/d;s/^# \{0,1\}//;p;}' "$0"; exit 0 ;;
  ''|*[!0-9]*) [ -z "${1:-}" ] ||
                 { echo "$0: RUNS must be a number (--help)" >&2; exit 1; } ;;
esac
cd "$(dirname "$0")/.."
export PATH="/usr/bin:/bin:$PATH"
runs=${1:-5}
F=${RESHAPE_FILTER:-"$PWD/filters/reshape/.libs/nbdkit-reshape-filter.so"}
M=${RESHAPE_MODEL:-"$PWD/bench/.libs/nbdkit-model-plugin.so"}
out=$(realpath -m "${OUT:-$(mktemp -d /tmp/reshape-oneshot.XXXXXX)}")
mkdir -p "$out"
bench/stamp.sh > "$out/stamp"
test -f "$M" || make -s check TESTS= >/dev/null

# The plugins, as nbdkit words.
stack ()
{
  case $1 in
    eval0.3s) echo "eval get_size='echo 268435456' \
pread='sleep 0.3; dd if=/dev/zero count=\$3 iflag=count_bytes status=none' \
list_exports='for i in \$(seq 0 10); do echo e\$i; done'" ;;
    lat1)     echo "$M size=256M latency=1ms bandwidth=400M" ;;
    objstore) echo "$M size=256M latency=20ms bandwidth=100M" ;;
    clu2m)    echo "$M size=256M latency=100us cluster=2M decode=8ms decoders=2" ;;
    zero)     echo "$M size=256M" ;;
    serial)   echo "$M size=256M latency=1ms bandwidth=400M serialize=true" ;;
  esac
}

client ()
{
  case $1 in
    nbdinfo)    echo 'nbdinfo "$uri"' ;;
    list)       echo 'nbdinfo --list "$uri"' ;;
    one-read)   echo 'nbdsh -u "$uri" -c "h.pread(512, 1 << 20)"' ;;
  esac
}

for p in eval0.3s lat1 objstore clu2m zero serial; do
  for c in nbdinfo list one-read; do
    echo "== $p: $c"
    cmd=$(client "$c")
    /usr/bin/python3 bench/paired.py --runs "$runs" \
      --export-json "$out/$p.$c.json" \
      -n none "nbdkit -U - $(stack "$p") --run '$cmd'" \
      -n default "nbdkit -U - --filter=$F $(stack "$p") --run '$cmd'"
  done
done

/usr/bin/python3 - "$out" "$runs" <<'EOF'
import glob, json, os, sys
d, runs = sys.argv[1], sys.argv[2]
rows = []
for f in sorted(glob.glob(os.path.join(d, "*.json"))):
    p, c = os.path.basename(f)[:-5].rsplit(".", 1)
    r = {x["command"]: x["median"] for x in json.load(open(f))["results"]}
    limit = r["none"] * 1.1 + 0.3
    rows.append("| %s | %s | %.3f | %.3f | %+.3f | %s |" % (
        p, c, r["none"], r["default"], r["default"] - r["none"],
        "ok" if r["default"] <= limit else "**miss**"))
md = ["# One-shot commands: the default against no filter", "",
      "Command: `bench/oneshot.sh %s`; measured on %s." % (
          runs, open(os.path.join(d, "stamp")).read().strip()), "",
      "Median seconds of the runs; goal: at most 10% + 0.3 s slower.", "",
      "| plugin | client | none | default | difference | goal |",
      "|---|---|---:|---:|---:|---|"] + rows
open(os.path.join(d, "README.md"), "w").write("\n".join(md) + "\n")
print("\n".join(md))
EOF
