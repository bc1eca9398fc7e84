#!/usr/bin/python3
# bench/report.py DIR: turn bench/accel.sh's hyperfine JSON (and the
# model plugin's call counts) into DIR/README.md and two SVG plots,
# accel.svg (speed-up over no filter) and sweep.svg (the request-size sweep).
import json
import os
import re
import statistics
import sys

import cli

USAGE = ("usage: report.py DIR\n"
         "Reads bench/accel.sh's JSON and call counts in DIR; rewrites the\ngenerated sections of DIR/README.md and DIR/accel.svg, DIR/sweep.svg.\nTakes a second.")
cli.args(1, USAGE)

d = sys.argv[1]
TITLES = {
    "naive": "naive sequential 4K reader, depth 1, 1 ms + 400 MB/s",
    "deep": "64-deep 4K writes (32M), 1 ms + 400 MB/s",
    "serial": "serializing plugin, 64-deep 4K writes (16M), 1 ms + 400 MB/s",
    "big": "32M reads, depth 1, 1 ms + 200 MB/s per request "
           "(nbdkit -t 1 unless noted)",
    "convert-from": "qemu-img convert from an export (256M), 1 ms + 400 MB/s",
    "convert-to": "qemu-img convert to an export (256M), 1 ms + 400 MB/s",
    "optimal": "already-optimal: nbdcopy 256K requests, pattern 4G",
    "scan": "nbdkit's scan filter above: sequential 256K reads (64M), "
            "depth 1, 20 ms + 100 MB/s",
}


def load(name):
    with open(os.path.join(d, name + ".json")) as f:
        return json.load(f)["results"]


def calls(name, label):
    p = os.path.join(d, "%s.%s.calls" % (name, label))
    if not os.path.exists(p):
        return ""
    for line in open(p):
        k, v = line.split()
        if k == "calls":
            return v
    return ""


def kept_text(path):
    """The hand-written paragraphs between the header and the first
    table of an existing README.md (the other benchmarks' index)."""
    try:
        lines = open(path).read().split("\n")
    except FileNotFoundError:
        return []
    kept, on = [], False
    for line in lines:
        if line.startswith("## "):
            break
        if on:
            kept.append(line)
        elif line.startswith("Made by `bench/accel.sh`"):
            on = True
    while kept and kept[0] == "":
        kept.pop(0)
    return kept


stamp = os.path.join(d, "stamp")
md = ["# Benchmark results", "",
      "Made by `bench/accel.sh` (hyperfine, one run per table; ratios "
      "are against no filter in the same run)%s." % (
          "; measured on " + open(stamp).read().strip()
          if os.path.exists(stamp) else ""), ""]
md += kept_text(os.path.join(d, "README.md"))
bars = []                                   # (bench, label, speed-up)
for name in TITLES:
    if not os.path.exists(os.path.join(d, name + ".json")):
        continue
    res = load(name)
    means = {r["command"]: r["mean"] for r in res}
    md += ["## " + TITLES[name], "",
           "| setup | time (s) | vs no filter | plugin calls |",
           "|---|---:|---:|---:|"]
    for r in res:
        # "LABEL,VARIANT" rows compare with "no-filter,VARIANT".
        variant = r["command"].partition(",")[2]
        base = means["no-filter," + variant if variant else "no-filter"]
        ratio = base / r["mean"]
        md.append("| %s | %.3f ± %.3f | %.2fx | %s |" % (
            r["command"], r["mean"], r["stddev"] or 0, ratio,
            calls(name, r["command"])))
        if not r["command"].startswith("no-filter"):
            bars.append((name, r["command"], ratio))
    md.append("")

sweep = {}                                  # N -> {setup: mean}
paired = {}                                 # N -> (ratio, 2 sigma)
for f in sorted(os.listdir(d)):
    m = re.match(r"sweep\.(\d+)\.json$", f)
    if not m:
        continue
    n = int(m.group(1))
    res = {r["command"]: r for r in json.load(open(os.path.join(d, f)))["results"]}
    for k, r in res.items():
        sweep.setdefault(n, {})[k] = r["mean"]
    if "no-filter" in res and "reshape" in res:
        # Round by round: the two ran back to back.
        q = [x / y for x, y in zip(res["no-filter"]["times"],
                                   res["reshape"]["times"])]
        sd = statistics.stdev(q) if len(q) > 1 else 0
        paired[n] = (statistics.mean(q), 2 * sd / len(q) ** 0.5)
if sweep:
    md += ["## The request-size sweep: nbdcopy --request-size=2^N, "
           "sparse-random 4G", "",
           "Speed-up: mean of the per-round ratios (the setups run in "
           "alternation), ± two standard errors.", "",
           "| N | no filter (s) | reshape (s) | reshape speed-up |",
           "|---:|---:|---:|---:|"]
    for n in sorted(paired):
        r, e = paired[n]
        md.append("| %d | %.3f | %.3f | %.2fx ± %.2f |"
                  % (n, sweep[n]["no-filter"], sweep[n]["reshape"], r, e))
    md.append("")


def svg_bars(path):
    w, rowh, left = 760, 22, 330
    top = 40
    h = top + rowh * len(bars) + 40
    mx = max([b[2] for b in bars] + [1.0])
    scale = (w - left - 60) / mx
    o = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
         'font-family="sans-serif" font-size="12">' % (w, h),
         '<rect width="100%" height="100%" fill="white"/>',
         '<text x="10" y="20" font-size="14">Speed-up over no filter '
         '(1.0 = same; higher is faster)</text>']
    x1 = left + scale
    o.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#888" '
             'stroke-dasharray="4"/>' % (x1, top - 5, x1, h - 30))
    for i, (name, label, r) in enumerate(bars):
        y = top + i * rowh
        colour = "#2a7" if label.startswith("reshape") else "#999"
        o.append('<text x="%d" y="%d" text-anchor="end">%s: %s</text>'
                 % (left - 6, y + 14, name, label))
        o.append('<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>'
                 % (left, y + 3, r * scale, rowh - 6, colour))
        o.append('<text x="%.1f" y="%d">%.2fx</text>'
                 % (left + r * scale + 4, y + 14, r))
    o.append('</svg>')
    open(path, "w").write("\n".join(o) + "\n")


def svg_sweep(path):
    w, h, left, top, bottom = 640, 320, 60, 40, 40
    ns = sorted(n for n in sweep if len(sweep[n]) == 2)
    if not ns:
        return
    ymax = max(max(sweep[n].values()) for n in ns) * 1.1
    def px(i): return left + i * (w - left - 20) / max(1, len(ns) - 1)
    def py(v): return h - bottom - v / ymax * (h - top - bottom)
    o = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
         'font-family="sans-serif" font-size="12">' % (w, h),
         '<rect width="100%" height="100%" fill="white"/>',
         '<text x="10" y="20" font-size="14">nbdcopy --request-size=2^N '
         'over sparse-random 4G: seconds (lower is better)</text>']
    for tag, colour in (("no-filter", "#999"), ("reshape", "#2a7")):
        pts = " ".join("%.1f,%.1f" % (px(i), py(sweep[n][tag]))
                       for i, n in enumerate(ns))
        o.append('<polyline points="%s" fill="none" stroke="%s" '
                 'stroke-width="2"/>' % (pts, colour))
    for i, n in enumerate(ns):
        o.append('<text x="%.1f" y="%d" text-anchor="middle">%d</text>'
                 % (px(i), h - bottom + 16, n))
    o.append('<text x="%d" y="%d" fill="#999">no filter</text>' % (left + 10, top + 10))
    o.append('<text x="%d" y="%d" fill="#2a7">reshape</text>' % (left + 10, top + 26))
    o.append('<text x="5" y="%.1f">%.1fs</text>' % (py(ymax / 1.1), ymax / 1.1))
    o.append('<text x="5" y="%.1f">0</text>' % py(0))
    o.append('</svg>')
    open(path, "w").write("\n".join(o) + "\n")


svg_bars(os.path.join(d, "accel.svg"))
svg_sweep(os.path.join(d, "sweep.svg"))
md += ["![speed-up](accel.svg)", "", "![sweep](sweep.svg)", ""]
open(os.path.join(d, "README.md"), "w").write("\n".join(md))
print("\n".join(md))
