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


def checkpoint(name: str) -> None:
    """A named point between the phases of a long run.

    With GTP_CARRY_STOP_AT=<name> the run announces it and waits there, so a
    test can kill it in exactly that phase and check what the next run finds.
    """
    if os.environ.get("GTP_CARRY_STOP_AT") == name:
        print(f"[carry] stopped at {name} (pid {os.getpid()})", file=sys.stderr, flush=True)
        while True:
            time.sleep(60)
