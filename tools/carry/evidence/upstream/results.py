"""What the ranks of one launch reported (site/carry_upstream_report.py), read and merged per test.

A test's outcome over the ranks: ``failed`` if any rank failed it, else ``error`` if any rank errored
(a fixture, a teardown), else ``passed`` if any rank passed it (a rank may skip its share),
else the outcome all ranks agree on (``skipped`` with the first rank's reason). A test a rank began
and never ended is ``crashed`` (the launch died in it: a segfault, a rank killed) or ``timeout``
(the reporter's watchdog ended it), with what the console said last (read here too: the line that says
why a launch ended, and whether faulthandler ended a rank that held the GIL).

Only the records of ranks in step count: a test that some rank of the launch never began because it was
left behind (still in an earlier test another rank had failed and left) ran without that rank, so what
the others said of it is no verdict (``Launch.astray``) and it runs again; so are the tests a rank ran after its
CUDA context broke (a device-side assert: every later CUDA call of the process fails alike). Upstream's tests fail on one
rank and leave the others waiting in a collective: the ranks that went on reported the next tests' NCCL
set-up timing out, as failures (h100/2026-12-05-shards: 48 such records, 29 of them "passed" on two ranks
of four).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

FAILING = ("failed", "error", "crashed", "timeout")
ORDER = ("failed", "error", "crashed", "timeout", "xpassed", "passed", "xfailed", "skipped")
# A skip that asks for another launch: "launch with torchrun --nproc-per-node=4", "Requires world_size=4".
_WORLD = re.compile(r"nproc[-_]per[-_]node[= ](\d+)|world[_ ]size[= ](\d+)", re.I)
# A failure that does: Megatron's initialize_model_parallel refusing the launch's world size, "world_size (4) is
# not divisible by 8" or "... by expert_tensor_model_pipeline_parallel size (8)" (megatron/core/parallel_state.py).
_INDIVISIBLE = re.compile(r"world_size \((\d+)\) is not divisible by (?:[a-z_ ]+\()?(\d+)")
# Or its HyperCommGrid refusing a grid larger than the ranks there are past its offset: "Grid shape [2, 2, 2, 1] is
# over sized with world size 4 and rank offset 0" (megatron/core/hyper_comm_grid.py): it needs offset + 2*2*2*1.
_GRID = re.compile(r"Grid shape \[(\d+(?:,\s*\d+)*)\] is over sized with world size (\d+) and rank offset (\d+)")
# Or a skip (or the test's own assertion) that names the devices it needs, "Requires 8 GPUs, got 4", "Requires exactly
# 2 GPUs (DP=2)" (Megatron-LM's tests; device_count() answers a shared-GPU launch's ranks), or sets what its sizes need
# against those it saw: "... > torch.cuda.device_count() (8 > 4)" (data/test_get_batch.py), "TP (2) * PP (4) > 4"
_NEEDS = re.compile(r"\brequire[sd]?\s+(?:at least\s+|exactly\s+|specifically\s+)?(\d+)\s+(?:GPUs?|CUDA devices?|devices|ranks)\b", re.I)
_COUNT_OVER = re.compile(r"device_count\(\)\s*\((\d+)\s*>\s*(\d+)\)")
_SIZES_OVER = re.compile(r"((?:[A-Za-z_]+\s*\(\d+\)\s*\*\s*)+[A-Za-z_]+\s*\(\d+\))\s*>\s*(\d+)\b")


@dataclass
class Outcome:
    outcome: str
    reason: str = ""
    phase: str = ""
    seconds: float = 0.0
    ranks: dict[str, str] = field(default_factory=dict)   # rank -> its outcome
    world: int = 1

    def to_dict(self) -> dict:
        return {"outcome": self.outcome, "reason": self.reason, "phase": self.phase,
                "seconds": round(self.seconds, 3), "ranks": self.ranks, "world": self.world}


@dataclass
class Launch:
    """One launch's reports: per test the ranks' records, what began and never ended, how it ended."""
    world: int
    tests: dict[str, dict[str, dict]] = field(default_factory=dict)    # id -> rank -> end record
    started: dict[str, list[str]] = field(default_factory=dict)         # rank -> ids begun, in order
    timeouts: dict[str, str] = field(default_factory=dict)              # rank -> id
    terminated: dict[str, str] = field(default_factory=dict)            # rank -> id it was in (SIGTERM)
    collect_errors: dict[str, str] = field(default_factory=dict)        # node -> reason
    collect_skips: dict[str, str] = field(default_factory=dict)         # module -> why it skipped whole
    deselected: dict[str, str] = field(default_factory=dict)            # id -> by whom
    finished: set[str] = field(default_factory=set)                     # ranks that ended their session
    collected: list[str] = field(default_factory=list)                  # what the launch meant to run
    ranks: set[str] = field(default_factory=set)
    astray: dict[str, str] = field(default_factory=dict)                # id -> why its records do not count
    astray_records: dict[str, dict[str, dict]] = field(default_factory=dict)   # id -> rank -> end record
    stopped: dict = field(default_factory=dict)                         # the launcher's STOPPED record
    began: bool = False    # a rank wrote anything but that it was stopped: its session began (an empty collection too)
    began_first: dict[str, float] = field(default_factory=dict)         # rank -> when it began its first test
    boots: dict[str, dict] = field(default_factory=dict)                # rank -> its boot record (the reporter's)
    collected_at: dict[str, float] = field(default_factory=dict)        # rank -> when its collection ended
    last_record: float | None = None                                    # wall clock: the last line any rank wrote

    @property
    def first_start(self) -> float | None:
        """Wall clock: the first test a rank began."""
        return min(self.began_first.values(), default=None)

    def timing(self, began: float, seconds: float) -> dict:
        """Of a launch that began at BEGAN (wall clock) and took SECONDS: the seconds before any rank began a
        test (the interpreter, imports, collection, session fixtures) and after the last record (the ranks'
        and the launcher's ends): what each launch costs besides its tests. One in which no rank began a test
        (a collection that failed, a launcher that did not start) spent all of it so: its start-up."""
        if self.first_start is None or self.last_record is None:
            return {"startup_s": round(seconds, 1), "wind_down_s": 0.0}
        return {"startup_s": round(self.first_start - began, 1),
                "wind_down_s": round(began + seconds - self.last_record, 1), **self._startup_parts(began)}

    def _startup_parts(self, began: float) -> dict:
        """The start-up in its parts as the lowest rank whose records tell them saw it (a reporter that writes
        ``boot``), until that rank began its first test: ``launcher`` (until its process began: the launcher's
        own start, to the second the kernel gives), ``interpreter`` (Python and pytest, until the reporter was
        imported), ``imports`` (the other plugins and upstream's conftests: torch, the package under test),
        ``collection`` (the test modules) and ``fixtures`` (session fixtures, until its first test). They add
        up to that rank's start-up: startup_s, or a little more where another rank began a test first."""
        for rank in sorted(self.boots, key=lambda r: (len(r), r)):
            boot, collected, first = self.boots[rank], self.collected_at.get(rank), self.began_first.get(rank)
            born, imported, configured = boot.get("born"), boot.get("imported"), boot.get("t")
            if collected is None or first is None or not all(isinstance(x, (int, float))
                                                             for x in (born, imported, configured)):
                continue
            return {"startup_parts_s": {"launcher": round(born - began, 1), "interpreter": round(imported - born, 1),
                                        "imports": round(configured - imported, 1),
                                        "collection": round(collected - configured, 1),
                                        "fixtures": round(first - collected, 1)}}
        return {}

    def unfinished(self) -> dict[str, str]:
        """Per rank, the test it began and never ended (where it died), if any."""
        out = {}
        for rank, ids in self.started.items():
            for nodeid in reversed(ids):
                if rank not in self.tests.get(nodeid, {}) and rank not in self.astray_records.get(nodeid, {}):
                    out[rank] = nodeid
                    break
        return out

    def died_in(self) -> tuple[dict[str, str], set[str]]:
        """(blamed, cut): per rank, the test a death is charged to, and the tests to run again because
        a rank the launcher stopped was cut short in them. torchrun sends SIGTERM to every other rank
        when one dies, or ends its session with a non-zero exit (pytest's 1 when a test failed there):
        a rank so stopped wrote ``terminated`` with the test it was in, which did not kill it. A rank
        that died of itself (no ``terminated``) is blamed on its test. A cut test that a rank which
        ended it already failed keeps that failure. If no rank died of itself and none ended its
        session (every rank stopped from outside: the launcher's timeout, a test that signals its
        own launch), each rank's death is blamed on its test, as when no rank said anything. Unless
        the launcher wrote why it stopped them (STOPPED: a rank left behind in a test a peer had failed
        and left): then every test a rank was in runs again, but the one a peer failed keeps that failure."""
        died = self.unfinished()
        own = {rank: nodeid for rank, nodeid in died.items() if rank not in self.terminated}
        if self.stopped:   # the launcher stopped every rank (a rank left behind): nobody died of itself
            own = {}
        elif not own and not self.finished:
            return died, set()
        cut = {nodeid for rank, nodeid in died.items() if rank not in own} - set(own.values())
        return own, {t for t in cut if not (t in self.tests and is_failing(merge(self.tests[t], self.world).outcome))}


def rank_of(path: Path) -> str:
    """The rank whose records a file holds: rank-<RANK>.jsonl, gzipped or not."""
    return path.name.split(".", 1)[0].split("-", 1)[1]


# What the launcher writes in a launch's folder when it stops the launch itself (step.Watch): which rank
# was left behind in which test, and the peer that failed it and went on.
STOPPED = "stopped.json"


def read_launch(folder: Path, world: int) -> Launch:
    """A launch's records, its ranks' files as the reporter wrote them or gzipped (an archived run's);
    the tests some rank never began are set apart (``astray``), not merged."""
    launch = Launch(world)
    if (folder / STOPPED).is_file():
        launch.stopped = json.loads((folder / STOPPED).read_text())
    for path in sorted([*folder.glob("rank-*.jsonl"), *folder.glob("rank-*.jsonl.gz")]):
        rank = rank_of(path)
        launch.ranks.add(rank)
        raw = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
        for line in raw.decode("utf-8", errors="replace").splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue  # a line cut by the kill
            kind, nodeid, t = ev.get("ev"), ev.get("id", ""), ev.get("t")
            if kind == "boot":   # before the session: not that it began, nor a record of it (timing reads it)
                launch.boots[rank] = ev
                continue
            launch.began |= kind != "terminated"
            if isinstance(t, (int, float)):
                launch.last_record = max(launch.last_record or t, t)
            if kind == "start":
                launch.started.setdefault(rank, []).append(nodeid)
                if isinstance(t, (int, float)):
                    launch.began_first.setdefault(rank, t)
            elif kind == "end":
                launch.tests.setdefault(nodeid, {})[rank] = ev
            elif kind == "timeout":
                launch.timeouts[rank] = nodeid
            elif kind == "terminated":
                launch.terminated[rank] = nodeid
            elif kind == "collect-error":
                launch.collect_errors.setdefault(nodeid, ev.get("reason", ""))
            elif kind == "collect-skip":
                launch.collect_skips.setdefault(nodeid, ev.get("reason", ""))
            elif kind == "deselected":
                launch.deselected.setdefault(nodeid, ev.get("by", ""))
            elif kind == "collected":
                launch.collected = launch.collected or list(ev.get("ids", []))
                if isinstance(t, (int, float)):
                    launch.collected_at.setdefault(rank, t)
            elif kind == "finish":
                launch.finished.add(rank)
    _set_astray(launch)
    _set_poisoned(launch)
    return launch


def _set_astray(launch: Launch) -> None:
    """The tests whose records do not count, moved from ``tests`` to ``astray`` with why: those a rank of
    the launch never began because it was left behind, still in an earlier test that another rank had
    failed and left (waiting in the collective the failing rank never reached). A rank that is merely slow,
    or died in a test of its own, leaves the others' records as they are: a test of theirs that needed it
    waited for it (and was cut short when the launch ended), one that ended did not need it."""
    began: dict[str, set[str]] = {}
    for rank, ids in launch.started.items():
        for nodeid in ids:
            began.setdefault(nodeid, set()).add(rank)
    left = {rank: where for rank, where in launch.unfinished().items()
            if any(is_failing(rec.get("outcome", "error")) for peer, rec in launch.tests.get(where, {}).items()
                   if peer != rank)}
    for nodeid in list(launch.tests):
        behind = sorted((r for r in left if r not in began.get(nodeid, set())), key=lambda r: (len(r), r))
        if behind:
            launch.astray[nodeid] = (f"its ranks were out of step: rank {behind[0]} never began it, still in "
                                     f"{left[behind[0]]}, which a peer had failed and left; no launch ran it in step")
            launch.astray_records[nodeid] = launch.tests.pop(nodeid)


# A CUDA error that leaves a process's CUDA context unusable: every later CUDA call of that rank fails alike,
# whatever its test does (h100/2026-12-06-first-of-kind: 32 tests of test_cuda_graphs.py, on both sides, after one)
STICKY_CUDA = re.compile(r"CUDA error: (?:device-side assert triggered|an illegal memory access was encountered|"
                         r"unspecified launch failure|misaligned address|an illegal instruction was encountered)")


def _set_poisoned(launch: Launch) -> None:
    """The tests a rank ran after its CUDA context broke (STICKY_CUDA), moved from ``tests`` to ``astray``: what
    they said is the broken context's, no verdict; they run again in a new launch. The test in which a rank
    first met the broken context counts only where it was the first test that rank ran in the launch (a fresh
    context): after others, the error may be an earlier test's (CUDA reports a kernel's failure at a later
    call), and it runs again, first in a new launch, where it tells."""
    for rank, ids in launch.started.items():
        reasons = [(launch.tests.get(i) or launch.astray_records.get(i) or {}).get(rank, {}).get("reason") or ""
                   for i in ids]
        broke = next((n for n, why in enumerate(reasons) if STICKY_CUDA.search(why)), None)
        if broke is None:
            continue
        error = STICKY_CUDA.search(reasons[broke])[0]
        for n, nodeid in enumerate(ids[broke:], start=broke):
            if n == 0 or nodeid not in launch.tests:   # the launch's first test met a fresh context: it tells
                continue
            launch.astray[nodeid] = (
                f"rank {rank} met a broken CUDA context in it ({error}) after other tests of its launch: the "
                "error may be an earlier test's; it runs again, first in a new launch" if n == broke else
                f"it ran on rank {rank} after {ids[broke]} broke that rank's CUDA context ({error}): every later "
                "CUDA call there fails alike; no verdict, it runs again in a new launch")
            launch.astray_records[nodeid] = launch.tests.pop(nodeid)


LAUNCH_FOLDER = re.compile(r"launch-(\d+)-n(\d+)")


def launch_folders(side_out: Path) -> list[tuple[Path, int]]:
    """A side's launch folders in the order they ran, each with its world size."""
    found = []
    for path in side_out.glob("launch-*-n*"):
        m = LAUNCH_FOLDER.fullmatch(path.name)
        if m and path.is_dir():
            found.append((int(m.group(1)), path, int(m.group(2))))
    return [(path, world) for _, path, world in sorted(found)]


def merge(records: dict[str, dict], world: int) -> Outcome:
    """One test's outcome over the ranks that ended it."""
    by_rank = {rank: rec.get("outcome", "error") for rank, rec in sorted(records.items())}
    outcomes = set(by_rank.values())
    for choice in ("failed", "error"):
        if choice in outcomes:
            break
    else:
        choice = "passed" if "passed" in outcomes else min(outcomes, key=ORDER.index)
    first = next(rec for rank, rec in sorted(records.items()) if by_rank[rank] == choice)
    return Outcome(choice, first.get("reason", ""), first.get("phase", ""),
                   max(float(r.get("seconds", 0) or 0) for r in records.values()), by_rank, world)


def wants_world(outcome: Outcome) -> int | None:
    """The world size a test asks to be launched with, if it says so: a skip that names it or the devices it needs
    (a launch of that many ranks answers its device count so); a failure of the parallel state's set-up that refuses
    the world it ran at (its parallel sizes need that many ranks), or its own assertion of the devices it needs."""
    if outcome.outcome == "skipped":
        m = _WORLD.search(outcome.reason)
        if m:
            return int(m.group(1) or m.group(2))
        return _needs(outcome)
    if is_failing(outcome.outcome):
        m = _INDIVISIBLE.search(outcome.reason)
        if m and int(m.group(1)) == outcome.world and int(m.group(2)) > outcome.world:
            return int(m.group(2))
        g = _GRID.search(outcome.reason)
        if g and int(g.group(2)) == outcome.world:
            need = int(g.group(3)) + math.prod(int(x) for x in g.group(1).split(","))
            return need if need > outcome.world else None
        return _needs(outcome) if outcome.reason.startswith("AssertionError") else None
    return None


def _needs(outcome: Outcome) -> int | None:
    """The devices OUTCOME's reason says its test needs, or the product of its sizes set against the devices it saw
    at the world it ran at (a count not the launch's is another launch's)."""
    m = _NEEDS.search(outcome.reason)
    if m:
        return int(m.group(1))
    c = _COUNT_OVER.search(outcome.reason)
    if c and int(c.group(2)) == outcome.world:
        return int(c.group(1))
    s = _SIZES_OVER.search(outcome.reason)
    if s and int(s.group(2)) == outcome.world:
        return math.prod(int(x) for x in re.findall(r"\((\d+)\)", s.group(1)))
    return None


def unmet_world(outcome: Outcome, most: int) -> int | None:
    """The world size a test asks for (wants_world), where it ran at another and its upstream's CI launches that
    many: at most MOST ranks (the tests pin's nproc, upstream CI's ranks a node). Its outcome at the size it ran at
    is a refusal, not a verdict. A test that asks for more ranks than CI has is skipped there too: its own skip,
    with its reason, stands."""
    n = wants_world(outcome)
    return n if n and n != outcome.world and n <= most else None


def unmet_note(n: int, refusal: Outcome, why: str) -> str:
    """Why a test that asked for N ranks (its REFUSAL at the size it ran at) has no outcome: no launch at N gave
    it one, WHY (what ended them)."""
    said = refusal.reason.splitlines()[0][:200] if refusal.reason else refusal.outcome
    return f"it asks for {n} ranks ({said} at {refusal.world}); no launch at {n} ranks gave it an outcome{why}"


def is_failing(outcome: str) -> bool:
    return outcome in FAILING


def signature(outcome: str) -> str:
    """What a bisection compares: ``failing``, ``passing``, or the outcome itself (skipped, not-run)."""
    return "failing" if is_failing(outcome) else "passing" if outcome in ("passed", "xpassed") else outcome


# -- what a launch's console says --------------------------------------------------------------------
def console_why(log: Path) -> str:
    """The line that says why a launch ended before a test did: pytest's own error line (``E   ...``)
    where it printed one (torchrun's summary of the failed ranks comes after it), else the last line."""
    lines = console_tail(log, n=200)
    errors = [line.strip() for line in lines if line.startswith("E   ")]
    return errors[-1] if errors else lines[-1] if lines else "no output"


# The first line faulthandler.dump_traceback_later writes (the reporter's fallback when the GIL never
# comes back to its timer): "Timeout (0:03:00)!".
# pytest may have left its line open (the test file's name, its dots): the line need not start there.
FAULTHANDLER_TIMEOUT = re.compile(r"(?:^|\s)Timeout \(\d+:\d\d:\d\d(?:\.\d+)?\)!$", re.M)


def gil_held_past_timeout(log: Path) -> bool:
    """Whether a rank of the launch was ended by the reporter's faulthandler fallback: its test held the
    GIL past the per-test timeout, so the reporter's timer could write no ``timeout`` record."""
    try:
        with log.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - (1 << 20)))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return False
    return bool(FAULTHANDLER_TIMEOUT.search(text))


def launch_argv(folder: Path) -> list[str] | None:
    """The command the launch in FOLDER ran, after its ``cd`` (command.txt, or its console.log's first line, as
    launch.py wrote them); None where neither is kept."""
    text = (folder / "command.txt").read_text() if (folder / "command.txt").is_file() else \
        console_head(folder / "console.log")
    if not text.startswith("$ cd ") or " && " not in text:
        return None
    return shlex.split(text.splitlines()[0].split(" && ", 1)[1])


def console_head(log: Path) -> str:
    """A launch console's first line: the command launch.py wrote there."""
    try:
        with log.open("rb") as f:
            return f.readline().decode("utf-8", errors="replace").rstrip("\n")
    except OSError:
        return ""


def console_tail(log: Path, n: int = 12) -> list[str]:
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    keep = [line for line in lines if line.strip() and not line.startswith("[carry] shared GPU")]
    return keep[-n:]
