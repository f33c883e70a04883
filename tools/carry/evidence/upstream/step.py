"""A rank left behind, seen while its launch runs: the launch is stopped then, not left to the per-test timeout.

Upstream's tests fail on one rank and go on there, while the other ranks wait in the collective the
failing rank never reached. Those wait until the reporter's per-test timeout (120 s in the device runs),
and the ranks that went on meet them nowhere: their next tests' NCCL set-up times out after 60 s and is
reported as a failure. In h100/2026-12-05-shards, 15 launches ended so, each after about 120 s.

The ranks' records say it at once: a test a rank ended failing, while another rank is still in it. Over
the 2,794 tests of the committed runs that every rank of a launch ended, the ranks' end times lay at
most 3.1 s apart, but for one failing test: rank 0 failed it (an NCCL error) and went on, and the other
three waited 60 s for its NCCL set-up and failed then (h200/2026-12-04-beyond-gtp-folder), the very case
this is for. A rank still in a test ``GRACE`` seconds after a peer failed it and went on is left behind.
The launcher then writes ``results.STOPPED`` and stops the launch. The failed test keeps its failure, the
peer's record, and what any rank began after it runs again (results.Launch: the records of ranks out of
step never count), so stopping early changes no verdict.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from .results import STOPPED, is_failing, rank_of

GRACE = 30.0   # seconds: near ten times the widest spread of the ranks' end times of ranks in step (3.1 s)
POLL = 5.0     # seconds between looks at the records


class Watch:
    """One launch's rank records (rank-*.jsonl), read as they grow."""

    def __init__(self, folder: Path, grace: float = GRACE):
        self.folder, self.grace = folder, grace
        self._read_to: dict[Path, int] = {}                # the end of the last whole line read, per file
        self._in: dict[str, str] = {}                      # rank -> the test it is in
        self._failed: dict[str, dict[str, float]] = {}     # test -> rank -> when it ended it failing

    def behind(self, now: float | None = None) -> dict | None:
        """A rank still in a test that another rank failed and left more than GRACE seconds ago:
        {rank, test, peer, seconds}; None while the ranks are in step."""
        for path in sorted(self.folder.glob("rank-*.jsonl")):
            self._read(path)
        now = time.time() if now is None else now
        for rank, test in sorted(self._in.items()):
            for peer, when in sorted(self._failed.get(test, {}).items()):
                if peer != rank and now - when >= self.grace:
                    return {"rank": rank, "test": test, "peer": peer, "seconds": round(now - when, 1),
                            "grace": self.grace}
        return None

    def wait(self, proc: subprocess.Popen, limit: float | None, log: IO[bytes], kill: Callable) -> int | None:
        """PROC's exit code; TimeoutExpired past LIMIT seconds, as proc.wait. A launch whose ranks fall out
        of step is stopped (KILL) once that is seen, with the launcher's record of why and a line in LOG."""
        end = None if limit is None else time.monotonic() + limit
        while True:
            try:
                return proc.wait(timeout=POLL if end is None else max(0.0, min(POLL, end - time.monotonic())))
            except subprocess.TimeoutExpired:
                if end is not None and time.monotonic() >= end:
                    raise
            behind = self.behind()
            if behind:
                log.write(f"\n[carry] {write_stopped(self.folder, behind)}\n".encode())
                log.flush()
                kill(proc)
                return proc.returncode

    def _read(self, path: Path) -> None:
        rank = rank_of(path)
        at = self._read_to.get(path, 0)
        try:
            with path.open("rb") as f:
                f.seek(at)
                data = f.read()
        except OSError:
            return
        whole = data[:data.rfind(b"\n") + 1]   # a line the rank is still writing is read again next time
        self._read_to[path] = at + len(whole)
        for line in whole.splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            kind, nodeid = ev.get("ev"), ev.get("id", "")
            if kind == "start":
                self._in[rank] = nodeid
            elif kind in ("end", "timeout", "terminated"):
                self._in.pop(rank, None)
                if kind == "end" and is_failing(ev.get("outcome", "error")):
                    self._failed.setdefault(nodeid, {})[rank] = float(ev.get("t", time.time()))


def write_stopped(folder: Path, behind: dict) -> str:
    """The launcher's record of why it stopped the launch (read back by results.read_launch); the line
    it says."""
    (folder / STOPPED).write_text(json.dumps(behind, sort_keys=True) + "\n")
    return (f"rank {behind['rank']} was still in {behind['test']} {behind['seconds']:.0f} s after rank "
            f"{behind['peer']} failed it and went on: the ranks are out of step, the launch was stopped")
