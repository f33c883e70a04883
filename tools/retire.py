#!/usr/bin/env python3
"""Thin entry point: see `python tools/retire.py --help`."""

import sys

from carry.cli import retire_main, main

if __name__ == "__main__":
    sys.exit(main(retire_main))
