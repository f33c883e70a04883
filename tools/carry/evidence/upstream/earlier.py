"""An earlier run's result.json read back as today's judge reads it: what the launch folders beside it tell
that the result itself may not (results written before they named it).

- ``out_of_step``: the tests whose only results came from ranks out of step (``results.Launch.astray``): a
  judge older than that took them for verdicts;
- ``markers``: the marker expression (pytest's ``-m``) its sides ran under, which decided what upstream
  deselected: a deselection counts only under today's expression (``verdict.Compared``). Written by each run
  since 2026-12-07; an older one's is read from its launches' commands, and is None where none is kept or
  they disagree (its deselections then count for nothing).
"""

from __future__ import annotations

from pathlib import Path

from .results import launch_argv, launch_folders, read_launch

SIDES = ("pristine", "patched")


def read_back(doc: dict, folder: Path) -> dict:
    """DOC (a result.json written in FOLDER), with what its launches beside it tell."""
    doc["out_of_step"] = sorted(set(doc.get("out_of_step") or []) | out_of_step_beside(folder))
    if "markers" not in doc:
        doc["markers"] = markers_beside(folder)
    return doc


def out_of_step_beside(folder: Path) -> set[str]:
    """The tests of a run's sides (FOLDER/pristine, FOLDER/patched, beside its result.json) whose only results
    came from ranks out of step: a judge older than ``Launch.astray`` took them for verdicts."""
    out: set[str] = set()
    for side in SIDES:
        astray, counted = set(), set()
        for launch, world in launch_folders(folder / side):
            got = read_launch(launch, world)
            astray |= got.astray.keys()
            counted |= got.tests.keys()
        out |= astray - counted
    return out


def markers_beside(folder: Path) -> str | None:
    """The marker expression the launches of a run's sides (beside its result.json, in FOLDER) ran pytest with,
    as their commands tell ("" for none); None where no command is kept, or where two launches tell apart."""
    told = set()
    for side in SIDES:
        for launch, _ in launch_folders(folder / side):
            argv = launch_argv(launch)
            if argv is not None:
                told.add(markers_of(argv))
    return told.pop() if len(told) == 1 else None


def markers_of(argv: list[str]) -> str | None:
    """The marker expression of a pytest command (ARGV: ``... -m pytest ARGS``): the last ``-m`` among its
    ARGS, as pytest takes it; "" where none is given; None where ARGV runs no pytest."""
    for i in range(1, len(argv)):
        if argv[i - 1:i + 1] == ["-m", "pytest"]:
            args = argv[i + 1:]
            given = [args[k + 1] for k in range(len(args) - 1) if args[k] == "-m"]
            return given[-1] if given else ""
    return None
