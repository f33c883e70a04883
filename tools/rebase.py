#!/usr/bin/env python3
"""Thin entry point, the same as `gtp-carry rebase`: see `python3 tools/rebase.py --help`."""

import sys

from carry.cli import run

if __name__ == "__main__":
    sys.exit(run("rebase", sys.argv[1:], "tools/rebase.py"))
