#!/usr/bin/env python3
"""Thin entry point, the same as `gtp-carry upstream-tests`: see `python3 tools/upstream_tests.py --help`."""

import sys

from carry.cli import run

if __name__ == "__main__":
    sys.exit(run("upstream-tests", sys.argv[1:], "tools/upstream_tests.py"))
