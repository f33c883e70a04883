"""Progress lines for long operations: shown on a terminal, silent otherwise.

Messages go to stderr so that stdout (tables) and --json files stay clean.
CI logs stay quiet unless GTP_CARRY_VERBOSE=1.
"""

from __future__ import annotations

import os
import sys
import time

_start = time.monotonic()


def enabled() -> bool:
    if os.environ.get("GTP_CARRY_VERBOSE") == "1":
        return True
    if os.environ.get("GTP_CARRY_QUIET") == "1" or os.environ.get("CI"):
        return False
    return sys.stderr.isatty()


def say(message: str) -> None:
    if enabled():
        print(f"[{time.monotonic() - _start:6.1f}s] {message}", file=sys.stderr, flush=True)
