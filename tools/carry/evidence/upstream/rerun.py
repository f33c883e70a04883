"""Upstream's own tests, named one by one, run once on a set of trees: what ``retire --upstream-tests``
asks of the tests a patch is recorded to fix (its ``upstream_tests``), on the new base without the patch.

The tests come from the upstream's pinned tests commit, the trees under test replace what the pin's
``replace`` names, and they run with the upstream's own launch, as one side of tools/upstream_tests.py.
A test no launch reached, or one that refused the world size, gives no verdict (``not-run``). The folder
the tests run in holds what an install of the base holds (the compiled members a wheel's git layout leaves
out: workspace.installed), as the trees of tools/upstream_tests.py do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ...series.manifest import Series
from . import suite
from .check import Options, run_once
from .results import signature
from .verdict import file_of

Finish = Callable[[str, Path], None]


def outcomes(series: Series, upstream: str, trees: dict[str, Path], ids: list[str], out: Path,
             opts: Options, finish: Finish | None = None) -> dict[str, str]:
    """Each of IDS (node ids of UPSTREAM's pinned tests) run once on TREES (check.run_once): its outcome.
    FINISH(upstream, folder) completes the folder the tests run in as an install of its base would."""
    pin = series.upstream(upstream).tests
    repo = suite.checkout(pin, opts.cache, opts.sources.get(upstream)) if pin.source == "git" else None
    return run_once("new base", series, upstream, repo, trees, sorted({file_of(i) for i in ids}), list(ids), out,
                    opts, finish=finish)


def fixed_upstream(series: Series, recorded: tuple[str, ...], trees: dict[str, Path], out: Path, opts: Options,
                   ev: list[str], finish: Finish | None = None) -> str | None:
    """RECORDED (a patch's upstream_tests, UPSTREAM:NODE_ID) run on TREES; what they say to ``ev``, and
    ``pass`` (every one passed), ``fail`` (one failed) or None (no verdict: one not run, or no tree)."""
    by: dict[str, list[str]] = {}
    for entry in recorded:
        name, _, nodeid = entry.partition(":")
        by.setdefault(name, []).append(nodeid)
    got: dict[str, str] = {}
    for name, ids in by.items():
        if name not in trees or series.upstream(name).tests is None:
            ev.append(f"upstream's own tests it fixed: {len(ids)} of {name}'s, which "
                      + ("pins no tests" if name in trees else "has no tree here") + ": not run")
            return None
        got.update({f"{name}:{i}": o for i, o in outcomes(series, name, trees, ids, out / name, opts, finish).items()})
    failed = [k for k, o in got.items() if signature(o) == "failing"]
    passed = [k for k, o in got.items() if signature(o) == "passing"]
    rest = [k for k in got if k not in failed and k not in passed]
    ev.append(f"upstream's own tests it fixed, on the new base without it: {len(passed)} passed, {len(failed)} failed"
              + (f", {len(rest)} no verdict ({rest[0]}: {got[rest[0]]})" if rest else "")
              + (f" (first failed: {failed[0]}: {got[failed[0]]})" if failed else ""))
    return "fail" if failed else "pass" if passed and not rest else None
