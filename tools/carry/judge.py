"""Judging a test run honestly: passed, failed, skipped or vacuous.

A run is judged from what it left behind, never from its exit status alone:

- ``skipped``: it exited 0 and printed a capability-guard line (``SKIP: <reason>``);
  the reason is kept. A skip is never a pass.
- ``failed``: it timed out (the last log lines are kept), exited non-zero (a
  ``BUG_HIT: <patch id>: <message>`` line names the series bug it met), a metric
  gate did not hold, or a gated metric is missing.
- ``vacuous``: everything held but an anti-vacuity marker is absent from the
  log: the run passed without doing what it was meant to exercise.
- ``passed``: exit 0, every gate holds, every marker is present.

Gates use NeMo-RL's check_metrics.py form, ``AGG(data["NAME"]) OP NUMBER``,
on metrics shaped as tests/json_dump_tb_logs.py writes them
(``{name: {step: value}}``); a scalar counts as one step. They are parsed, not
``eval``-ed.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from .errors import ConfigError

STATUSES = ("passed", "failed", "skipped", "vacuous")
TAIL_LINES = 40

SKIP_RE = re.compile(r"^SKIP: (?P<reason>.+?)\s*$", re.M)
BUG_RE = re.compile(r"^BUG_HIT: (?P<id>[a-z0-9][a-z0-9-]*): (?P<message>.*?)\s*$", re.M)
_GATE_RE = re.compile(
    r"""^\s*(?P<agg>max|min|mean|median|last|first)\(\s*data\[\s*(?P<q>["'])(?P<key>.+?)(?P=q)\s*\]\s*\)"""
    r"""\s*(?P<op><=|>=|==|!=|<|>)\s*(?P<num>[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?)\s*$""")
_OPS = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
        ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}


@dataclass(frozen=True)
class Gate:
    text: str
    agg: str
    key: str
    op: str
    threshold: float


def parse_gate(text: str) -> Gate:
    m = _GATE_RE.match(text)
    if not m:
        raise ConfigError(f"gate {text!r} is not of the form AGG(data[\"NAME\"]) OP NUMBER",
                          hint="AGG is max, min, mean, median, first or last; OP is <, <=, >, >=, == or !=")
    return Gate(text.strip(), m["agg"], m["key"], m["op"], float(m["num"]))


def _series(value: Any) -> list[float]:
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: _step_key(kv[0]))
        return [float(v) for _, v in items]
    if isinstance(value, list):
        return [float(v) for v in value]
    return [float(value)]


def _step_key(step: Any):
    try:
        return (0, int(step))
    except (TypeError, ValueError):
        return (1, str(step))


def aggregate(agg: str, value: Any) -> float:
    vals = _series(value)
    if not vals:
        raise ValueError("no values")
    return {"max": max, "min": min, "mean": statistics.fmean, "median": statistics.median,
            "last": lambda v: v[-1], "first": lambda v: v[0]}[agg](vals)


@dataclass
class GateResult:
    gate: str
    value: float | None
    ok: bool
    detail: str = ""


def evaluate_gate(gate: Gate, metrics: dict[str, Any]) -> GateResult:
    if gate.key not in metrics:
        return GateResult(gate.text, None, False, f"metric {gate.key!r} is missing")
    try:
        value = aggregate(gate.agg, metrics[gate.key])
    except (TypeError, ValueError) as exc:
        return GateResult(gate.text, None, False, f"metric {gate.key!r} is not numeric: {exc}")
    if math.isnan(value):
        return GateResult(gate.text, value, False, f"{gate.agg}({gate.key}) is NaN")
    ok = _OPS[gate.op](value, gate.threshold)
    return GateResult(gate.text, value, ok, "" if ok else f"{gate.agg}({gate.key}) = {value:.10g}, "
                      f"wanted {gate.op} {gate.threshold:g}")


# -- reading evidence ----------------------------------------------------------------------
def tail(text: str, n: int = TAIL_LINES) -> list[str]:
    return text.rstrip("\n").splitlines()[-n:] if text.strip() else []


def skip_reason(text: str) -> str | None:
    m = SKIP_RE.search(text)
    return m["reason"] if m else None


def bug_hits(text: str) -> list[tuple[str, str]]:
    return [(m["id"], m["message"]) for m in BUG_RE.finditer(text)]


def result_line(text: str) -> dict | None:
    """The last line that is a JSON object (the mini test's final line)."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                doc = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(doc, dict):
                return doc
    return None


def numeric_metrics(doc: dict | None) -> dict[str, Any]:
    """Metric-shaped entries of a document: numbers, and {step: number} maps."""
    out: dict[str, Any] = {}
    for key, value in (doc or {}).items():
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            out[key] = value
        elif isinstance(value, dict) and value and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in value.values()):
            out[key] = value
    return out


def summary_value(value: Any) -> float | None:
    """One number per metric for reports and history: the last step of a series."""
    try:
        return _series(value)[-1]
    except (TypeError, ValueError, IndexError):
        return None


def markers_found(text: str, markers: Iterable[str]) -> dict[str, bool]:
    return {m: (m in text) for m in markers}


def _last_line(lines: list[str]) -> str:
    """The run's own last words: not blank, not what the launcher added ("[carry] ...")."""
    return next((ln for ln in reversed(lines) if ln.strip() and not ln.startswith("[carry]")), "")


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
          launch_error: str | None = None, marker_text: str | None = None) -> Verdict:
    """Judge one run from its exit status, its log text and its metrics.

    ``marker_text`` is where the markers must appear (e.g. the test's own run.log);
    it defaults to ``text``.
    """
    marker_text = text if marker_text is None else marker_text
    metrics = metrics or {}
    gates, markers = list(gates), list(markers)
    v = Verdict(status="failed", tail=tail(text),
                metrics={k: s for k, s in ((k, summary_value(x)) for k, x in metrics.items()) if s is not None})
    hits = bug_hits(text)
    if hits:
        v.bug = hits[0][0]
    if launch_error:
        v.reason = f"could not launch: {launch_error}"
        return v
    if timed_out:
        v.reason = f"timed out after {timeout_s:g}s" if timeout_s else "timed out"
        last = _last_line(v.tail)
        if last:
            v.reason += f"; last line: {last[:200]}"
        return v
    skip = skip_reason(text)
    if rc == 0 and skip is not None:
        v.status, v.reason = "skipped", skip
        return v
    if rc != 0:
        if hits:
            v.reason = f"BUG_HIT {hits[0][0]}: {hits[0][1]}"
        else:
            last = _last_line(v.tail)
            v.reason = f"exited {rc}" + (f"; last line: {last[:200]}" if last else "")
        v.markers = markers_found(marker_text, markers)
        v.gates = [evaluate_gate(g, metrics) for g in gates]
        return v
    v.gates = [evaluate_gate(g, metrics) for g in gates]
    v.markers = markers_found(marker_text, markers)
    bad = [g for g in v.gates if not g.ok]
    if bad:
        v.reason = "; ".join(g.detail for g in bad)
        return v
    missing = [m for m, ok in v.markers.items() if not ok]
    if missing:
        v.status = "vacuous"
        v.reason = "passed without its marker(s): " + "; ".join(repr(m) for m in missing)
        return v
    v.status = "passed"
    v.reason = "; ".join(f"{g.gate} (value {g.value:.10g})" for g in v.gates) or "exit 0"
    return v


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
        if not isinstance(prev, (int, float)) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value) and float(prev).hex() == float(value).hex():
            flags.append(f"deterministic: {key} = {value!r} repeats bit-identically "
                         f"(run {previous.get('run_id', '?')})")
    return flags
