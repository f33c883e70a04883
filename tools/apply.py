#!/usr/bin/env python3
"""Thin entry point, the same as `gtp-carry apply`: see `python3 tools/apply.py --help`."""

import sys

from carry.cli import run

if __name__ == "__main__":
    sys.exit(run("apply", sys.argv[1:], "tools/apply.py"))
