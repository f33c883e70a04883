"""The ``upstream-tests`` cells: each upstream's own unit tests, pristine against patched
(carry.evidence.upstream), one cell per upstream that pins tests.

The cell runs ``tools/upstream_tests.py --only NAME`` on the night's work directory (``plan``), as
any cell's command: on this machine, or as a Slurm job step (carry.nightly.slurm.launch), bounded by
the cell's timeout. It is judged from the report that run wrote (``--json``) by that comparison,
not by gates: ``failed`` when a test regressed (the record names each one and the patch its
bisection found), ``error`` when nothing could be compared (no test passed on both sides: the
tests did not run here, or could not be fetched), when the run stopped without a report, or
timed out, ``passed`` otherwise. The engine bisects its own regressions, so the nightly does not
bisect these cells. Each side's time budget is 40% of the cell's timeout (the sides run at once;
the rest is for the re-run of what moved and its bisection); what a side did not reach is counted
as not compared.

A run its timeout cut is judged from the records its launches left (the same command with
``--judge-records``, on this machine: it runs no test), never green: ``failed`` where those records
hold a regression (unconfirmed: the cut left no second run), ``error`` otherwise, with its counts.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..series.repo import REPO_ROOT
from . import artifacts, slurm
from .judge import Verdict
from .launch import Finished, Plan, local_plan, run_logged
from .runlog import last_line, tail

SIDE_SHARE = 0.4
REPORT = "report.json"
JUDGE_LOG = "judge-records.log"
JUDGE_TIMEOUT_S = 300.0   # it reads records and compares them: no test runs


def plan(cell, out: Path, opts, timeout: float) -> Plan:
    """The command of an upstream-tests cell: the same as tools/upstream_tests.py --only NAME, its
    results under ``out`` (``out/NAME/result.json``) and its report in ``out/report.json``."""
    side = timeout * SIDE_SHARE
    argv = [sys.executable, str(REPO_ROOT / "tools" / "upstream_tests.py"), "--series", str(cell.series.root),
            "--workdir", str(opts.workdir / cell.series.name), "--only", cell.upstream, "--out", str(out),
            "--json", str(out / REPORT), "--cache", str(opts.cache), "--budget", f"{side:g}",
            "--test-timeout", f"{min(900.0, side):g}"]
    for name, path in sorted(opts.tests_sources.items()):
        argv += ["--tests-source", f"{name}={path}"]
    if opts.shared_gpu:
        argv.append("--shared-gpu")
    return local_plan(argv=argv, env={}, cwd=REPO_ROOT)


def run_cell(cell, trees: dict[str, Path], out: Path, opts, timeout: float) -> tuple[Verdict, dict]:
    """The cell's run, its files in ``out`` (carry.nightly.run.run_check empties it first), judged."""
    name = cell.upstream
    if name not in trees:
        return Verdict(status="skipped", reason=f"{name} was not applied in this run (--only): its tests have no tree"), {}
    p = plan(cell, out, opts, timeout)
    fin, info = slurm.launch(cell, p, out, opts.launcher, timeout)
    records = None
    if fin.timed_out and not fin.error:   # cut: what its launches left is judged, here (no test runs again)
        records = run_logged(local_plan(argv=[*p.argv, "--judge-records"], env=p.env, cwd=p.cwd),
                             out / JUDGE_LOG, timeout=JUDGE_TIMEOUT_S)
    v, more = judge_report(name, fin, out, timeout, records)
    return v, {**info, **more}


def judge_report(name: str, fin: Finished, out: Path, timeout: float,
                 records: Finished | None = None) -> tuple[Verdict, dict]:
    """An upstream-tests run judged from the report it wrote; without one (it could not start, timed
    out, stopped on bad input) it is ``error``, its log's last lines kept. ``records``: where the run
    timed out, the run of ``--judge-records`` after it, whose report (if it wrote one) is the verdict:
    ``failed`` for a regression its records hold, else ``error`` (a cut run is never green)."""
    text, _ = artifacts.read_log(out / "console.log")
    lines = tail(text or "")
    if fin.error:
        return Verdict(status="error", reason=f"{name}'s tests could not run: could not launch: {fin.error}",
                       tail=lines), {}
    report = _report_of(name, out)
    if fin.timed_out:
        cut = f"{name}'s tests timed out after {timeout:g}s"
        judged, _ = artifacts.read_log(out / JUDGE_LOG) if records is not None else ("", None)
        if records is None or records.timed_out or report is None or report.get("judged_from_records") is not True:
            why = [ln[len("error: "):] for ln in tail(judged or "") if ln.startswith("error: ")]
            last = last_line(lines)
            return Verdict(status="error", reason=f"{cut}: nothing was judged"
                                                  + (f" (from its records: {why[-1][:200]})" if why else "")
                                                  + (f"; last line: {last[:200]}" if last else ""), tail=lines), {}
        v, info = _verdict(name, report, out)
        status = "failed" if v.status == "failed" else "error"
        info["upstream_tests"]["judged_from_records"] = True
        return Verdict(status=status, reason=f"{cut}; judged from the records its launches left: {v.reason}",
                       tail=lines), {**info, "judge_log": str(out / JUDGE_LOG)}
    if report is None:
        said = [ln[len("error: "):] for ln in lines if ln.startswith("error: ")]
        why = said[-1] if said else f"it exited {fin.returncode} without a report" + (
            f"; last line: {last_line(lines)[:200]}" if last_line(lines) else "")
        return Verdict(status="error", reason=f"{name}'s tests could not run: {why}", tail=lines), {}
    return _verdict(name, report, out)


def _report_of(name: str, out: Path) -> dict | None:
    doc, _ = artifacts.read_metrics(out / REPORT)
    return next((r for r in (doc or {}).get("upstreams") or [] if isinstance(r, dict) and r.get("upstream") == name),
                None)


def _verdict(name: str, report: dict, out: Path) -> tuple[Verdict, dict]:
    """A report's verdict (its status: 'incomplete' is an error) and what the night keeps of it."""
    status = {"passed": "passed", "failed": "failed"}.get(report.get("status", ""), "error")
    info = {"upstream_tests": {k: report.get(k) for k in ("tests", "launch", "nproc", "counts", "sides", "seconds",
                                                          "seconds_per_world", "regressions", "fixed", "flaky",
                                                          "not_compared", "no_tests")},
            "log": str(out / name / "result.json"), "console": str(out / "console.log")}
    info["upstream_tests"]["known_failures"] = len(report.get("known_failures") or [])
    info["upstream_tests"]["selected_files"] = len(report.get("selection") or [])
    info["upstream_tests"]["bisect"] = [{k: b.get(k) for k in ("id", "category", "first_patch", "note")}
                                        for b in _bisected(report)]
    return Verdict(status=status, reason=report.get("reason", "")), info


def _bisected(report: dict) -> list[dict]:
    """The report's bisection entries: none where it says the bisection did not finish (a cut run's, judged
    from its records: ``"bisect": "not finished"``)."""
    found = report.get("bisect")
    return [b for b in found if isinstance(b, dict)] if isinstance(found, list) else []


def summary_lines(runs: list[dict]) -> list[str]:
    """The section of summary.md for the upstream-tests cells: counts per upstream, then what moved."""
    cells = [r for r in runs if r.get("upstream_tests")]
    if not cells:
        return []
    cats = ("regression", "fixed", "flaky", "known-failure", "passed", "skipped", "new", "changed", "not-compared")
    out = ["", "## Upstream's own tests, pristine against patched", "",
           "| upstream | files | " + " | ".join(cats) + " |", "| --- | --- | " + " | ".join("---" for _ in cats) + " |"]
    for r in cells:
        u = r["upstream_tests"]
        total = (u.get("counts") or {}).get("*", {})
        out.append(f"| {r['test']} | {u.get('selected_files', 0)} | " + " | ".join(str(total.get(c, 0)) for c in cats) + " |")
    for r in cells:
        u = r["upstream_tests"]
        if u.get("judged_from_records"):
            out.append(f"- {r['test']}: cut at its timeout, judged from the records its launches left "
                       "(nothing ran again: a regression there is unconfirmed)")
        for b in u.get("bisect") or []:
            out.append(f"- {r['test']} {b['category']}: {b['id']}: {b.get('note') or ''}")
        walls = u.get("seconds_per_world") or {}
        if walls:
            per = "; ".join(f"{side}: " + ", ".join(f"{n} rank(s) {s:g} s" for n, s in sorted(w.items()))
                            for side, w in sorted(walls.items()))
            out.append(f"- {r['test']} wall time per world size: {per} (this host's times, "
                       f"not GTP's price where ranks share a GPU)")
    return out
