#!/usr/bin/env python3
"""Thin entry point: see `python tools/export.py --help`."""

import sys

from carry.cli import export_main, main

if __name__ == "__main__":
    sys.exit(main(export_main))
