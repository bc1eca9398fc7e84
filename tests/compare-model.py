#!/usr/bin/python3
# compare-model.py DISK MODEL [ALLOWED]: the backing file holds every
# byte the model defines (bytes trimmed or hit by a failed write are
# skipped); with ALLOWED, up to that many bytes may differ (what nbdkit
# said it lost).
import sys

disk = open(sys.argv[1], "rb").read()
model = open(sys.argv[2], "rb").read()
mask = open(sys.argv[2] + ".mask", "rb").read()
if len(disk) != len(model):
    sys.exit("compare-model: size %d, model %d" % (len(disk), len(model)))
bad = [i for i in range(len(model)) if mask[i] and disk[i] != model[i]]
allowed = int(sys.argv[3]) if len(sys.argv) > 3 else 0
if bad and len(bad) <= allowed:
    print("compare-model: %d bytes differ, within the %d reported lost"
          % (len(bad), allowed))
    sys.exit(0)
if bad:
    sys.exit("compare-model: %d bytes differ, first at %d (disk %d, model %d)"
             % (len(bad), bad[0], disk[bad[0]], model[bad[0]]))
print("compare-model: %d of %d bytes defined, all match"
      % (mask.count(1), len(model)))
