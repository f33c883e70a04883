#!/usr/bin/env python3
"""Thin entry point: see `python tools/rebase.py --help`."""

import sys

from carry.cli import rebase_main, main

if __name__ == "__main__":
    sys.exit(main(rebase_main))
