#!/usr/bin/python3
# nbdkit-reshape-filter: an HTTP server for nbdkit's curl plugin in
# benchmarks, like an object store: it serves one file and answers
# each Range request after LATENCY, then sends the range at BANDWIDTH
# (bytes/s, per request; requests in parallel add up).
# Copyright the nbdkit-reshape-filter authors.
# SPDX-License-Identifier: BSD-3-Clause
#
#   http-server.py PORT FILE LATENCY-MS BANDWIDTH-MB
#
# It prints "ready" once it listens, and serves until killed.

import http.server
import os
import re
import sys
import time

import cli

USAGE = ("usage: http-server.py PORT FILE LATENCY-MS BANDWIDTH-MB\n"
         "Serves FILE over HTTP on 127.0.0.1:PORT like an object store; prints\n\"ready\" once it listens and runs until killed.  Writes nothing.")
cli.args(4, USAGE)

port, path = int(sys.argv[1]), sys.argv[2]
latency = float(sys.argv[3]) / 1000
bandwidth = float(sys.argv[4]) * 1e6
size = os.path.getsize(path)
data = open(path, "rb")


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # The headers and the body go out in two writes: with Nagle's
    # algorithm the body waits for the client's delayed ACK of the
    # headers, 40 ms more per request on a kept-alive connection.
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def head(self, code, length, extra=()):
        self.send_response(code)
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()

    def do_HEAD(self):
        self.head(200, size)

    def do_GET(self):
        m = re.match(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        lo = int(m.group(1)) if m else 0
        hi = int(m.group(2)) + 1 if m and m.group(2) else size
        hi = min(hi, size)
        time.sleep(latency + (hi - lo) / bandwidth)
        if m:
            self.head(206, hi - lo,
                      [("Content-Range", "bytes %d-%d/%d" % (lo, hi - 1,
                                                             size))])
        else:
            self.head(200, size)
        self.wfile.write(os.pread(data.fileno(), hi - lo, lo))


server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
server.daemon_threads = True
print("ready", flush=True)
server.serve_forever()
