#!/usr/bin/env python3
# nbdkit-reshape-filter: time commands in alternation.
# Copyright the nbdkit-reshape-filter authors.
# SPDX-License-Identifier: BSD-3-Clause
#
# hyperfine times all runs of one command, then all of the next, so on
# a machine whose speed drifts (a shared VM) two setups measured a
# minute apart differ by more than the filter does.  This runs one
# round of every command at a time, reversing the order every other
# round, and writes hyperfine's JSON layout (results: command, mean,
# median, stddev, times) so bench/report.py and bench/tune-report.py
# read both.  The per-round ratio
# of the first command to each other one is what the report shows.
#
#   paired.py --runs N --export-json FILE -n NAME 'CMD' -n NAME 'CMD'...
#
# Each result keeps its command as "invocation", with the checkout's
# directory left out (filters/reshape/.libs/..., bench/...: paths from
# the top of the checkout, where the bench scripts run) and the
# scratch directory named in $RESHAPE_SCRATCH, if set, written
# $SCRATCH: results are committed, and name no machine's directories.

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

p = argparse.ArgumentParser(
    description="Runs each command in turn, --runs rounds after --warmup,"
    " and writes hyperfine's JSON layout to --export-json (nothing else);"
    " as long as the commands take, times the rounds.")
p.add_argument("--runs", type=int, default=5)
p.add_argument("--warmup", type=int, default=1)
p.add_argument("--export-json", required=True)
p.add_argument("-n", dest="names", action="append", required=True)
p.add_argument("commands", nargs="+")
a = p.parse_intermixed_args()
if len(a.names) != len(a.commands):
    sys.exit("paired.py: one -n NAME per command")


def run(cmd):
    start = time.monotonic()
    r = subprocess.run(shlex.split(cmd), stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    if r.returncode != 0:
        sys.exit("paired.py: command failed (%d): %s" % (r.returncode, cmd))
    return time.monotonic() - start


# The checkout as the scripts spell it ($PWD, perhaps through a
# symbolic link) and as it is.
top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
tops = {top, os.path.realpath(top)}
pwd = os.environ.get("PWD", "")
if os.path.isdir(pwd) and os.path.samefile(pwd, top):
    tops.add(pwd)


scratch = os.environ.get("RESHAPE_SCRATCH", "").rstrip("/")


def relative(cmd):
    if scratch:
        cmd = cmd.replace(scratch + "/", "$SCRATCH/")
    for t in sorted(tops, key=len, reverse=True):
        cmd = cmd.replace(t.rstrip("/") + "/", "")
    return cmd


times = [[] for _ in a.commands]
for rnd in range(a.warmup + a.runs):
    order = list(range(len(a.commands)))
    if rnd % 2:
        order.reverse()
    for i in order:
        t = run(a.commands[i])
        if rnd >= a.warmup:
            times[i].append(t)

results = []
for name, cmd, ts in zip(a.names, a.commands, times):
    results.append({"command": name, "invocation": relative(cmd),
                    "mean": statistics.mean(ts),
                    "median": statistics.median(ts),
                    "stddev": statistics.stdev(ts) if len(ts) > 1 else 0,
                    "times": ts})
with open(a.export_json, "w") as f:
    json.dump({"results": results}, f, indent=1)
for r in results:
    print("  %-10s %8.3f s (median of %d)" % (r["command"], r["median"],
                                              len(r["times"])))
