"""The nightly: every (series x image x test) cell of integration/nightly.toml, judged.

For each series the patched trees are built (carry.workspace.apply, all upstreams); then
each cell (carry.nightly.plan) runs where its image says (this machine, ``docker run``, ``srun``
with a squashfs; under ``--launcher slurm`` a cell that needs no container is a job step,
carry.nightly.slurm), bounded by a timeout, and is judged by carry.nightly.judge from
what it left: exit status, log, metrics. A failed cell is bisected over the
series (carry.evidence.bisect) when its check depends on the trees. Results go to
``OUT/cells/<cell>/run.json``, ``OUT/nightly.json``, ``OUT/junit.xml``,
``OUT/summary.md`` and one line per cell appended to the history file.

Test kinds:
- ``functional``: a NeMo-RL functional test script inside an image, through
  integration/nemo_rl_gtp/run-in-image.sh (capability guard, run.log and
  metrics.json collected);
- ``command``: any command line (e.g. integration/gtp_refit_mini/run.py);
- ``proof``: the series' proofs (carry.nightly.proofs: each run the proof's pytest, as
  carry.evidence.prove runs it), on the patched trees (must pass) and the pristine base (must
  fail, else ``vacuous``); a proof that cannot run on this host (carry.evidence.prove's
  environment errors) is ``error``, counts as not green and is not bisected;
- ``upstream-tests``: an upstream's own tests, pristine against patched (carry.nightly.upstream).

Statuses: those of carry.nightly.judge, plus ``error``.
"""

from __future__ import annotations

import shutil
import sys
import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor, wait
from datetime import datetime, timezone
from pathlib import Path

from .. import progress
from ..errors import CarryError
from ..evidence import canary
from ..evidence.bisect import BisectResult, PrefixTrees, bisect
from ..evidence.prove import jobs
from ..files import write_json
from ..runner import kill_groups
from ..workspace.apply import Options as ApplyOptions
from ..workspace.apply import apply_series
from . import artifacts, figures, gpus, proofs, slurm, stop, upstream
from . import report as reports
from .config import NightlyConfig
from .judge import Verdict, deterministic_flags, judge
from .launch import Finished
from .plan import Cell, Options, cells, plan, timeout_for
from .runlog import read_result_line

NOT_GREEN = ("failed", "vacuous", "error")


def all_proofs_skipped(runs: list[dict]) -> bool:
    """The night ran proof cells and every one of them skipped: it proved nothing of the series."""
    ran = [r for r in runs if r.get("kind") == "proof"]
    return bool(ran) and all(r["status"] == "skipped" for r in ran)


def night_ok(runs: list[dict]) -> bool:
    """Green: no cell failed, was vacuous or an error, and not every proof cell skipped."""
    return not any(r["status"] in NOT_GREEN for r in runs) and not all_proofs_skipped(runs)


# -- running one check ---------------------------------------------------------------------------
def run_check(cell: Cell, trees: dict[str, Path], out: Path, opts: Options, timeout: float) -> tuple[Verdict, dict]:
    """Run the cell's check once on the given trees; judge it. Used for the run and for bisection."""
    if out.exists():
        shutil.rmtree(out)  # never judge what an earlier run left here
    out.mkdir(parents=True)
    if cell.spec.kind == "upstream-tests":
        return upstream.run_cell(cell, trees, out, opts, timeout)
    if cell.spec.kind == "proof":
        assert cell.patch is not None
        if cell.patch.upstream not in trees:
            return Verdict(status="skipped", reason=f"{cell.patch.upstream} was not applied in this run "
                                                    f"(--only): its proof has no tree"), {}
        return proofs.patched(cell, trees, out, opts, timeout)
    if gpus.needs_gpus(cell) and cell.launcher == "local":
        short = gpus.shortfall(cell, opts.shared_gpu, gpus.visible_gpus())
        if short:
            return Verdict(status="skipped", reason=short), {}
    fin, info = slurm.launch(cell, plan(cell, trees, out, opts, timeout), out, opts.launcher, timeout)
    v = judge_outputs(cell, fin, out, timeout)
    return v, {**info, "artifacts": artifacts.listing(out)}


def judge_outputs(cell: Cell, fin: Finished, out: Path, timeout: float) -> Verdict:
    """Judge what the run left in ``out``, each file read by carry.nightly.artifacts: a file the run
    broke (a directory, a FIFO, a symlink, huge, not UTF-8, nested too deeply) fails this cell, with
    the file named, and never the night."""
    text, problem = artifacts.read_log(out / "console.log")
    if text is None:  # the run replaced or removed the log the launcher wrote
        text = f"[carry] {problem or 'console.log is gone'}\n"
        problem = problem or "console.log is gone"
    src = cell.spec.metrics
    # The document as read: the judge names a value that is not a number rather than lose it.
    metrics: dict = {}
    if src == "result-line":
        _, doc, bad = read_result_line(text)
        metrics, problem = doc or {}, problem or bad
    elif src.startswith("file:"):
        doc, bad = artifacts.read_metrics(out / src[5:])
        metrics, problem = doc or {}, problem or bad
    marker_text, bad = artifacts.read_log(out / "run.log")
    if bad:
        problem = problem or bad
        marker_text = ""  # a run.log that is there but unreadable holds no marker
    return judge(rc=fin.returncode, timed_out=fin.timed_out, text=text, metrics=metrics, gates=cell.spec.gates,
                 markers=cell.spec.markers, timeout_s=timeout, launch_error=fin.error, marker_text=marker_text,
                 step_markers=cell.spec.step_markers, metrics_source=src, steps=cell.spec.steps,
                 metrics_problem=problem)


def cell_error(cell_out: Path, exc: BaseException) -> Verdict:
    """A cell the nightly could not judge (a defect of ours, or an output no reader foresaw): that
    cell's ``error``, its traceback kept beside its run.json, and the night goes on."""
    cell_out.mkdir(parents=True, exist_ok=True)
    where = cell_out / "nightly-error.txt"
    where.write_text("".join(traceback.format_exception(exc)))
    return Verdict(status="error", reason=f"the nightly could not judge this cell: {type(exc).__name__}: "
                                          f"{str(exc)[:300]} (traceback in {where})")


def depends_on_trees(cell: Cell) -> str | None:
    """Why bisecting this cell is pointless, or None when its check depends on the trees."""
    if cell.spec.kind == "upstream-tests":
        return "the cell bisects its own regressions, test by test (its record's upstream_tests.bisect)"
    if cell.spec.kind == "proof" or cell.image.swaps_trees:
        return None
    if any("{tree:" in a for a in cell.spec.argv + cell.image.functional) or any("{tree:" in v for _, v in cell.spec.env):
        return None
    return (f"neither the test nor image {cell.image.name!r} puts the series' trees in play "
            f"({{tree:NAME}}, pythonpath, tree_mounts): a prefix would change nothing")


# -- the whole night -----------------------------------------------------------------------------
def run_nightly(cfg: NightlyConfig, opts: Options, load_series, warnings: list[str] | None = None) -> list[dict]:
    """Run every selected cell; ``warnings`` (when given) collects what was wrong with the history.

    Stopped (carry.nightly.stop) at any point, it returns the cells judged so far and one ``error``
    record per cell that was not (``stopped``: true); the caller writes the night's files."""
    history, bad = reports.read_history(opts.history)
    for w in bad:
        print(f"warning: {w}", file=sys.stderr, flush=True)
    if warnings is not None:
        warnings.extend(bad)
    # Every series' cells first: a night stopped midway names each cell it did not reach.
    matrix = [(series, list(cells(cfg, series, opts)))
              for series in (load_series(s, cfg) for s in opts.series or list(cfg.series))]
    runs: list[dict] = []
    now: dict = {}  # the cell in progress: "cell", "t0"
    try:
        for series, planned in matrix:
            _run_series(cfg, opts, series, planned, history, runs, now)
    except stop.Stopped:
        pass
    why = stop.stopped()
    if why is None:
        return runs
    done = {r["cell"] for r in runs}
    for series, planned in matrix:
        for cell in planned:
            if cell.id in done:
                continue
            ran = round(time.monotonic() - now["t0"], 1) if cell.id == now.get("cell") else 0.0
            if cell.id == now.get("cell"):
                reason = (f"stopped as it ran ({why}, after {ran:.1f} s): not judged; "
                          f"its log so far is in {opts.out / 'cells' / cell.id}")
            else:
                reason = f"not run: the night was stopped before it ({why})"
            rec = _record(cell, opts, Verdict(status="error", reason=reason), {}, "")
            rec.update(stopped=True, flags=[], seconds=ran)
            write_json(opts.out / "cells" / cell.id / "run.json", rec)
            runs.append(rec)
    return runs


def _record(cell: Cell, opts: Options, v: Verdict, info: dict, digest: str) -> dict:
    return {
        "run_id": opts.run_id, "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cell": cell.id, "series": cell.series.name, "image": cell.image.name, "test": cell.test,
        "kind": cell.spec.kind, "launcher": cell.launcher, "digest": digest, "seed": opts.seed,
        "patch": cell.patch.id if cell.patch else None, "watched": list(cell.spec.watched),
        **v.to_dict(), **info,
    }


def _run_series(cfg: NightlyConfig, opts: Options, series, planned: list[Cell], history: list[dict],
                runs: list[dict], now: dict) -> None:
    """One series' cells, each record appended to ``runs`` as it is made."""
    wd_path = opts.workdir / series.name
    apply_error, digest, trees = None, "", {}
    try:
        rep = apply_series(series, ApplyOptions(workdir=wd_path, cache=opts.cache, sources=dict(opts.sources),
                                                only=opts.only))
        digest = rep.digest
        if rep.ok:
            trees = {u.name: Path(u.workspace) for u in rep.upstreams}
        else:
            apply_error = rep.error or "apply failed"
    except CarryError as exc:
        apply_error = exc.message
    scratch = opts.out / "trees" / series.name
    prefix = PrefixTrees(series, wd_path, scratch) if not apply_error else None
    pool = ThreadPoolExecutor(max_workers=jobs()) if not apply_error and jobs() > 1 else None
    try:
        ahead = _proofs_ahead(planned, trees, prefix, opts, cfg, pool) if pool else {}
        for i, cell in enumerate(planned):
            progress.say(f"{cell.id}: running")
            timeout = timeout_for(cell, opts, cfg.timeout_s)
            cell_out = opts.out / "cells" / cell.id
            t0 = time.monotonic()
            now.update(cell=cell.id, t0=t0)
            if i not in ahead and ahead:
                wait([f for pair in ahead.values() for f in pair])  # no other cell shares the host with proofs
            if apply_error:
                v, info = Verdict(status="failed", reason=f"the series did not apply: {apply_error}"), {}
                cell_out.mkdir(parents=True, exist_ok=True)
            else:
                try:
                    if i in ahead:
                        # Both runs went at once with other cells' runs; the pristine one decides only a pass.
                        (v, info), (pv, pinfo) = ahead[i][0].result(), ahead[i][1].result()
                        info["pristine"] = pinfo
                        if v.status == "passed":
                            v = pv or v
                    else:
                        v, info = run_check(cell, trees, cell_out / "artifacts", opts, timeout)
                        if cell.spec.kind == "proof" and v.status == "passed":
                            pv, info["pristine"] = proofs.pristine(cell, trees, prefix, cell_out / "pristine", opts,
                                                                   timeout)
                            v = pv or v
                except CarryError as exc:
                    v, info = Verdict(status="failed", reason=f"could not run: {exc.message}"), {}
                except Exception as exc:  # noqa: BLE001 - one cell's output must not end the night
                    v, info = cell_error(cell_out, exc), {}
            record = _record(cell, opts, v, info, digest)
            record["seconds"] = info.get("seconds", round(time.monotonic() - t0, 1))
            mode = gpus.gpu_mode(cell, opts.shared_gpu)
            if mode:
                record["gpu_mode"] = mode
            if mode == gpus.SHARED_GPU:
                record["timing_note"] = gpus.TIMING_NOTE
            record["flags"] = list(v.flags) + deterministic_flags(
                v.metrics, reports.previous_run(history, cell.id, opts.run_id), cell.spec.watched)
            if v.status == "failed" and not apply_error and opts.bisect and cfg.bisect and cell.spec.bisect:
                why_not = depends_on_trees(cell)
                if why_not:
                    record["bisect"] = BisectResult(target=v.signature(), note=f"not bisected: {why_not}").to_dict()
                else:
                    try:
                        record["bisect"] = _bisect(cell, v, prefix, cell_out / "bisect", opts, timeout).to_dict()
                    except stop.Stopped as why:  # the verdict stands; its bisection was cut short
                        record["bisect"] = BisectResult(target=v.signature(),
                                                        note=f"not bisected: the night was stopped ({why})").to_dict()
            write_json(cell_out / "run.json", record)
            runs.append(record)
            now.clear()
            if stop.stopped():
                return
    finally:
        if pool:
            if stop.stopped():
                kill_groups()  # the proofs' runs still going (launch.run_logged's): they end now, unjudged
            pool.shutdown(wait=not stop.stopped(), cancel_futures=True)


def _proofs_ahead(planned: list[Cell], trees: dict[str, Path], prefix: PrefixTrees, opts: Options,
                  cfg: NightlyConfig, pool: ThreadPoolExecutor) -> dict[int, tuple[Future, Future]]:
    """Each proof cell's two runs (patched, pristine), all submitted at once to ``pool``
    (carry.evidence.prove.jobs() wide): no cell's runs depend on another's, and on a GPU host they are
    most of the proofs' time."""
    ahead = {}
    for i, cell in enumerate(planned):
        if cell.spec.kind != "proof" or cell.patch.upstream not in trees:
            continue
        prefix.pristine(cell.patch.upstream)  # extracted here, once, not by two threads at a time
        timeout = timeout_for(cell, opts, cfg.timeout_s)
        out = opts.out / "cells" / cell.id
        ahead[i] = (pool.submit(run_check, cell, trees, out / "artifacts", opts, timeout),
                    pool.submit(proofs.pristine, cell, trees, prefix, out / "pristine", opts, timeout))
    return ahead


def _bisect(cell: Cell, v: Verdict, prefix: PrefixTrees, out: Path, opts: Options, timeout: float) -> BisectResult:
    order = prefix.order

    def probe(k: int) -> tuple[str, str, str]:
        progress.say(f"{cell.id}: bisect: patches 1..{k}")
        try:
            pv, _ = run_check(cell, prefix.trees(k), out / f"k{k:03d}", opts, timeout)
        except CarryError as exc:
            pv = Verdict(status="failed", reason=f"could not run: {exc.message}")
        except Exception as exc:  # noqa: BLE001 - as in run_nightly
            pv = cell_error(out / f"k{k:03d}", exc)
        return pv.signature(), pv.status, pv.reason

    return bisect(order, v.signature(), probe, [p.id for p in cell.series.patches])


def run_canaries(cfg: NightlyConfig, opts: Options, load_series,
                 fetch_errors: dict[str, str] | None = None) -> list[canary.UpstreamCanary]:
    """The canary (carry.evidence.canary) of each series against the upstream main heads of --canary;
    ``fetch_errors``: the upstreams whose main could not be fetched tonight (NAME -> why)."""
    found = []
    for sname in opts.series or list(cfg.series):
        series = load_series(sname, cfg)
        heads = {n: p for n, p in opts.canary.items() if n in {u.name for u in series.upstreams}}
        found += canary.run(series, heads, opts.cache, opts.timeout or cfg.timeout_s, opts.workdir / series.name,
                            dict(opts.sources), fetch_errors)
    return found


def write_outputs(runs: list[dict], opts: Options, cfg: NightlyConfig, warnings: list[str] = (),
                  canaries: list[canary.UpstreamCanary] | None = None, stopped: stop.Stopped | None = None) -> None:
    """``stopped``: the signal that stopped the night; the history then gets the cells judged
    before it, and the figures are not drawn (the files must be there before the SIGKILL)."""
    # The canary's warnings stay out of ok: the release cells alone judge the night.
    ok = night_ok(runs)
    write_json(opts.out / "nightly.json", {"ok": ok, "run_id": opts.run_id, "seed": opts.seed,
                                           "config": str(cfg.path), "runs": runs,
                                           "stopped": str(stopped) if stopped else None,
                                           "history_warnings": list(warnings),
                                           "all_proofs_skipped": all_proofs_skipped(runs),
                                           "canary": canary.to_dicts(canaries or [])})
    (opts.out / "junit.xml").write_text(reports.junit(runs))
    reports.append_history(opts.history, [reports.history_record(r) for r in runs if not r.get("stopped")])
    header = {"seed": opts.seed, "history": opts.history.name, "cells": len(runs)}
    if stopped:
        left = sum(bool(r.get("stopped")) for r in runs)
        header["stopped"] = (f"by {stopped}: {len(runs) - left} cell(s) judged, {left} not (error: 'not run' or "
                             f"'stopped as it ran'); no canary, no figures")
    shared = any(r.get("gpu_mode") == gpus.SHARED_GPU for r in runs)
    if shared:
        header["gpu mode"] = gpus.TIMING_NOTE
    text = (reports.summary(runs, opts.run_id, header, warnings)
            + "".join(line + "\n" for line in upstream.summary_lines(runs))
            + "\n".join(canary.summary_lines(canaries or [])) + ("\n" if canaries else ""))
    (opts.out / "summary.md").write_text(text)
    if stopped:
        return
    note = gpus.TIMING_NOTE if shared else ""
    (opts.out / "summary.md").write_text(text + "\n".join(_figures(opts, runs, note)) + "\n")


def _figures(opts: Options, runs: list[dict], note: str = "") -> list[str]:
    """The figures over the history (tonight's records included) and tonight's cells; a figure that
    cannot be drawn is a line in the summary, never a lost night (the summary is written first)."""
    try:
        history, _ = reports.read_history(opts.history)
        return figures.summary_lines(opts.out, history, runs, note)
    except Exception as exc:  # noqa: BLE001 - pictures are a view of the night, not its verdict
        return ["", f"Figures: could not be drawn: {type(exc).__name__}: {str(exc)[:300]}"]
