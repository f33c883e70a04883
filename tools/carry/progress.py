"""Progress lines for long operations, on a terminal and in logs alike.

One line per phase (a download, a base, an upstream's patches, a proof) and,
for work that runs minutes without phases (a compression), one line every
half minute: plain lines, no spinner, so a CI log or a file shows them too.
They go to stderr so that stdout (tables) and --json files stay clean.

The switch (README.md, "Progress"): GTP_CARRY_QUIET=1 silences them;
GTP_CARRY_VERBOSE=1 shows them even then.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

_start = time.monotonic()
_lock = threading.Lock()   # one line at a time: sides that tick from their own threads never share a line
TICK = 30.0  # seconds between the lines of a long step that has no phases of its own


def enabled() -> bool:
    if os.environ.get("GTP_CARRY_VERBOSE") == "1":
        return True
    return os.environ.get("GTP_CARRY_QUIET") != "1"


def say(message: str) -> None:
    if enabled():
        line = f"[{time.monotonic() - _start:6.1f}s] {message}\n"
        with _lock:   # the line and its newline in one write (print writes them apart)
            sys.stderr.write(line)
            sys.stderr.flush()


@contextmanager
def ticking(what: str, status: Callable[[], str], every: float = TICK) -> Iterator[None]:
    """While the block runs, say ``what: <status()>, N s`` every ``every`` seconds; then once more, done."""
    if not enabled():
        yield
        return
    stop = threading.Event()
    t0 = time.monotonic()

    def tick() -> None:
        while not stop.wait(every):
            say(f"{what}: {status()}, {time.monotonic() - t0:.0f} s so far")

    thread = threading.Thread(target=tick, name="progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    say(f"{what}: done ({status()}) in {time.monotonic() - t0:.0f} s")


def checkpoint(name: str) -> None:
    """A named point between the phases of a long run.

    With GTP_CARRY_STOP_AT=<name> the run announces it and waits there, so a
    test can kill it in exactly that phase and check what the next run finds.
    """
    if os.environ.get("GTP_CARRY_STOP_AT") == name:
        print(f"[carry] stopped at {name} (pid {os.getpid()})", file=sys.stderr, flush=True)
        while True:   # short sleeps: a signal the main thread did not wake for is still handled at once
            time.sleep(0.1)
