#!/usr/bin/env python3
"""Thin entry point, the same as `gtp-carry lint`: see `python3 tools/lint.py --help`."""

import sys

from carry.cli import run

if __name__ == "__main__":
    sys.exit(run("lint", sys.argv[1:], "tools/lint.py"))
