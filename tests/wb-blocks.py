#!/usr/bin/env python3
# Writes or checks N small blocks, one in each 64K, for the write-back
# lifetime tests.
#   wb-blocks.py write URI N TAG    write them (acknowledged, no flush)
#   wb-blocks.py count FILE N TAG   print how many the file holds
#   wb-blocks.py read URI N TAG     print how many a connection reads
#   wb-blocks.py reconnect URI N TAG
#                                   write them, drop the connection,
#                                   reconnect at once, print how many
#                                   read back
import sys

K, STEP, AT = 512, 65536, 100


def block(i, tag):
    return (b"%s-%04d-" % (tag.encode(), i) * K)[:K]


def connect(uri):
    import nbd
    h = nbd.NBD()
    h.connect_uri(uri)
    return h


def write(uri, n, tag):
    h = connect(uri)
    for i in range(n):
        h.pwrite(block(i, tag), i * STEP + AT)
    return h


def read_count(h, n, tag):
    return sum(h.pread(K, i * STEP + AT) == block(i, tag) for i in range(n))


def main():
    op, where, n, tag = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    if op == "write":
        write(where, n, tag)          # exits without flush
    elif op == "count":
        with open(where, "rb") as f:
            d = f.read()
        print(sum(d[i * STEP + AT:i * STEP + AT + K] == block(i, tag)
                  for i in range(n)))
    elif op == "read":
        print(read_count(connect(where), n, tag))
    elif op == "reconnect":
        h = write(where, n, tag)
        del h                         # the socket closed, no NBD_CMD_DISC
        print(read_count(connect(where), n, tag))


main()
