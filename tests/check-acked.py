#!/usr/bin/python3
# check-acked.py DISK LOG: every write LOG lists as acknowledged is in
# DISK (interrupt-client.py's slots).
import sys
disk = open(sys.argv[1], "rb").read()
n = 0
for line in open(sys.argv[2]):
    i, off, ln = map(int, line.split())
    want = bytes([i % 251 + 1]) * ln
    if disk[off:off + ln] != want:
        sys.exit("check-acked: acknowledged write %d (%d+%d) lost" % (i, off, ln))
    n += 1
print("check-acked: %d acknowledged writes all present" % n)
