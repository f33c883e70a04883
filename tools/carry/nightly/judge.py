"""Judging a test run honestly: passed, failed, skipped or vacuous.

A run is judged from what it left behind, never from its exit status alone:

- ``skipped``: it exited 0 and ended with the capability guard's line (``SKIP: NAME: REASON``,
  carry.nightly.runlog.skip_line: the form and the place its writers print it), and nothing
  says the test ran or broke (judge's docstring); the reason is kept. A skip is never a pass, and
  a ``SKIP:`` line elsewhere, or beside a failing gate or a marker, is no skip.
- ``failed``: it timed out (the last log lines are kept), exited non-zero, printed a
  ``BUG_HIT: <patch id>: <message>`` line (whatever its exit status: the line names the
  series bug it met), a metric gate did not hold, a gated metric is missing, not a number or
  not finite at some step, a gated series lacks a step another gated series has, or one of the
  steps 1..N of a run configured for N steps, a step marker has no line for some step (a line
  whose count is 0 checks nothing), its metrics could not be read (a cut-off result line, a
  metrics file that is not a readable JSON object), or (``metrics = "result-line"`` cells) it
  printed a Python traceback.
- ``vacuous``: everything held but an anti-vacuity marker is absent from the
  log: the run passed without doing what it was meant to exercise.
- ``passed``: exit 0, every gate holds, every marker is present.

Gates, metric values and steps: carry.nightly.metrics. Which log lines count (markers, step
markers, ``BUG_HIT``, ``SKIP:``, tracebacks): carry.nightly.runlog.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from .metrics import (
    Gate,
    GateResult,
    StepMarker,
    evaluate_gate,
    gated_steps,
    marker_match,
    numeric_metrics,
    parse_gate,
    parse_step_marker,
    step_markers_missing,
    summary_value,
)
from .runlog import (
    bug_hits,
    fail_lines,
    last_line,
    markers_found,
    run_lines,
    skip_line,
    tail,
    tracebacks,
)

# The names other modules and the tests take from here (the judge's vocabulary).
__all__ = ["STATUSES", "Gate", "GateResult", "StepMarker", "Verdict", "deterministic_flags", "evaluate_gate",
           "gated_steps", "judge", "numeric_metrics", "parse_gate", "parse_step_marker", "step_markers_missing",
           "summary_value"]

STATUSES = ("passed", "failed", "skipped", "vacuous")
METRICS_KEPT = 1000  # NeMo-RL's metrics.json has about a hundred
KEY_WIDTH = 200


# -- the verdict ---------------------------------------------------------------------------
@dataclass
class Verdict:
    status: str
    reason: str = ""
    bug: str | None = None
    gates: list[GateResult] = field(default_factory=list)
    markers: dict[str, bool] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    tail: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)

    def signature(self) -> str:
        """What 'the same result' means for bisection: status plus the cause."""
        if self.status != "failed":
            return self.status
        if self.bug:
            return f"failed:bug:{self.bug}"
        head = re.sub(r"0x[0-9a-fA-F]+", "0x?", self.reason.splitlines()[0] if self.reason else "")
        return "failed:" + " ".join(head.split())[:160]

    def to_dict(self) -> dict:
        return asdict(self)


def judge(*, rc: int | None, timed_out: bool, text: str, metrics: dict[str, Any] | None,
          gates: Iterable[Gate] = (), markers: Iterable[str] = (), timeout_s: float | None = None,
          launch_error: str | None = None, marker_text: str | None = None,
          step_markers: Iterable[StepMarker] = (), metrics_source: str = "none",
          steps: int | None = None, metrics_problem: str = "", first_step: int = 1) -> Verdict:
    """Judge one run from its exit status, its log text and its metrics.

    ``metrics`` is the document as read (a result line, a metrics file): gates read it as it
    is, so a value that is not a number is named, not dropped. ``metrics_problem`` says why the
    document could not be read (a cut-off result line, a metrics file that is not a file): it
    fails the run. ``first_step``: the first step a resumed run makes (gated_steps). ``marker_text`` is the test's own log (e.g. its run.log), where the markers
    and step markers must appear; None when the run left none (then ``text``). ``metrics_source``
    is the cell's ``metrics`` setting: with ``"result-line"`` a traceback anywhere in ``text``
    fails the run. ``steps``: how many steps the run is configured for (gated_steps).

    A ``SKIP:`` line makes a run ``skipped`` only in the guard's form and place (runlog.skip_line),
    with exit 0, and with nothing that says the test ran or broke: no ``BUG_HIT``, no traceback,
    no own log, no gated metric, no marker, no step-marker line, a readable document whose own
    ``status`` (the mini test's) is ``skipped`` if it has one. Else it is judged as any run.
    """
    own_log = marker_text is not None
    marker_text = text if marker_text is None else marker_text
    metrics = metrics or {}
    gates, markers, step_markers = list(gates), list(markers), list(step_markers)
    v = Verdict(status="failed", tail=tail(text), metrics=_reported(metrics, gates))
    hits = bug_hits(text)
    if hits:
        v.bug = hits[0][0]
    if launch_error:
        v.reason = f"could not launch: {launch_error}"
        return v
    if timed_out:
        v.reason = f"timed out after {timeout_s:g}s" if timeout_s else "timed out"
        last = last_line(v.tail)
        if last:
            v.reason += f"; last line: {last[:200]}"
        return v
    v.gates = [evaluate_gate(g, metrics) for g in gates]
    v.markers = markers_found(marker_text, markers)
    traces = tracebacks(text)
    skip, skip_why = skip_line(text)
    if skip is not None:
        against = _ran_anyway(rc=rc, hits=hits, traces=traces, own_log=own_log, gates=gates, metrics=metrics,
                              markers=v.markers, step_markers=step_markers, marker_text=marker_text,
                              metrics_problem=metrics_problem)
        if not against:
            v.status, v.reason, v.gates = "skipped", skip, []
            return v
        skip_why = "its SKIP: line does not count: " + against
    note = f" ({skip_why})" if skip_why else ""
    if hits:
        v.reason = f"BUG_HIT {hits[0][0]}: {hits[0][1]}" + (" (it exited 0)" if rc == 0 else "") + note
        return v
    if rc != 0:
        last = last_line(v.tail)
        v.reason = f"exited {rc}" + (f"; last line: {last[:200]}" if last else "") + note
        return v
    problems = [metrics_problem] if metrics_problem else []
    # What the run itself says of its outcome, whatever its exit status: its FAIL: lines, and the
    # result's own status (the mini test writes "passed", "failed" or "skipped").
    problems += [f"the run printed FAIL: {f[:200]}" for f in fail_lines(text if marker_text is text
                                                                     else text + "\n" + marker_text)[:3]]
    if "status" in metrics and metrics["status"] != "passed":
        problems.append(f"its result says status {str(metrics['status'])[:40]!r}")
    problems += [f"gate {g.gate}: {g.detail}" for g in v.gates if not g.ok]
    shown, gaps = gated_steps(gates, metrics, steps, first_step)
    problems += gaps
    if step_markers:
        if shown:
            problems += step_markers_missing(marker_text, step_markers, shown)
        else:
            problems.append("step markers need per-step metrics, and no gated metric has steps")
    if metrics_source == "result-line":
        problems += traces
    if problems:
        v.reason = "; ".join(problems) + note
        return v
    missing = [m for m, ok in v.markers.items() if not ok]
    if missing:
        v.status = "vacuous"
        v.reason = "passed without its marker(s): " + "; ".join(repr(m) for m in missing) + note
        return v
    v.status = "passed"
    v.reason = "; ".join(f"{g.gate} (value {g.value:.10g})" for g in v.gates) or "exit 0"
    return v


def _reported(metrics: dict[str, Any], gates: list[Gate]) -> dict[str, float]:
    """One number per metric for run.json, the summary and the history: the gated ones always, the
    others up to METRICS_KEPT names of at most KEY_WIDTH characters (a run may report millions)."""
    nums = {k: s for k, s in ((k, summary_value(x)) for k, x in numeric_metrics(metrics).items()) if s is not None}
    gated = {g.key for g in gates}
    kept = [k for k in nums if k in gated]
    kept += sorted(k for k in nums if k not in gated and len(k) <= KEY_WIDTH)[:max(0, METRICS_KEPT - len(kept))]
    return {k: nums[k] for k in sorted(kept)}


def _ran_anyway(*, rc, hits, traces, own_log, gates, metrics, markers, step_markers, marker_text,
                metrics_problem) -> str:
    """What says a run with a guard's SKIP: line ran, or broke, all the same ("" when nothing does)."""
    if rc != 0:
        return f"it exited {rc}"
    if hits:
        return f"it printed BUG_HIT {hits[0][0]}"
    if traces:
        return traces[0]
    if metrics_problem:
        return metrics_problem
    if own_log:
        return "the test's own log is there: the test ran"
    status = metrics.get("status")
    if status is not None and status != "skipped":
        return f"its result says status {str(status)[:40]!r}"
    measured = sorted({g.key for g in gates if g.key in metrics})
    if measured:
        return "it reported gated metric(s) " + ", ".join(measured[:5])
    found = [m for m, ok in markers.items() if ok]
    if found:
        return f"it printed marker {found[0]!r}"
    lines = run_lines(marker_text) if step_markers else []
    for sm in step_markers:
        if any(marker_match(sm, ln) for ln in lines):
            return f"it printed a line of step marker {sm.text!r}"
    return ""


# -- history: a metric that repeats bit-identically ------------------------------------------
def deterministic_flags(metrics: dict[str, float], previous: dict | None, keys: Iterable[str]) -> list[str]:
    """Flag watched metrics equal, to the last bit, to the previous run of the same cell.

    Two separate runs of a sampled GRPO step (fresh seed each night) should not agree to
    the last bit; when they do, the number is probably not being recomputed (stale logs, a
    cached file, a constant). Counts and settings are not watched: only ``keys``.
    """
    if not previous:
        return []
    flags = []
    old = previous.get("metrics") or {}
    for key in sorted(set(keys)):
        value = metrics.get(key)
        prev = old.get(key)
        if not isinstance(prev, (int, float)) or isinstance(prev, bool) or not isinstance(value, (int, float)):
            continue
        try:
            same = math.isfinite(value) and float(prev).hex() == float(value).hex()
        except OverflowError:  # a history line's integer past float range: not a repeat
            continue
        if same:
            flags.append(f"deterministic: {key} = {value!r} repeats bit-identically "
                         f"(run {previous.get('run_id', '?')})")
    return flags
