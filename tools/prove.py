#!/usr/bin/env python3
"""Thin entry point, the same as `gtp-carry prove`: see `python3 tools/prove.py --help`."""

import sys

from carry.cli import run

if __name__ == "__main__":
    sys.exit(run("prove", sys.argv[1:], "tools/prove.py"))
