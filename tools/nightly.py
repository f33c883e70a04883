#!/usr/bin/env python3
"""Thin entry point, the same as `gtp-carry nightly`: see `python3 tools/nightly.py --help`."""

import sys

from carry.cli import run

if __name__ == "__main__":
    sys.exit(run("nightly", sys.argv[1:], "tools/nightly.py"))
