"""One side of an upstream's tests, run with the upstream's own launch until every selected test has an outcome or the
time budget is spent.

A launch is ``torchrun --nproc-per-node N -m pytest`` (or plain ``pytest``) in the side's folder, with the reporter
(site/) on the path and upstream CI's ``-m`` and options. Two stops are lifted, because every test's outcome is
wanted: ``--maxfail`` (NeMo-RL's addopts stop at the first failure) and the stop at a module that fails to collect
(``--continue-on-collection-errors``: that module is one ``error``). When a launch dies inside a test (a crash, a hung
collective the reporter ended), that test gets its outcome, ``crashed`` or ``timeout``, and the next launch goes on
after it: one bad test does not cost the rest. Tests that refused the world size they ran at (a skip that names
another, ``launch with torchrun --nproc-per-node=4``; Megatron's parallel set-up refusing it) are launched again at
the size they ask for, and only those runs decide them: one no launch there reached is not run, never its refusal read
as a skip or a failure. With a time budget, the first launches of a torchrun side stop at 65% of it so that these have
the rest, and what they leave of it goes back to the tests the first launches did not reach. A plain pytest side never
launches at another size: its first launches have the whole budget.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from . import step
from ... import progress
from ...errors import CommandError
from ...runner import spawn
from ...series.testspin import TestsPin
from .results import (Outcome, console_tail, console_why, launch_argv, launch_folders, read_launch, unmet_note,
                      unmet_world)
from .taken import BUDGET_BEFORE, BUDGET_SPENT, BUDGET_WHILE, KILLED_FOR_BUDGET, replay, take

SITE = Path(__file__).resolve().parent / "site"
MAX_LAUNCHES = 200  # a side whose every launch dies in a new test still ends
# pytest's exit code for a session it refused to start (a conftest that does not import, an option
# it does not know): the same on every launch, so never launched again.
PYTEST_USAGE_ERROR = 4


@dataclass
class Side:
    """How one side runs: its folder, interpreter, paths and limits."""
    name: str                       # pristine | patched | a bisection probe's name
    pin: TestsPin
    folder: Path
    files: list[str]                # relative to the folder (the selection), run in this order
    pythonpath: list[str]
    out: Path
    python: str = sys.executable
    nproc: int | None = None        # None: the pin's
    deadline: float | None = None   # time.monotonic() by which the side stops
    test_timeout: float = 900.0
    shared_gpu: bool = False
    only: list[str] | None = None   # run just these test ids (a probe)
    compared: frozenset[str] = frozenset()   # test ids an earlier run compared (--compared): passed over
    worlds: dict[str, int] = field(default_factory=dict)   # test id -> the ranks a run found it asks for
    step_grace: float = step.GRACE  # a rank still in a test this long after a peer failed it and left is behind

    def asked_elsewhere(self, world: int) -> dict[str, int]:
        """Tests asking for another size than WORLD (launched at it at once): a probe's own, or (torchrun) those of the
        side's files --compared runs told of (Compared.asks; _launches passes over one compared), never another's."""
        heads = {from_cwd(self, f) for f in self.files} if self.only is None and self.pin.launch == "torchrun" else ()
        mine = set(self.only) if self.only is not None else {i for i in self.worlds if i.split("::", 1)[0] in heads}
        return {i: n for i, n in self.worlds.items() if n != world and i in mine}


@dataclass
class SideResult:
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    not_run: dict[str, str] = field(default_factory=dict)            # id or file -> why
    collect_errors: dict[str, str] = field(default_factory=dict)
    deselected: dict[str, str] = field(default_factory=dict)
    launches: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"outcomes": {k: v.to_dict() for k, v in sorted(self.outcomes.items())},
                "not_run": dict(sorted(self.not_run.items())), "collect_errors": self.collect_errors,
                "deselected": self.deselected, "launches": self.launches}

    @classmethod
    def from_dict(cls, d: dict) -> SideResult:
        """A side as to_dict wrote it (a result.json's "sides"); KeyError or TypeError where it is not whole."""
        return cls({k: Outcome(**o) for k, o in d["outcomes"].items()}, dict(d["not_run"]), dict(d["collect_errors"]),
                   dict(d.get("deselected", {})), list(d["launches"]))

    def asked(self) -> dict[str, int]:
        """Each test whose outcome came from a launch at another size than the side's first: the size it asked for
        (a size one of the side's launches had: an outcome a result wrote without its size reads as 1)."""
        sizes = [x.get("world") for x in self.launches]
        return {i: o.world for i, o in self.outcomes.items() if o.world in sizes[1:] and o.world != sizes[0]}


LAUNCH_TRIES = 4
RESERVE = 0.35  # of a side's time budget, kept for the tests that ask for another world size


def run_side(side: Side) -> SideResult:
    res = SideResult()
    if not side.files:   # every selected file is the other side's only (pytest given none would run them all)
        return res
    world = side.nproc or side.pin.nproc
    full = side.deadline
    reserve = full is not None and side.pin.launch == "torchrun"   # only torchrun launches again at another size
    if reserve:  # the first launches stop early enough for the re-launches to have time
        side.deadline = time.monotonic() + (full - time.monotonic()) * (1 - RESERVE)
    asked = side.asked_elsewhere(world)
    try:
        _launches(side, res, world, side.only and [i for i in side.only if i not in asked], resume=asked)
    finally:
        side.deadline = full
    for n in sorted(set(asked.values())):
        _launches(side, res, n, [i for i, m in asked.items() if m == n])
    _at_their_size(side, res)
    if reserve:
        _resume(side, res, world)
        # a test the resumed launches reached first may refuse that size too (2026-12-05, H100: test_mamba.py's
        # "world_size (4) is not divisible by 8" stood as a failure): its outcome is no verdict either
        _at_their_size(side, res)
    return res


def _at_their_size(side: Side, res: SideResult) -> None:
    """The tests whose outcome refuses the world size they ran at, launched again at the size they ask for."""
    again: dict[int, list[str]] = {}
    for nodeid, o in res.outcomes.items():
        n = unmet_world(o, side.pin.nproc)
        if n and side.pin.launch == "torchrun":
            again.setdefault(n, []).append(nodeid)
    for n, ids in sorted(again.items()):
        progress.say(f"{side.pin.upstream} {side.name}: {len(ids)} test(s) ask for {n} ranks: launching them so")
        # What a test gave at a size it refuses decides nothing: only a launch at the size it asks for
        # gives it an outcome; one that gives none (the budget spent first, the launch failed) leaves it
        # not run, with both reasons, never the refusal read as a skip or a known failure.
        asked = {i: res.outcomes.pop(i) for i in ids}
        _launches(side, res, n, ids)
        for i, o in asked.items():
            if i not in res.outcomes:
                res.not_run[i] = unmet_note(n, o, f": {res.not_run.get(i, 'none reached it')}")


def _resume(side: Side, res: SideResult, world: int) -> None:
    """What the re-launches left of the budget goes back to the tests the first launches' share of it
    left without an outcome (one cut while it ran starts again), at the first size, past every test
    that has one."""
    left = [k for k, why in res.not_run.items()
            if k not in res.outcomes and why in (BUDGET_SPENT, BUDGET_WHILE, BUDGET_BEFORE)]
    if not left or side.deadline is None or side.deadline <= time.monotonic():
        return
    for k in left:
        del res.not_run[k]
    progress.say(f"{side.pin.upstream} {side.name}: {len(left)} test(s) not reached in the first launches' share "
                 f"of the budget: launching them with the {side.deadline - time.monotonic():.0f} s left")
    # past every test that has an outcome, and every other one not run for its own reason (a test that
    # asks for another world size is never run again at this one)
    _launches(side, res, world, side.only, resume=set(res.outcomes) | set(res.not_run))


def _launches(side: Side, res: SideResult, world: int, only: list[str] | None, resume: Iterable[str] = ()) -> None:
    """Launch at ``world`` ranks until the launch finishes, resuming past tests it died in (and past
    RESUME, the tests that have an outcome already)."""
    done: set[str] = set(resume) | side.compared
    wanted = set(only) if only is not None else None
    for i in range(MAX_LAUNCHES):
        if wanted is not None and not wanted - done:   # a launch that ended between tests after its last one
            return
        folder = side.out / f"launch-{len(res.launches) + 1:02d}-n{world}"
        left = None if side.deadline is None else side.deadline - time.monotonic()
        if left is not None and left <= 0:
            _not_reached(res, side, wanted, done, BUDGET_SPENT)
            return
        began = time.time()
        rc, timed_out, seconds = _launch(side, folder, world, sorted(done), only, left, _files_left(side, wanted, done))
        took = take(res, folder, world, rc=rc, seconds=seconds, began=began, timed_out=timed_out)
        progress.checkpoint(f"upstream-{side.name}-launch-{len(res.launches)}-taken")   # (a run cut between launches)
        got, died, cut = took.got, took.died, took.cut
        done |= got.tests.keys()
        done -= cut
        done |= set(died.values())   # each has its outcome now (crashed, timeout) or is not run (the budget)
        again = f"; {', '.join(sorted(cut))}: cut short when the launcher stopped the other ranks, run again" if cut else ""
        if wanted is None and got.collected:
            wanted = set(got.collected)
        if timed_out:
            _not_reached(res, side, wanted, done, BUDGET_BEFORE)
            return
        if got.stopped:   # a rank left behind in a test a peer failed: that test keeps its failure
            progress.say(f"{side.pin.upstream} {side.name}: rank {got.stopped['rank']} was left behind in "
                         f"{got.stopped['test']}: launch stopped; going on after it{again}")
            _last(side, {got.stopped["test"].split("::", 1)[0]})
            continue
        if len(got.finished) >= len(got.ranks) and got.ranks and not died:
            if got.astray and got.tests:   # ended, but what some tests said is no verdict (a broken CUDA context)
                progress.say(f"{side.pin.upstream} {side.name}: {len(got.astray)} test(s) ran where their records "
                             f"do not count ({next(iter(got.astray.values()))[:160]}); launching them again")
                continue
            _not_reached(res, side, wanted, done, f"the session ended (exit {rc}) without running it")
            return
        if not died:
            took.entry["error"] = console_tail(folder / "console.log")
            last = console_why(folder / "console.log")
            if not got.tests:
                _not_reached(res, side, wanted, done, f"the launch ended (exit {rc}) before any test ended: {last}")
                return
            progress.say(f"{side.pin.upstream} {side.name}: the launch ended between tests (exit {rc}): {last}; "
                         f"going on after the {len(got.tests)} that ended{again}")
            continue
        progress.say(f"{side.pin.upstream} {side.name}: the launch died in {', '.join(sorted(set(died.values())))}; "
                     f"going on after it{again}, its file's other tests after every other file's")
        _last(side, {nodeid.split("::", 1)[0] for nodeid in died.values()})
    _not_reached(res, side, wanted, done, f"more than {MAX_LAUNCHES} launches died")


def _last(side: Side, heads: set[str]) -> None:
    """The files whose tests a launch died in go after every other (pytest runs its files in the order
    given): one whose tests time out one by one no longer spends a side's budget before the rest
    (resharding/test_model_swap.py spent a whole shard's, h100/2026-12-05-shards)."""
    hit = [f for f in side.files if f in heads or from_cwd(side, f) in heads]
    side.files = [f for f in side.files if f not in hit] + hit


def _files_left(side: Side, wanted: set[str] | None, done: set[str]) -> list[str]:
    """The selected files that still hold a test this launch may run, in the side's order (an 8-rank launch
    for 15 tests had collected all 96 files of its shard, h100/2026-12-05-shards); before any said, all."""
    if wanted is None:
        return side.files
    heads = {nodeid.split("::", 1)[0] for nodeid in wanted - done}
    files = [f for f in side.files if from_cwd(side, f) in heads]
    return files or side.files   # never none: pytest given no file would run every test it finds


def _not_reached(res: SideResult, side: Side, wanted: set[str] | None, done: set[str], why: str) -> None:
    if wanted is None:  # nothing was ever collected: name the files
        for f in side.files:
            res.not_run.setdefault(f, why)
        return
    for nodeid in sorted(wanted - done - res.outcomes.keys()):
        res.not_run.setdefault(nodeid, why)


def from_cwd(side: Side, path: str) -> str:
    """A selected file's path as pytest, started in the pin's cwd, names it (NeMo-RL's: without tests/)."""
    cwd = side.pin.cwd.rstrip("/")
    return path if cwd == "." else path.removeprefix(cwd + "/")


def command(side: Side, world: int, files: list[str]) -> list[str]:
    pin = side.pin
    pytest = ["-m", "pytest", "-p", "carry_upstream_report", "--maxfail=1000000", "--continue-on-collection-errors"]
    if pin.markers:
        pytest += ["-m", pin.markers]
    pytest += list(pin.args)
    pytest += [from_cwd(side, f) for f in files]
    if pin.launch == "torchrun":
        return [side.python, "-m", "torch.distributed.run", "--nproc-per-node", str(world),
                "--master-port", str(_free_port()), *pytest]
    return [side.python, *pytest]


def replayed(side: Side) -> SideResult:
    """What the launches a cut run left in ``side.out`` recorded (taken.replay), judged by the side's selection."""
    folders = launch_folders(side.out)
    ran = first_files(side, folders[0][0]) if folders else None
    return replay(side, SideResult(), ran, [from_cwd(side, f) for f in side.files])


def first_files(side: Side, folder: Path) -> list[str] | None:
    """The test files the launch in FOLDER was given, as its command (command.txt, or its console.log's first
    line) names them: what follows the arguments ``command`` gives every launch; None where neither is kept."""
    argv = launch_argv(folder)
    if argv is None:
        return None
    return argv[len(command(side, side.nproc or side.pin.nproc, [])):]


def _launch(side: Side, folder: Path, world: int, skip: list[str], only: list[str] | None,
            limit: float | None, files: list[str]) -> tuple[int | None, bool, float]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "skip.txt").write_text("".join(f"{x}\n" for x in skip))
    env = dict(os.environ)
    env.update(CARRY_UT_OUT=str(folder), CARRY_UT_SKIP=str(folder / "skip.txt"),
               CARRY_UT_TEST_TIMEOUT=str(side.test_timeout),
               PYTHONPATH=os.pathsep.join([str(SITE), *side.pythonpath, env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    env.pop("CARRY_UT_ONLY", None)
    if only is not None:
        (folder / "only.txt").write_text("".join(f"{x}\n" for x in only))
        env["CARRY_UT_ONLY"] = str(folder / "only.txt")
    if side.shared_gpu:
        env["CARRY_SHARED_GPU"] = "1"
        if side.pin.launch == "torchrun":
            env["CARRY_UT_DEVICES"] = str(world)
    argv = command(side, world, files)
    cwd = side.folder / side.pin.cwd
    (folder / "pythonpath.txt").write_text("".join(f"{x}\n" for x in env["PYTHONPATH"].split(os.pathsep)))
    t0 = time.monotonic()
    # A temporary folder of the launch's own: upstream tests share paths under it between their ranks
    # (Megatron-LM's checkpoint tests write to <tmp>/pytest-of-USER/tmp_dist_ckpt and rank 0 deletes it
    # after), so two sides running at once on one host would delete each other's checkpoints. Short:
    # sockets are made under it.
    tmp = tempfile.mkdtemp(prefix="carry-ut-")
    env["TMPDIR"] = tmp
    try:
        for attempt in range(1, LAUNCH_TRIES + 1):
            left = None if limit is None else limit - (time.monotonic() - t0)
            rc, timed_out, seconds = _spawn_and_wait(side, folder, world, argv, cwd, env, left, t0)
            # The launcher failed before any rank began a test (a port found free and then taken by another run
            # on the host; a rendezvous refused while the host is out of processes or threads): nothing ran, so
            # launch again, on another port, after a pause that grows; one that fails so every time ends with its
            # tests not run. pytest's own refusal (a conftest that does not import) is not the launcher's: not again.
            started = read_launch(folder, world).began   # being stopped is no start (a peer's plugin failed, 2026-12-06)
            pause = 2.0 ** attempt
            if timed_out or started or rc == 0 or attempt == LAUNCH_TRIES or _pytest_refused(side, rc, folder) or \
                    (limit is not None and time.monotonic() - t0 + pause >= limit):
                return rc, timed_out, seconds
            last = console_why(folder / "console.log")
            (folder / "console.log").rename(folder / f"console.try-{attempt}.log")
            for path in folder.glob("rank-*.jsonl"):   # what the stopped ranks wrote: kept, out of the next try's way
                path.rename(folder / f"try-{attempt}.{path.name}")
            progress.say(f"{side.pin.upstream} {side.name}: the launcher failed before any test began "
                         f"(exit {rc}): {last}; launching again in {pause:.0f} s")
            time.sleep(pause)
            argv = command(side, world, files)
        return rc, timed_out, seconds
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _spawn_and_wait(side: Side, folder: Path, world: int, argv: list[str], cwd: Path, env: dict, limit: float | None,
                    t0: float) -> tuple[int | None, bool, float]:
    with open(folder / "console.log", "wb") as log:
        head = "$ cd " + shlex.quote(str(cwd)) + " && " + shlex.join(argv) + "\n"
        log.write(head.encode())
        (folder / "command.txt").write_text(head)   # kept where a packed run keeps only the console's tail
        log.flush()
        try:
            proc = spawn(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                         start_new_session=True)
        except CommandError as exc:
            log.write(f"could not start: {exc.message}\n".encode())
            return None, False, 0.0
        try:
            with progress.ticking(f"{side.pin.upstream} {side.name} ({world} rank(s))",
                                  lambda: f"{_ended(folder)} test(s) ended", every=60.0):
                rc = step.Watch(folder, side.step_grace).wait(proc, limit, log, _kill) if world > 1 else \
                    proc.wait(timeout=limit)
            return rc, False, time.monotonic() - t0
        except subprocess.TimeoutExpired:
            _kill(proc)
            log.write(f"\n{KILLED_FOR_BUDGET}\n".encode())
            return proc.returncode, True, time.monotonic() - t0
        except BaseException:
            _kill(proc)
            raise


def _pytest_refused(side: Side, rc: int | None, folder: Path) -> bool:
    """Whether pytest itself refused the session (its usage error): plain pytest's exit code, or, under
    torchrun, the ranks' exit codes in torchrun's summary of the failed ranks: the usage error, and
    no other but the signal torchrun stopped the remaining ranks with."""
    if side.pin.launch != "torchrun":
        return rc == PYTEST_USAGE_ERROR
    try:
        text = (folder / "console.log").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    codes = {int(c) for c in re.findall(r"^\s*exitcode\s*:\s*(-?\d+)", text, re.M)}
    return PYTEST_USAGE_ERROR in codes and all(c == PYTEST_USAGE_ERROR or c < 0 for c in codes)


def _kill(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=15)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def _ended(folder: Path) -> int:
    try:
        return max((p.read_text(errors="replace").count('"ev": "end"') for p in folder.glob("rank-*.jsonl")),
                   default=0)
    except OSError:
        return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
