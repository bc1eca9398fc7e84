#!/usr/bin/python3
# nbdkit-reshape-filter: a raw disk image of mixed content, the same
# bytes for the same SIZE and SEED (Python's Mersenne Twister), for
# benchmarks of compressed images: runs of 64K to 2M of holes (zeros),
# random bytes (already compressed data), bytes of 4 random bits,
# text of a small vocabulary, and a random 1K block repeated.  Made
# into a compressed qcow2 with 64K clusters (qemu-img convert -c), 384M
# and seed 1 give a qcow2 of about 104M.
# Copyright the nbdkit-reshape-filter authors.
# SPDX-License-Identifier: BSD-3-Clause
#
#   mixed-disk.py SIZE-MB SEED > FILE

import random
import sys

import cli

USAGE = ("usage: mixed-disk.py SIZE-MB SEED > FILE\n"
         "Writes SIZE-MB of mixed raw content to stdout (a second or two per\n100M); the same bytes for the same SIZE and SEED.")
cli.args(2, USAGE)

size = int(sys.argv[1]) << 20
rng = random.Random(int(sys.argv[2]))
out = sys.stdout.buffer
nibbles = bytes((b & 0x0f) + 0x40 for b in range(256))
words = [bytes(rng.choice(b"abcdefghijklmnopqrstuvwxyz")
               for _ in range(rng.randint(2, 10))) for _ in range(2000)]
done = 0
while done < size:
    n = min((64 << 10) * rng.choice((1, 2, 4, 8, 16, 32)), size - done)
    k = rng.random()
    if k < 0.30:
        b = bytes(n)
    elif k < 0.35:
        b = rng.randbytes(n)
    elif k < 0.52:
        b = rng.randbytes(n).translate(nibbles)
    elif k < 0.80:
        b = b" ".join(rng.choices(words, k=n // 5))
        b = (b + b"\n" * n)[:n]
    else:
        # qcow2's deflate has a 4K window: a repeated 4K block would
        # not shrink.
        block = rng.randbytes(1024)
        b = (block * (n // 1024 + 1))[:n]
    out.write(b)
    done += n
