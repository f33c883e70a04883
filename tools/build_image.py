#!/usr/bin/env python3
"""Thin entry point, the same as `gtp-carry build-image`: see `python3 tools/build_image.py --help`."""

import sys

from carry.cli import run

if __name__ == "__main__":
    sys.exit(run("build-image", sys.argv[1:], "tools/build_image.py"))
