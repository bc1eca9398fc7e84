#!/usr/bin/python3
# Turn bench/tune.sh's hyperfine JSON into a Markdown table (README.md
# beside the JSON) and a heat map (tune.svg): for every plugin x
# client cell, the default's speed against no filter and against the
# best fixed reshape-size, with the goals of reshape-size=auto:
#   default >= 0.95x no filter, and within 1.2x of the best fixed size.
# With a "profile" setup (the default with a profile learnt by a run
# before), the same two numbers for it, beside the goals' (which are
# the default's, without a profile).  The cdi row (KubeVirt CDI's HTTP
# import, cdi.nbdkit-VERSION.json) has a table of its own: a row per
# nbdkit version, its setups against the download of the file and
# against CDI's filters; it is in neither the goals nor the heat map.
# usage: tune-report.py DIR
import glob
import json
import os
import sys

import cli

USAGE = ("usage: tune-report.py DIR\n"
         "Reads bench/tune.sh's JSON in DIR; writes DIR/README.md and\nDIR/tune.svg.  Takes a second.")
cli.args(1, USAGE)

d = sys.argv[1]
PLUGINS = ["lat1", "objstore", "clu64k", "clu2m", "zero", "serial",
           "qcow2dec", "qemu-nbd", "curl"]
CLIENTS = ["nbdcopy", "nbdcopy4k", "convert-from", "convert-to", "naive",
           "rand1", "rand32"]
DESC = {
    "lat1": "1 ms + 400 MB/s per request",
    "objstore": "20 ms + 100 MB/s per request",
    "clu64k": "64K clusters, 0.3 ms decode, 2 decoders",
    "clu2m": "2M clusters, 8 ms decode, 2 decoders",
    "zero": "no latency",
    "serial": "1 ms + 400 MB/s, serialized",
    "qcow2dec": "nbdkit's qcow2dec filter over the file plugin, a 1G "
                "compressed qcow2 with 2M clusters",
    "qemu-nbd": "qemu-nbd serving a 256M compressed qcow2 with 2M "
                "clusters, through the nbd plugin",
    "curl": "the curl plugin, an HTTP server answering each request "
            "after 20 ms, then at 100 MB/s; 128M",
}

cells = {}
for f in glob.glob(os.path.join(d, "*.json")):
    p, c = os.path.basename(f)[:-5].split(".", 1)
    res = json.load(open(f))["results"]
    # The median: one run slowed by the machine (2 cores) moves a mean
    # of three a lot.
    cells[(p, c)] = {r["command"]: (r["median"], r["stddev"] or 0)
                     for r in res}


NOT_FIXED = ("none", "default", "profile")


def verdict(t, setup="default"):
    none, dflt = t["none"][0], t[setup][0]
    fixed = {k: v[0] for k, v in t.items() if k not in NOT_FIXED}
    best = min(fixed, key=fixed.get) if fixed else None
    vs_none = none / dflt
    vs_best = dflt / fixed[best] if best else float("nan")
    return vs_none, best, vs_best


def meets(vn, vb):
    return vn >= 0.95 and vb <= 1.2


md = ["# reshape-size=auto: the default against no filter and fixed sizes",
      "",
      "Each cell: median of the runs (s), every cell's setups run in",
      "alternation; *vs none* is the default's speed-up over no filter",
      "(goal >= 0.95), *vs best* the default's time over the best fixed",
      "reshape-size's (goal <= 1.2).  Every run is a fresh nbdkit: the",
      "default learns during the run itself.", ""]
fails = 0
pfails = 0
for p in PLUGINS:
    rows = [(c, cells[(p, c)]) for c in CLIENTS if (p, c) in cells]
    if not rows:
        continue
    setups = [k for k in rows[0][1] if all(k in t for _, t in rows)]
    warm = "profile" in setups
    vf = os.path.join(d, p + ".version")
    ver = " (%s)" % open(vf).read().strip() if os.path.exists(vf) else ""
    cf = os.path.join(d, p + ".command")
    cmd = (["Command: `%s`" % open(cf).read().strip(), ""]
           if os.path.exists(cf) else [])
    md += ["## %s: %s%s" % (p, DESC.get(p, ""), ver), ""] + cmd + [
           "| client | " + " | ".join(setups) + " | vs none | best | vs best |"
           + (" p/none | p/best |" if warm else ""),
           "|---|" + "---:|" * (len(setups) + 3 + 2 * warm)]
    for c, t in rows:
        vn, best, vb = verdict(t)
        ok = meets(vn, vb)
        fails += not ok
        line = ("| %s | " % c +
                " | ".join("%.3f" % t[s][0] for s in setups) +
                " | %.2fx | %s | %.2f%s |" % (vn, best, vb,
                                              "" if ok else " **miss**"))
        if warm:
            pn, _, pb = verdict(t, "profile")
            pfails += not meets(pn, pb)
            line += " %.2fx | %.2f%s |" % (pn, pb,
                                           "" if meets(pn, pb) else " miss")
        md.append(line)
    y = cells.get((p, "nbdcopy2m"))
    if y and (p, "nbdcopy") in cells:
        dflt = cells[(p, "nbdcopy")]["default"][0]
        md += ["nbdcopy with its defaults through the default filter, "
               "%.3f s, against `nbdcopy --request-size=2M` without the "
               "filter (the seeds' own fix), %.3f s: %.2fx the time."
               % (dflt, y["none"][0], dflt / y["none"][0]), ""]
    md.append("")


def version_key(c):
    return [int(x) if x.isdigit() else x
            for x in c.replace("nbdkit-", "").split(".")]


cdi = sorted((c for p, c in cells if p == "cdi"), key=version_key)
if cdi:
    CDI_SETUPS = ["download", "none", "cdi", "cdi+readahead", "default",
                  "4M"]
    setups = [s for s in CDI_SETUPS if any(s in cells[("cdi", c)]
                                           for c in cdi)]
    md += ["## cdi: KubeVirt CDI's HTTP import",
           "",
           "`qemu-img convert -f qcow2 -O raw` of a compressed qcow2 with "
           "64K clusters (a 384M disk of mixed content, bench/mixed-disk.py "
           "384 1) from nbdkit's curl plugin (`nbdkit -r`, as CDI), "
           "bench/http-server.py answering each request after 10 ms, then "
           "at 100 MB/s; the raw image written to /dev/shm.  Setups: "
           "*download*: curl fetches the whole file (one GET), then "
           "qemu-img converts it locally, the time of both; *none*: no "
           "filter; *cdi*: `--filter=cache --filter=cacheextents "
           "--filter=retry cache-on-read=true` (the cache's file in "
           "/dev/shm); *cdi+readahead*: the same under "
           "`--filter=readahead`; *default*: `--filter=reshape`, nothing "
           "else; *4M*: reshape-size=4M.  Each setup's image was checked "
           "equal to qemu-img convert's of the local qcow2 (cmp).  Median "
           "of the runs (s), setups run in alternation.  A row per nbdkit "
           "version and system: another nbdkit's row is the same command "
           "in a chroot of its release (as .ci/leg makes).", ""]
    md += ["| nbdkit, system | " + " | ".join(setups) +
           " | default/download | default/cdi |",
           "|---|" + "---:|" * (len(setups) + 2)]
    notes = []
    for c in cdi:
        t = cells[("cdi", c)]
        base = os.path.join(d, "cdi." + c)
        ver = (open(base + ".version").read().strip()
               if os.path.exists(base + ".version") else c)
        cmd = (open(base + ".command").read().strip()
               if os.path.exists(base + ".command") else "")

        def ratio(a, b):
            return ("%.2f" % (t[a][0] / t[b][0])
                    if a in t and b in t else "-")
        md.append("| %s | " % ver +
                  " | ".join("%.3f" % t[s][0] if s in t else "-"
                             for s in setups) +
                  " | %s | %s |" % (ratio("default", "download"),
                                    ratio("default", "cdi")))
        if cmd:
            notes.append("%s: `%s`" % (ver, cmd))
        inv = {r["command"]: r["invocation"]
               for r in json.load(open(base + ".json"))["results"]}
        if "cdi" in inv and "cacheextents" not in inv["cdi"]:
            notes.append("%s: no cacheextents filter (removed after "
                         "1.45): *cdi* is CDI's stack without it." % ver)
    md += [""] + ["- " + n for n in notes] + ["", ""]
md.append("Cells missing a goal: %d" % fails)
if any("profile" in t for t in cells.values()):
    md.append("")
    md.append("Cells where the default with a profile would miss: %d"
              % pfails)
open(os.path.join(d, "README.md"), "w").write("\n".join(md) + "\n")
print("\n".join(md))

# Heat map: two columns per plugin (vs none, vs best), a row per client.
W, H, X0, Y0 = 70, 26, 110, 60


def colour(v, good, bad):
    # green at or past good, red at or past bad, white between
    if v is None:
        return "#dddddd"
    t = (v - bad) / (good - bad)
    t = max(0.0, min(1.0, t))
    r = int(230 - 130 * t)
    g = int(100 + 120 * t)
    return "#%02x%02x%02x" % (r, g, 110)


svg = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
       'font-family="sans-serif" font-size="11">'
       % (X0 + 2 * W * len(PLUGINS) + 20, Y0 + H * len(CLIENTS) + 50),
       '<text x="10" y="18" font-size="13">reshape-size=auto: speed-up '
       'over no filter | time over the best fixed size</text>']
for i, p in enumerate(PLUGINS):
    svg.append('<text x="%d" y="%d">%s</text>' % (X0 + 2 * W * i + 4, Y0 - 22, p))
    svg.append('<text x="%d" y="%d" font-size="9">vs none</text>'
               % (X0 + 2 * W * i + 4, Y0 - 6))
    svg.append('<text x="%d" y="%d" font-size="9">vs best</text>'
               % (X0 + 2 * W * i + W + 4, Y0 - 6))
for j, c in enumerate(CLIENTS):
    y = Y0 + H * j
    svg.append('<text x="8" y="%d">%s</text>' % (y + 17, c))
    for i, p in enumerate(PLUGINS):
        x = X0 + 2 * W * i
        if (p, c) in cells:
            vn, best, vb = verdict(cells[(p, c)])
            cells_v = [(vn, 1.05, 0.9, "%.2fx" % vn),
                       (vb, 1.0, 1.3, "%.2f" % vb)]
        else:
            cells_v = [(None, 1, 0, "-"), (None, 1, 0, "-")]
        for k, (v, good, bad, label) in enumerate(cells_v):
            svg.append('<rect x="%d" y="%d" width="%d" height="%d" fill="%s" '
                       'stroke="white"/>' % (x + k * W, y, W, H,
                                             colour(v, good, bad)))
            svg.append('<text x="%d" y="%d">%s</text>'
                       % (x + k * W + 14, y + 17, label))
svg.append('</svg>')
open(os.path.join(d, "tune.svg"), "w").write("\n".join(svg) + "\n")
