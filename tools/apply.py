#!/usr/bin/env python3
"""Thin entry point: see `python tools/apply.py --help`."""

import sys

from carry.cli import apply_main, main

if __name__ == "__main__":
    sys.exit(main(apply_main))
