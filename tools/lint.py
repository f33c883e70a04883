#!/usr/bin/env python3
"""Thin entry point: see `python tools/lint.py --help`."""

import sys

from carry.cli import lint_main, main

if __name__ == "__main__":
    sys.exit(main(lint_main))
