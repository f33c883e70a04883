"""A night told to stop ends as a night, not as a crash.

``scancel`` of the Slurm job, its time limit or a shutdown send SIGTERM to every process of the
job; Ctrl-C sends SIGINT. The first of them raises ``Stopped`` in the main thread, wherever the
night is: the run in progress is stopped with what it started (carry.nightly.launch), the cells
already judged keep their verdicts, each cell not judged is an ``error`` that says it was not
run or was stopped as it ran, and the night's files are written (``stopped`` in nightly.json and
the summary) within the grace the scheduler gives before SIGKILL (Slurm's KillWait, 30 s unless
the cluster says otherwise). Later signals (Slurm signals every process of the job; srun passes
them on) are noted and not raised, so that nothing cuts the writing short. The exit status is
128 plus the signal's number, as a shell gives a process a signal ended.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Iterator

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(KeyboardInterrupt):
    def __init__(self, signum: int):
        self.signum = signum
        self.name = signal.Signals(signum).name
        self.at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        super().__init__(f"stopped by {self.name} at {self.at}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def __str__(self) -> str:
        return f"{self.name} at {self.at}"


_first: Stopped | None = None


def stopped() -> Stopped | None:
    """The signal that stopped the night, or None."""
    return _first


def _raise_once(signum, frame) -> None:
    global _first
    if _first is not None:
        return
    _first = Stopped(signum)
    raise _first


@contextmanager
def catching() -> Iterator[None]:
    """SIGTERM and SIGINT raise Stopped (once) inside; outside, as before. Only the main thread
    can take signals: elsewhere (a test calling in) nothing changes."""
    global _first
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.getsignal(s) for s in SIGNALS}
    _first = None
    for s in SIGNALS:
        signal.signal(s, _raise_once)
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
