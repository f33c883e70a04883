#!/usr/bin/env python3
"""Thin entry point, the same as `gtp-carry kept`: see `python3 tools/kept.py --help`."""

import sys

from carry.cli import run

if __name__ == "__main__":
    sys.exit(run("kept", sys.argv[1:], "tools/kept.py"))
