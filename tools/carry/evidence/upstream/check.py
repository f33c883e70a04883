"""An upstream's own tests, pristine against patched, judged and bisected: the one call the command
(tools/upstream_tests.py) and the nightly cell (``kind = "upstream-tests"``) make.

The pristine side runs every upstream at its pristine base, the patched side every upstream at the
series' head (a test of Megatron-Bridge meets Megatron-LM's trees too). Both sides run at once by
default. A regression, and a test the series turns green, is first run again on the patched trees
(a move that does not happen again is ``flaky``, never a regression), then bisected over the series'
prefixes: each probe runs just those tests, the first of each kind before the others (movers.py).
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ... import progress
from ...errors import UsageError
from ...files import write_json
from ...series.manifest import Series
from ...series.repo import command
from ...series.testspin import TestsPin
from ...workspace.installed import Installed
from ...workspace.workdir import WorkDir
from .. import scratch as scratchdirs
from .. import tesite
from ..bisect import PrefixTrees
from . import suite
from .launch import Side, SideResult, replayed, run_side
from .movers import bisect_movers
from .select import Picked, select
from .taken import judgeable
from .verdict import Compared, Row, compare, counts, file_of, files_without_rows, outcome_in, side_counts


@dataclass
class Options:
    cache: Path
    out: Path
    sources: dict[str, Path] = field(default_factory=dict)   # --tests-source NAME=CHECKOUT
    python: str | None = None
    nproc: int | None = None
    budget_s: float | None = None          # per side
    test_timeout: float = 900.0
    shared_gpu: bool = False
    files: list[str] | None = None         # restrict the selection to files under these prefixes
    bisect: bool = True
    together: bool = True                  # both sides at once
    select_only: bool = False
    shard: tuple[int, int] | None = None   # (I, K): every K-th file of what is left to run, from the I-th
    compared: list[dict] = field(default_factory=list)   # earlier runs' result.json: the files they compared whole stay out
    bisect_budget_s: float | None = None   # the seconds every probe of the bisection shares (None: no limit)
    judge_records: bool = False            # run nothing: judge the launches a cut run left in out (taken.replay)
    bisect_again: dict | None = None       # an earlier run's result.json: finish its bisection, no side run


def selection(series: Series, upstream: str, folder: Path, opts: Options) -> list[Picked]:
    pin = series.upstream(upstream).tests
    picked = select(series, upstream, folder, pin.root, pin.package)
    if opts.files:
        picked = [p for p in picked if any(p.path == f or p.path.startswith(f.rstrip("/") + "/") for f in opts.files)]
    return picked


def check_upstream(series: Series, upstream: str, prefix: PrefixTrees, trees: dict[str, Path],
                   opts: Options) -> dict:
    """Run (or, with select_only, just select) one upstream's tests; the report as a dict."""
    u = series.upstream(upstream)
    pin = u.tests
    if pin is None:
        raise UsageError(f"series {series.name}: {upstream} pins no tests ([upstreams.{upstream}.tests])")
    out = opts.out / upstream
    if opts.judge_records:
        judgeable(out)
    repo = suite.checkout(pin, opts.cache, opts.sources.get(upstream)) if pin.source == "git" else None
    digest = series.digest(series.patches)[:12]
    if opts.bisect_again is not None:
        return _bisect_again(series, upstream, prefix, repo, opts.bisect_again, digest, opts)
    pristine_trees = {name: prefix.pristine(name) for name in trees}
    folders = {"pristine": suite.side_folder(pin, repo, pristine_trees[upstream], out / "trees" / "pristine"),
               "patched": suite.side_folder(pin, repo, trees[upstream], out / "trees" / "patched")}
    picked = _both(selection(series, upstream, folders["patched"], opts),
                   selection(series, upstream, folders["pristine"], opts))
    earlier, fit = _compared_before(upstream, pin, digest, opts.compared)
    stand = earlier.standing({p.path for p in picked})
    left_out = [p.path for p in picked if p.path in earlier.whole]
    unrun = [path for path in left_out if path in earlier.deselected]
    # New ground first: a file an earlier run began and did not finish (some of its tests compared, others cut
    # by the budget, flaky, regressed) goes after every file no run has reached, so that it cannot take a
    # night's budget again before them (resharding/test_model_swap.py took two runs' whole budgets,
    # 2026-12-04 and 2026-12-05). Among each, the files whose tests ended the fewest earlier launches first:
    # each such test costs a launch (data/test_builder.py's pristine failures, one a launch, kept
    # data/test_get_batch.py's 339 tests from every run after it, h100/2026-12-07-builder-bisected).
    picked = remaining = sorted((p for p in picked if p.path not in earlier.whole),
                                key=lambda p: (p.path in earlier.begun, earlier.ends.get(p.path, 0)))
    if opts.shard:   # after --compared: the K parts of what is left share it out evenly, whatever ran before
        i, k = opts.shard
        picked = picked[i - 1::k]
    # In a file begun before, the tests compared then stay out: the launches pass them over as they pass over
    # the tests an earlier launch of the side ended (the skip list), and this run's rows are the file's others
    paths = {p.path for p in picked}
    done = {nodeid for nodeid in earlier.by if file_of(nodeid) in paths}
    report = {"upstream": upstream, "tests": pin.describe(), "markers": pin.markers, "args": list(pin.args),
              "series_digest": digest, "launch": pin.launch,
              "nproc": opts.nproc or pin.nproc,   # with --compared, each file's figures left (Compared.left_in)
              "selection": [{"path": p.path, "reasons": p.reasons, **(earlier.left_in(p.path) if fit else {})} for p in picked],
              "compared_before": left_out, "tests_compared_before": sorted(done), "standing": stand,
              # what the trees hold beyond their git layout: the pinned wheels' compiled members (installed.py)
              **({"installed": prefix.finish.added} if isinstance(prefix.finish, Installed) and prefix.finish.added else {}),
              **({"shard": "%d/%d" % opts.shard} if opts.shard else {})}
    if len(left_out) > len(unrun):
        progress.say(f"{upstream}: {len(left_out) - len(unrun)} selected test file(s) left out: an earlier run "
                     f"(--compared) compared every test of theirs")
    if unrun:
        progress.say(f"{upstream}: {len(unrun)} selected test file(s) left out: upstream's own markers "
                     f"(-m {pin.markers!r}) deselected every test of theirs in an earlier run: its CI runs none")
    if done:
        progress.say(f"{upstream}: {len(done)} test(s) of {len({file_of(n) for n in done})} file(s) an earlier run "
                     f"began left out: it compared them (--compared); the rest of those files runs")
    if fit and not opts.select_only:   # (--select-only prints it with the selection)
        progress.say(f"{upstream}: {standing_line(stand)}")
    if opts.select_only:
        return report
    if not picked:
        report.update(ok=False, status="error", reason=(
            f"shard {report['shard']} is empty: {len(remaining)} file(s) are left to run, fewer than the shards"
            if remaining else
            "every selected test file was compared whole by the --compared runs: nothing is left to run" if left_out
            else "the selection is empty: no test file meets what the series touches (a run would prove nothing)"))
        return report
    files = [p.path for p in picked]
    deadline = time.monotonic() + opts.budget_s if opts.budget_s else None
    sides = {name: make_side(name, series, upstream, folders[name], files, tree_set, out / name, opts, deadline,
                         compared=done, worlds=earlier.asks)   # a test that asked for more ranks: launched so at once
             for name, tree_set in (("pristine", pristine_trees), ("patched", trees))}
    t0: dict[str, float] = {}
    results: dict[str, SideResult] = {}
    if opts.judge_records:
        results = {name: replayed(side) for name, side in sides.items()}
        t0 = {name: round(sum(x["seconds"] for x in r.launches), 1) for name, r in results.items()}
        progress.say(f"{upstream}: {len(files)} test file(s) selected; judging the records of "
                     + ", ".join(f"{len(r.launches)} {name} launch(es)" for name, r in results.items()))
    else:
        progress.say(f"{upstream}: {len(files)} test file(s) selected; running pristine and patched "
                     f"({pin.launch}, {opts.nproc or pin.nproc} rank(s))")
        with ThreadPoolExecutor(max_workers=2 if opts.together else 1) as pool:
            futures = {name: pool.submit(_timed, run_side, side, t0, name) for name, side in sides.items()}
            results = {name: f.result() for name, f in futures.items()}
    rows = compare(results["pristine"], results["patched"])
    # A selected file that gave no row on either side held no test pytest collects there (its tests written
    # out of pytest's reach, say): named, so that it never silently drops out of what the counts cover.
    empty = files_without_rows(files, rows, results.values())
    found = None
    if opts.judge_records:   # a cut run's records: judged, never run again nor bisected here
        summary = _summary(rows, results, pin.root, t0, empty)
        if any(r.category in ("regression", "fixed") for r in rows):
            summary = _unbisected(summary)
        summary["reason"] = f"judged from the records of a run that was cut: {summary['reason']}"
        report.update(summary, judged_from_records=True)
        _write(out, report, rows, results)
        return report
    if opts.bisect and any(r.category in ("regression", "fixed") for r in rows):
        # The comparison is written before the bisection, which runs tests again and can take as long
        # as the sides did: a run cut during it (interrupted, its machine taken back) keeps its verdict,
        # never a green one (the bisection may still find a regression flaky, never a pass a failure).
        _write(out, {**report, **_unbisected(_summary(rows, results, pin.root, t0, empty))}, rows, results)
        progress.checkpoint("upstream-bisecting")
        found = _bisect_rows(series, upstream, prefix, repo, rows, files, out / "bisect", opts, results=results)
    report.update(_summary(rows, results, pin.root, t0, empty))
    if found is not None:
        report["bisect"] = found
    _write(out, report, rows, results)
    return report


def _write(out: Path, report: dict, rows: list[Row], results: dict[str, SideResult]) -> None:
    write_json(out / "result.json", {**report, "rows": [r.to_dict() for r in rows],
                                     "sides": {k: v.to_dict() for k, v in results.items()}})


def _unbisected(summary: dict) -> dict:
    """The summary of a comparison whose bisection has not finished: not ok, whatever it compared."""
    status = "failed" if summary["status"] == "failed" else "incomplete"
    return {**summary, "ok": False, "status": status, "bisect": "not finished",
            "reason": f"the bisection of the regressions and fixed tests did not finish; the comparison: "
                      f"{summary['status']}: {summary['reason']}"}


def standing_line(stand: dict[str, int]) -> str:
    """Compared.standing in words: where the --compared runs stand against the whole selection."""
    deselected = stand["deselected_whole"]
    return (f"of the {stand['files']} selected test file(s), the --compared runs compared {stand['compared_whole']} "
            f"whole" + (f" and found upstream's markers deselect every test of {deselected}" if deselected else "") +
            f"; {stand['left']} left: {stand['left_with_tests_not_compared']} holding "
            f"{stand['tests_not_compared']} test(s) some run collected and none compared (and "
            f"{stand['tests_compared_in_those_left']} compared, passed over), {stand['left_with_no_test_known']} "
            f"no run knows a test of")


def _compared_before(upstream: str, pin: TestsPin, digest: str, results: list[dict]) -> tuple[Compared, list[dict]]:
    """What the earlier runs of this upstream's tests at this PIN, on this very series, compared between them
    (verdict.Compared: the files whole, those begun, the tests one by one), and those runs. A run on another
    series (a patch changed since; or one whose result does not name its series) says nothing of this one; one
    under another marker expression (or one not known) says nothing of what today's deselects."""
    mine = [r for r in results if r.get("upstream") == upstream]
    # the pin's launch and pytest arguments can change what a test does (ranks, a plugin, a warning filter): a run under
    # others is another (one written before results named them ran the pin's: none changed since pins began, 2026-12-03)
    fit = [r for r in mine if r.get("tests") == pin.describe() and r.get("series_digest") == digest
           and r.get("launch") == pin.launch and r.get("args", list(pin.args)) == list(pin.args)]
    if len(fit) < len(mine):
        progress.say(f"{upstream}: {len(mine) - len(fit)} --compared result(s) count for nothing: another tests pin, "
                     f"launch or pytest arguments, or a series other than this one ({digest}), or written before "
                     "results named their series")
    if others := [r for r in fit if r.get("markers") != pin.markers]:
        told = sorted({f"-m {r['markers']!r}" if r.get("markers") is not None else "markers not told" for r in others})
        progress.say(f"{upstream}: {len(others)} --compared result(s) ran under other markers than today's "
                     f"(-m {pin.markers!r}): {', '.join(told)}; what upstream's markers deselected in those counts for "
                     "nothing: only a run under today's leaves a file out for it")
    if (earlier := Compared.of(fit, pin.markers, pin.nproc)).cleared:   # flaky: see Compared
        progress.say(f"{upstream}: {len(earlier.cleared)} test(s) a run found regressed, unconfirmed by its bisection, "
                     f"another's patched trees passed: flaky, passed over ({min(earlier.cleared)}, ...)")
    return earlier, fit


def _both(patched: list[Picked], pristine: list[Picked]) -> list[Picked]:
    """The files selected on either side, the patched side's order first: a test file the series adds
    (NeMo-RL's tests are in its tree) or removes is one side's only; the other side has none of its
    tests, which is how a test the series adds is ``new`` and one it removes a regression."""
    out = {p.path: p for p in patched}
    for p in pristine:
        out.setdefault(p.path, p)
    return list(out.values())


def _timed(fn, side, seconds: dict, name: str):
    t = time.monotonic()
    try:
        return fn(side)
    finally:
        seconds[name] = round(time.monotonic() - t, 1)


def make_side(name: str, series: Series, upstream: str, folder: Path, files: list[str], trees: dict[str, Path],
          out: Path, opts: Options, deadline: float | None, only: list[str] | None = None,
          compared: set[str] = frozenset(), worlds: dict[str, int] | None = None) -> Side:
    u = series.upstream(upstream)
    own = folder if u.python_path in (".", "") else folder / u.python_path
    others = [str(t if series.upstream(n).python_path in (".", "") else t / series.upstream(n).python_path)
              for n, t in trees.items() if n != upstream]
    kwargs = {"python": opts.python} if opts.python else {}
    te = tesite.site()  # after the trees, as for the proofs: the trees under test come first
    files = [f for f in files if (folder / f).exists()]   # a file only the other side has: none of its tests here
    return Side(name, u.tests, folder, files, [str(own), *others, *([str(te)] if te else [])], out, nproc=opts.nproc, deadline=deadline,
                test_timeout=opts.test_timeout, shared_gpu=opts.shared_gpu, only=only, compared=frozenset(compared),
                worlds=dict(worlds or {}), **kwargs)


def run_once(label: str, series: Series, upstream: str, repo, trees: dict[str, Path], files: list[str], ids: list[str],
             out: Path, opts: Options, deadline: float | None = None,
             finish: Callable[[str, Path], None] | None = None, worlds: dict[str, int] | None = None) -> dict[str, str]:
    """IDS (of UPSTREAM's tests, in FILES) run once on TREES as one side in OUT (its folder OUT/tree, which
    FINISH(upstream, folder) may complete as an install would): each one's outcome. WORLDS: the ranks a run found
    some of them ask for (launched so at once)."""
    folder = suite.side_folder(series.upstream(upstream).tests, repo, trees[upstream], out / "tree")
    if finish is not None:
        finish(upstream, folder)
    res = run_side(make_side(label, series, upstream, folder, files, trees, out, opts, deadline, ids, worlds=worlds))
    return {i: outcome_in(res, i) for i in ids}


def _summary(rows: list[Row], results: dict[str, SideResult], root: str, seconds: dict,
             no_tests: list[str] = ()) -> dict:
    per = counts(rows, root)
    regressions = [r.to_dict() for r in rows if r.category == "regression"]
    compared = sum(n for c, n in per["*"].items() if c not in ("not-compared",))
    missing = per["*"].get("not-compared", 0)
    ok = not regressions and per["*"].get("passed", 0) > 0 and not missing
    if regressions:
        status, reason = "failed", f"{len(regressions)} regression(s): {regressions[0]['id']}" + \
            (f" ({regressions[0]['patched_reason'][:200]})" if regressions[0]["patched_reason"] else "")
    elif missing:  # a test not run on both sides is a verdict not given, never a green one
        first = next((r for r in rows if r.category == "not-compared"), None)
        status, reason = "incomplete", (f"{missing} of {compared + missing} test(s) not compared"
                                        + (f" (first: {first.id}: {first.note or first.patched_reason or first.pristine_reason})"[:300]
                                           if first else "") + f"; no regression among the {compared} compared")
    elif not per["*"].get("passed", 0):
        status, reason = "error", "no test passed on both sides: the run proves nothing about regressions"
    else:
        status, reason = "passed", f"no regression among {compared} test(s) compared"
    if no_tests:
        reason += f"; {len(no_tests)} selected file(s) hold no test pytest collects: {', '.join(no_tests[:5])}"
    walls: dict[str, dict[str, float]] = {}
    outside: dict[str, dict[str, float]] = {}   # per side: the launches' seconds besides their tests
    for name, res in results.items():
        for launch in res.launches:
            w = walls.setdefault(name, {})
            w[str(launch["world"])] = round(w.get(str(launch["world"]), 0.0) + launch["seconds"], 1)
            o = outside.setdefault(name, {"launches": 0, "startup": 0.0, "wind_down": 0.0})
            o["launches"] += 1
            for k in ("startup", "wind_down"):
                o[k] = round(o[k] + launch[f"{k}_s"], 1)
            for k, v in launch.get("startup_parts_s", {}).items():   # where the launches' records tell them
                parts = o.setdefault("startup_parts", {})
                parts[k] = round(parts.get(k, 0.0) + v, 1)
    return {"ok": ok, "status": status, "reason": reason, "no_tests": list(no_tests), "counts": per,
            "sides": {k: side_counts(v) for k, v in results.items()}, "seconds": seconds,
            "seconds_per_world": walls, "seconds_outside_tests": outside, "regressions": regressions,
            "fixed": [r.to_dict() for r in rows if r.category == "fixed"],
            "flaky": [r.to_dict() for r in rows if r.category == "flaky"],
            "known_failures": [{"id": r.id, "pristine": r.pristine_reason, "patched": r.patched_reason}
                               for r in rows if r.category == "known-failure"],
            "not_compared": sum(1 for r in rows if r.category == "not-compared")}


def _bisect_rows(series: Series, upstream: str, prefix: PrefixTrees, repo, rows: list[Row], files: list[str],
                 out: Path, opts: Options, another_host: bool = False,
                 results: dict[str, SideResult] | None = None) -> list[dict]:
    """Each regression and each fixed test run again and bisected (movers.bisect_movers), each probe's tests
    run once on its prefix's trees in its own folder under OUT, a test the sides' RESULTS found asking for another
    size launched at it; with ``bisect_budget_s`` the probes share that
    many seconds, and a test a probe did not reach is left not bisected. bisect.json: their entries."""
    worlds = {i: n for res in (results or {}).values() for i, n in res.asked().items()}
    deadline = time.monotonic() + opts.bisect_budget_s if opts.bisect_budget_s else None

    def probe(k: int, ids: list[str], folder: str) -> dict[str, str]:
        return run_once(f"bisect k={k}", series, upstream, repo, prefix.trees(k), files, ids, out / folder, opts,
                        deadline, worlds=worlds)

    found = bisect_movers(rows, prefix.order, [p.id for p in series.patches], probe, another_host)
    (out / "bisect.json").parent.mkdir(parents=True, exist_ok=True)
    (out / "bisect.json").write_text(json.dumps(found, indent=2, sort_keys=True) + "\n")
    return found


def _bisect_again(series: Series, upstream: str, prefix: PrefixTrees, repo, doc: dict, digest: str,
                  opts: Options) -> dict:
    """--bisect-again: the regressions and fixed tests of an earlier run (DOC, its result.json) whose bisection
    named no patch (its budget ran out, the run was cut during it) bisected on the trees of this work directory,
    no side run again; OUT/UPSTREAM/result.json is DOC's comparison with their rows and entries as judged now."""
    pin = series.upstream(upstream).tests
    if (doc.get("series_digest"), doc.get("tests")) != (digest, pin.describe()):
        raise UsageError(f"--bisect-again: a result of series {doc.get('series_digest') or 'unnamed'} and tests "
                         f"{doc.get('tests')}; this one is {digest}, {pin.describe()}: its patches may differ",
                         hint="bisect a result of this series and tests pin")
    try:
        rows = [Row(**r) for r in doc["rows"]]
        done = {e["id"]: e for e in doc["bisect"]} if isinstance(doc.get("bisect"), list) else {}
        results = {name: SideResult.from_dict(d) for name, d in doc["sides"].items()}
    except (TypeError, KeyError, AttributeError) as exc:
        raise UsageError(f"--bisect-again: not a whole result.json of tools/upstream_tests.py (its rows, bisect or "
                         f"sides: {type(exc).__name__}: {exc})") from None
    pending = [r for r in rows if r.category in ("regression", "fixed") and "first_patch" not in done.get(r.id, {})]
    if not pending:
        raise UsageError(f"--bisect-again: every regression and fixed test of that {upstream} run was bisected: "
                         "nothing to bisect again")
    progress.say(f"{upstream}: bisecting again {len(pending)} test(s) whose bisection named no patch")
    # a flaky verdict needs both runs on one host, and this one may lack what the run's host had
    found = {e["id"]: e for e in _bisect_rows(series, upstream, prefix, repo, pending, sorted({r.file for r in pending}),
                                                opts.out / upstream / "bisect", opts, another_host=True,
                                                results=results)}
    report = {k: v for k, v in doc.items() if k not in ("rows", "sides", "look_again")}
    report.update(_summary(rows, results, pin.root, doc.get("seconds", {}), doc.get("no_tests", [])),
                  bisect=[found.get(r.id) or done[r.id] for r in rows if r.id in found or r.id in done],
                  bisected_again=len(pending))
    _write(opts.out / upstream, report, rows, results)
    return report


def check_series(series: Series, workdir: Path, upstreams: list[str] | None, opts: Options,
                 lock_timeout: float) -> list[dict]:
    """Every named upstream (default: each that pins tests and has a workspace), under the work
    directory's lock, on the trees of the workspaces' recorded commits (not their working files)."""
    wd = WorkDir(workdir)
    with wd.lock(lock_timeout), scratchdirs.folder() as tmp:
        finished = wd.recover()
        if finished:
            progress.say(f"finished the swap of {', '.join(finished)} that an interrupted apply left")
        state = wd.require(series)
        applied = [name for name, _ in state.records()]
        names = upstreams or [u.name for u in series.upstreams if u.tests and u.name in applied]
        for name in names:
            if series.upstream(name).tests is None:
                raise UsageError(f"{name} pins no tests in series {series.name}",
                                 hint=f"add [upstreams.{name}.tests] to {series.root / 'series.toml'}")
            if name not in applied:
                raise UsageError(f"{name}: no workspace in {workdir}",
                                 hint=f"`{command('apply', series, '--workdir', wd.root)}` first")
        prefix = PrefixTrees(series, workdir, tmp / "trees")
        # The trees of the workspaces that are there: an upstream's tests need its own tree and the
        # trees it imports (Bridge's tests import megatron.core), not every upstream of the series.
        prefix.only = [n for n in applied if wd.workspace(n).is_dir()]
        if not opts.select_only and not opts.judge_records:   # the trees the tests run from hold what an install
            # of the pinned wheel holds
            prefix.finish = Installed(series, opts.python or sys.executable, opts.cache)
        trees = prefix.trees(len(prefix.order))
        return [check_upstream(series, name, prefix, trees, opts) for name in names]
