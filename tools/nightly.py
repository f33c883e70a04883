#!/usr/bin/env python3
"""Thin entry point: see `python tools/nightly.py --help`."""

import sys

from carry.cli import main
from carry.nightly import nightly_main

if __name__ == "__main__":
    sys.exit(main(nightly_main))
