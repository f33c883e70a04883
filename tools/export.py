#!/usr/bin/env python3
"""Thin entry point, the same as `gtp-carry export`: see `python3 tools/export.py --help`."""

import sys

from carry.cli import run

if __name__ == "__main__":
    sys.exit(run("export", sys.argv[1:], "tools/export.py"))
