#!/usr/bin/env python3
"""Thin entry point, the same as `gtp-carry retire`: see `python3 tools/retire.py --help`."""

import sys

from carry.cli import run

if __name__ == "__main__":
    sys.exit(run("retire", sys.argv[1:], "tools/retire.py"))
