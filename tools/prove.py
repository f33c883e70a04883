#!/usr/bin/env python3
"""Thin entry point: see `python tools/prove.py --help`."""

import sys

from carry.cli import main, prove_main

if __name__ == "__main__":
    sys.exit(main(prove_main))
