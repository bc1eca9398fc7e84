# nbdkit-reshape-filter: the command line of the bench helpers.
# Copyright the nbdkit-reshape-filter authors.
# SPDX-License-Identifier: BSD-3-Clause
import sys


def args(n, usage):
    """The n arguments after the script's name.  --help prints usage
    and exits 0; any other count prints it and exits 2."""
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(usage)
        sys.exit(0)
    if len(sys.argv) != n + 1:
        print(usage, file=sys.stderr)
        sys.exit(2)
    return sys.argv[1:]
