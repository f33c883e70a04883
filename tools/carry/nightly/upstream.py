"""The ``upstream-tests`` cells: each upstream's own unit tests, pristine against patched
(carry.evidence.upstream), one cell per upstream that pins tests.

The cell is judged by that comparison, not by gates: ``failed`` when a test regressed (the record
names each one and the patch its bisection found), ``error`` when nothing could be compared (no
test passed on both sides: the tests did not run here, or could not be fetched), ``passed``
otherwise. The engine bisects its own regressions, so the nightly does not bisect these cells.
Each side's time budget is 40% of the cell's timeout (the sides run at once; the rest is for the
re-run of what moved and its bisection); what a side did not reach is counted as not compared.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import CarryError
from ..evidence.bisect import PrefixTrees
from ..evidence.upstream.check import Options as CheckOptions
from ..evidence.upstream.check import check_upstream
from .judge import Verdict

SIDE_SHARE = 0.4


def run_cell(cell, trees: dict[str, Path], prefix: PrefixTrees, out: Path, opts, timeout: float) -> tuple[Verdict, dict]:
    name = cell.upstream
    if name not in trees:
        return Verdict(status="skipped", reason=f"{name} was not applied in this run (--only): its tests have no tree"), {}
    copts = CheckOptions(cache=opts.cache, out=out, sources=dict(opts.tests_sources), budget_s=timeout * SIDE_SHARE,
                         shared_gpu=opts.shared_gpu, test_timeout=min(900.0, timeout * SIDE_SHARE))
    try:
        report = check_upstream(cell.series, name, prefix, trees, copts)
    except CarryError as exc:
        return Verdict(status="error", reason=f"{name}'s tests could not run: {exc.message}"), {}
    status = {"passed": "passed", "failed": "failed"}.get(report.get("status", ""), "error")
    info = {"upstream_tests": {k: report.get(k) for k in ("tests", "launch", "nproc", "counts", "sides", "seconds",
                                                          "seconds_per_world", "regressions", "fixed", "flaky",
                                                          "not_compared")},
            "log": str(out / name / "result.json")}
    info["upstream_tests"]["known_failures"] = len(report.get("known_failures") or [])
    info["upstream_tests"]["selected_files"] = len(report.get("selection") or [])
    info["upstream_tests"]["bisect"] = [{k: b.get(k) for k in ("id", "category", "first_patch", "note")}
                                        for b in report.get("bisect") or []]
    return Verdict(status=status, reason=report.get("reason", "")), info


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
        for b in u.get("bisect") or []:
            out.append(f"- {r['test']} {b['category']}: {b['id']}: {b.get('note') or ''}")
        walls = u.get("seconds_per_world") or {}
        if walls:
            per = "; ".join(f"{side}: " + ", ".join(f"{n} rank(s) {s:g} s" for n, s in sorted(w.items()))
                            for side, w in sorted(walls.items()))
            out.append(f"- {r['test']} wall time per world size: {per} (this host's times, "
                       f"not GTP's price where ranks share a GPU)")
    return out
