"""What one launch's folder says, taken into its side's result: the one reading that the live launches
(launch.py) and the replay of a run that was cut make.

A run cut before it wrote its result (its machine taken back, the job killed) leaves each side's launch
folders (``OUT/UPSTREAM/SIDE/launch-NN-nW``) with the ranks' records. ``replay`` reads them in their order,
as the live run read each when it ended, so that what ran is judged instead of lost. It never gives a
verdict the records do not hold: a test the last launch was in when the run was cut is not run (the cut
is no crash), a test no launch reached is not run, and a test that refused its launch's world size is not
run unless a launch at the size it asks for gave it an outcome.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ...errors import UsageError
from .results import (Launch, Outcome, console_tail, gil_held_past_timeout, launch_folders, merge, read_launch,
                      unmet_note, unmet_world)

# Why a test has no outcome when the side's budget ended (the first launches' share of it, or all of it).
BUDGET_SPENT = "the side's time budget was spent before it ran"
BUDGET_WHILE = "the side's time budget ran out while it ran"
BUDGET_BEFORE = "the side's time budget ran out before it"
# Why, in a replay, a test has none.
CUT_WHILE = "the run was cut while it ran (the last launch's records end in it): not run"
CUT_BEFORE = "the run was cut before it: no launch's records reach it"
# What launch.py writes in a launch's console.log when the side's budget ran out and it killed the launch.
KILLED_FOR_BUDGET = "[carry] the side's time budget ran out: the launch was killed"


@dataclass
class Taken:
    got: Launch
    died: dict[str, str]   # rank -> the test its death is charged to
    cut: set[str]          # the tests to run again: the launcher stopped a rank in them
    entry: dict            # the launch's line in SideResult.launches


def take(res, folder: Path, world: int, *, rc: int | None, seconds: float | None, began: float | None,
         timed_out: bool, cut_run: bool = False) -> Taken:
    """Take the launch in FOLDER into RES (a SideResult): each test's outcome over its ranks, the
    collection's errors and skips, the tests the launch died in (``crashed``, ``timeout``: unless the
    side's budget killed the launch, or CUT_RUN, the run was cut while the launch ran: then not run)
    and the tests cut short by the launcher (no outcome: they run again)."""
    got = read_launch(folder, world)
    if began is None:   # a replay: the launch's span as its records tell it, from its first rank's birth
        born = [b["born"] for b in got.boots.values() if isinstance(b.get("born"), (int, float))]
        began = min([*born, *got.began_first.values()], default=got.last_record or 0.0)
        seconds = max(0.0, (got.last_record or began) - began)
    for nodeid, records in got.tests.items():
        res.outcomes[nodeid] = merge(records, world)
    res.collect_errors.update(got.collect_errors)
    for node, why in got.collect_skips.items():
        res.outcomes.setdefault(node, Outcome("skipped", why, "collect", 0.0, {}, world))
    for nodeid, by in got.deselected.items():
        if by == "upstream":
            res.deselected[nodeid] = by
    died, cut = got.died_in()
    for nodeid in cut:   # stopped by the launcher in it, not failed by it: it runs again after
        res.outcomes.pop(nodeid, None)
    entry = {"launch": folder.name, "world": world, "returncode": rc, "seconds": round(seconds, 1),
             "ended": len(got.tests), "timed_out": timed_out,
             "launcher_failures": len(list(folder.glob("console.try-*.log"))), **got.timing(began, seconds)}
    if got.astray:   # what ranks out of step said: no verdict, run again (results.Launch.astray)
        entry["out_of_step"] = got.astray
    if got.stopped:
        entry["stopped"] = got.stopped
    res.launches.append(entry)
    if timed_out or cut_run:
        # a test a rank was still in has no verdict, whatever the ranks that ended it said; in the last launch
        # of a cut run, neither has one the launcher cut short (no later launch ran it again)
        for nodeid in set(died.values()) | (cut if cut_run else set()):
            res.outcomes.pop(nodeid, None)
            res.not_run[nodeid] = BUDGET_WHILE if timed_out else CUT_WHILE
        return Taken(got, died, cut, entry)
    held = gil_held_past_timeout(console_of(folder))
    for nodeid in sorted(set(died.values())):
        timeout = nodeid in got.timeouts.values()
        tail = console_tail(console_of(folder))
        why = (f"ran past the per-test timeout: {tail[-1] if tail else ''}" if timeout else
               "ran past the per-test timeout holding the GIL: faulthandler ended the rank "
               "(its stacks are in the launch's console.log)" if held else
               f"the launch died in it{'' if rc is None else f' (exit {rc})'}: {tail[-1] if tail else ''}")
        res.outcomes[nodeid] = Outcome("timeout" if timeout or held else "crashed", why[:500], "call", 0.0,
                                       {r: "died" for r, x in died.items() if x == nodeid}, world)
    return Taken(got, died, cut, entry)


def replay(side, res, ran: list[str] | None, ours: list[str]):
    """Into RES (an empty launch.SideResult), what a cut run's launches in ``side.out`` recorded, ``side`` a
    launch.Side built as the run built it, RAN the files its first launch's command names (None: no command
    kept) and OURS the side's files as pytest names them. Its first launch was given every file of the side:
    one given other files was another selection (other --compared, --shard or --files), and is refused."""
    folders = launch_folders(side.out)
    if folders:
        _same_selection(side, folders[0], ran, ours)
    wanted: set[str] = set()
    killed = False
    for i, (folder, world) in enumerate(folders):
        killed = KILLED_FOR_BUDGET in "\n".join(console_tail(console_of(folder), n=5))
        took = take(res, folder, world, rc=None, seconds=None, began=None, timed_out=killed,
                    cut_run=not killed and i == len(folders) - 1)
        took.entry["replayed"] = True
        wanted |= set(took.got.collected)
    for nodeid, o in list(res.outcomes.items()):
        # its refusal of the size it ran at is no verdict, and no launch at N ran it
        if n := unmet_world(o, side.pin.nproc):
            del res.outcomes[nodeid]
            res.not_run[nodeid] = unmet_note(n, o, " before the run was cut")
    # what no launch reached: the side's budget ended it where its last launch was killed for it, else the cut
    why = BUDGET_BEFORE if killed else CUT_BEFORE
    for nodeid in sorted(wanted - res.outcomes.keys() - res.not_run.keys() - side.compared):
        res.not_run[nodeid] = why
    if not wanted:   # no launch said what it collected: the files are what was not run
        for f in side.files:
            res.not_run.setdefault(f, why)
    return res


def console_of(folder: Path) -> Path:
    """A launch's console: its console.log, or in a packed run the tail of it kept beside (console.tail.txt)."""
    log = folder / "console.log"
    return log if log.exists() or not (folder / "console.tail.txt").exists() else folder / "console.tail.txt"


def _same_selection(side, first: tuple[Path, int], ran: list[str] | None, ours: list[str]) -> None:
    """Refuse to judge a side's records by a selection other than the one they were run by (other --compared,
    --shard or --files): its first launch was given every file of the side (its command), or, where no
    command was kept, collected tests of no other file."""
    if ran is not None:
        extra, lacking = sorted(set(ran) - set(ours)), sorted(set(ours) - set(ran))
    else:
        extra, lacking = sorted({nodeid.split("::", 1)[0] for nodeid in read_launch(*first).collected} - set(ours)), []
    if extra or lacking:
        raise UsageError(f"{side.out}: that run's {side.name} side ran other test files than this selection ("
                         + "; ".join(x for x in (f"it ran {extra[0]}" if extra else "",
                                                 f"it did not run {lacking[0]}" if lacking else "") if x) + ")",
                         hint="judge it with the --compared, --look-again, --shard and --files it was run with")


def judgeable(out: Path) -> None:
    """Refuse (UsageError) a run in OUT (OUT/UPSTREAM) that --judge-records may not judge: one with no launch
    folder has nothing to judge (refused before anything is written); one whose result is written (its
    comparison, also one whose bisection was cut) is judged already, and judging its records again would
    overwrite that verdict with a lesser one."""
    if not any(launch_folders(out / side) for side in ("pristine", "patched")):
        raise UsageError(f"{out.name}: no launch left records in {out / 'pristine'} nor "
                         f"{out / 'patched'}: nothing ran there to judge",
                         hint="--out is the folder the cut run was given (its launches are OUT/UPSTREAM/SIDE/launch-*)")
    try:
        done = json.loads((out / "result.json").read_text())
    except (OSError, ValueError):
        return
    if isinstance(done, dict) and isinstance(done.get("rows"), list) and not done.get("judged_from_records"):
        raise UsageError(f"{out / 'result.json'} holds that run's comparison already ({done.get('status')}): "
                         "there is nothing to judge from its records",
                         hint="--judge-records is for a run that was cut before it wrote its result")
