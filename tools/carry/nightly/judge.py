"""Judging a test run honestly: passed, failed, skipped or vacuous.

A run is judged from what it left behind, never from its exit status alone:

- ``skipped``: it exited 0 and printed a capability-guard line (``SKIP: <reason>``);
  the reason is kept. A skip is never a pass.
- ``failed``: it timed out (the last log lines are kept), exited non-zero, printed a
  ``BUG_HIT: <patch id>: <message>`` line (whatever its exit status: the line names the
  series bug it met), a metric gate did not hold, a gated metric is missing, not a number or
  not finite at some step, a gated series lacks a step another gated series has, a step
  marker has no line for some step, or (``metrics = "result-line"`` cells) it printed a
  Python traceback.
- ``vacuous``: everything held but an anti-vacuity marker is absent from the
  log: the run passed without doing what it was meant to exercise.
- ``passed``: exit 0, every gate holds, every marker is present.

Gates use NeMo-RL's check_metrics.py form, ``AGG(data["NAME"]) OP NUMBER``,
on metrics shaped as tests/json_dump_tb_logs.py writes them
(``{name: {step: value}}``); a scalar counts as one step, a list's entries are steps
1..n. They are parsed, not ``eval``-ed. Every value a gate reads must be a finite number
(not a bool, a string or null; not NaN or an infinity, which JSON spells ``NaN``,
``Infinity`` or an overflowing literal such as ``-1e400``): one that is not fails the gate,
naming the metric, the step and the value, whatever the aggregate (``max()`` would skip a
NaN that is not first). ``len(data["NAME"])`` counts entries (steps) and reads no value but
still refuses a non-finite one.

At every step: ``min``/``max`` are taken over all steps, so ``min(...) > 0`` holds at every
step. The gated {step: value} series must cover the same steps: a gated metric that lacks a
step another gated metric has fails (``X has no value at step 3``); scalars and lists have
no step keys and are not compared.

Which log lines count (markers, step markers, ``BUG_HIT``, tracebacks): carry.nightly.runlog.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from ..errors import ConfigError
from .runlog import (
    bug_hits,
    last_line,
    markers_found,
    run_lines,
    skip_reason,
    tail,
    tracebacks,
)

STATUSES = ("passed", "failed", "skipped", "vacuous")

_GATE_RE = re.compile(
    r"""^\s*(?P<agg>max|min|mean|median|last|first|len)\(\s*data\[\s*(?P<q>["'])(?P<key>.+?)(?P=q)\s*\]\s*\)"""
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
                          hint="AGG is max, min, mean, median, first, last or len; OP is <, <=, >, >=, == or !=")
    threshold = float(m["num"])
    if not math.isfinite(threshold):
        raise ConfigError(f"gate {text!r}: {m['num']} is not a finite number (as a float it is {threshold})",
                          hint="a gate against an infinity holds for every finite value: use a finite bound")
    return Gate(text.strip(), m["agg"], m["key"], m["op"], threshold)


@dataclass(frozen=True)
class StepMarker:
    """A regex with a named group ``step``: a line matching it must exist for every gated step."""
    text: str
    pattern: re.Pattern


def parse_step_marker(text: str) -> StepMarker:
    try:
        pattern = re.compile(text)
    except re.error as exc:
        raise ConfigError(f"step marker {text!r} is not a valid regex: {exc}") from None
    if "step" not in pattern.groupindex:
        raise ConfigError(f"step marker {text!r} has no named group 'step'",
                          hint=r"write the step's place as (?P<step>\d+), e.g. '\[refit-check\] step (?P<step>\d+): ...'")
    return StepMarker(text, pattern)


# -- metric values -----------------------------------------------------------------------------
class MetricError(ValueError):
    """A metric value a gate cannot read: the message names the metric, the step and the value;
    ``value`` is that value when it is a (non-finite) number."""

    def __init__(self, message: str, value: float | None = None):
        super().__init__(message)
        self.value = value


def _step_key(step: Any):
    try:
        return (0, int(step))
    except (TypeError, ValueError):
        return (1, str(step))


def step_label(step: Any) -> str:
    """One spelling per step: "02", 2 and "2" are step 2."""
    k = _step_key(step)
    return str(k[1])


def _points(value: Any) -> list[tuple[str | None, Any]]:
    if isinstance(value, dict):
        return [(step_label(k), v) for k, v in sorted(value.items(), key=lambda kv: _step_key(kv[0]))]
    if isinstance(value, list):
        return [(str(i), v) for i, v in enumerate(value, 1)]
    return [(None, value)]


def _what(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"a bool ({json.dumps(v)})"
    if isinstance(v, str):
        return f"a string ({v[:40]!r})"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "an object"
    return f"a {type(v).__name__}"


def _fmt(v: float) -> str:
    return "NaN" if math.isnan(v) else repr(v)


def read_values(key: str, value: Any, *, numbers: bool = True) -> list[tuple[str | None, float]]:
    """The (step, value) points of a metric, each checked: a finite number (``numbers``), else a
    MetricError naming the metric, the step and what the value is. Without ``numbers`` (``len``),
    only numbers are checked for finiteness and other entries are kept as they are."""
    pts = _points(value)
    out = []
    for step, v in pts:
        at = f" at step {step}" if step is not None else ""
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            if numbers:
                raise MetricError(f"{key} is {_what(v)}{at}, not a number")
            out.append((step, v))
            continue
        try:
            f = float(v)
        except OverflowError:  # a JSON integer literal past float range
            raise MetricError(f"{key} is an integer of {len(str(abs(v)))} digits{at}, past float range") from None
        if not math.isfinite(f):
            raise MetricError(f"{key} is {_fmt(f)}{at}", f)
        out.append((step, f))
    return out


def aggregate(agg: str, value: Any, key: str = "metric") -> float:
    if agg == "len":
        if not isinstance(value, (dict, list)):
            raise MetricError(f"{key} is {_what(value)}, not a list or a series: len() counts entries")
        return float(len(read_values(key, value, numbers=False)))
    vals = [v for _, v in read_values(key, value)]
    if not vals:
        raise MetricError(f"{key} has no values")
    fn = {"max": max, "min": min, "mean": statistics.fmean, "median": statistics.median,
          "last": lambda v: v[-1], "first": lambda v: v[0]}[agg]
    try:
        out = fn(vals)
    except OverflowError:
        out = math.inf
    if not math.isfinite(out):  # finite values whose mean (or median) overflows
        raise MetricError(f"{agg}({key}) of finite values overflows", out)
    return out


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
        value = aggregate(gate.agg, metrics[gate.key], gate.key)
    except MetricError as exc:
        return GateResult(gate.text, exc.value, False, str(exc))
    ok = _OPS[gate.op](value, gate.threshold)
    return GateResult(gate.text, value, ok, "" if ok else f"{gate.agg}({gate.key}) = {value:.10g}, "
                      f"wanted {gate.op} {gate.threshold:g}")


def gated_steps(gates: Iterable[Gate], metrics: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The steps the gated {step: value} series show (their union, in order), and a problem for
    each gated series that lacks one of them."""
    keyed = {g.key: metrics[g.key] for g in gates
             if g.agg != "len" and isinstance(metrics.get(g.key), dict) and metrics[g.key]}
    have = {k: {step_label(s) for s in v} for k, v in keyed.items()}
    steps = sorted(set().union(*have.values()), key=_step_key) if have else []
    problems = []
    for key, own in have.items():
        lack = [s for s in steps if s not in own]
        if lack:
            problems.append(f"{key} has no value at {_steps(lack)}, which other gated metrics have")
    return steps, problems


def _steps(steps: list[str]) -> str:
    return ("step " if len(steps) == 1 else "steps ") + ", ".join(steps)


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
    pts = _points(value)
    if not pts:
        return None
    v = pts[-1][1]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        return float(v)
    except OverflowError:
        return None


def step_markers_missing(text: str, step_markers: Iterable[StepMarker], steps: list[str]) -> list[str]:
    """For each step marker, the steps no whole line of the run matches it for."""
    out = []
    lines = run_lines(text)
    for sm in step_markers:
        seen = set()
        for line in lines:
            m = sm.pattern.match(line)
            if m and m.group("step") is not None:
                seen.add(step_label(m.group("step")))
        lack = [s for s in steps if s not in seen]
        if lack:
            out.append(f"no log line matches step marker {sm.text!r} at {_steps(lack)}")
    return out


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
          step_markers: Iterable[StepMarker] = (), metrics_source: str = "none") -> Verdict:
    """Judge one run from its exit status, its log text and its metrics.

    ``metrics`` is the document as read (a result line, a metrics file): gates read it as it
    is, so a value that is not a number is named, not dropped. ``marker_text`` is where the
    markers and step markers must appear (e.g. the test's own run.log); it defaults to
    ``text``. ``metrics_source`` is the cell's ``metrics`` setting: with ``"result-line"`` a
    traceback anywhere in ``text`` fails the run.
    """
    marker_text = text if marker_text is None else marker_text
    metrics = metrics or {}
    gates, markers, step_markers = list(gates), list(markers), list(step_markers)
    v = Verdict(status="failed", tail=tail(text),
                metrics={k: s for k, s in ((k, summary_value(x)) for k, x in numeric_metrics(metrics).items())
                         if s is not None})
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
    skip = skip_reason(text)
    if rc == 0 and skip is not None and not hits:
        v.status, v.reason = "skipped", skip
        return v
    v.gates = [evaluate_gate(g, metrics) for g in gates]
    v.markers = markers_found(marker_text, markers)
    if hits:
        v.reason = f"BUG_HIT {hits[0][0]}: {hits[0][1]}" + (" (it exited 0)" if rc == 0 else "")
        return v
    if rc != 0:
        last = last_line(v.tail)
        v.reason = f"exited {rc}" + (f"; last line: {last[:200]}" if last else "")
        return v
    problems = [f"gate {g.gate}: {g.detail}" for g in v.gates if not g.ok]
    steps, gaps = gated_steps(gates, metrics)
    problems += gaps
    if step_markers:
        if steps:
            problems += step_markers_missing(marker_text, step_markers, steps)
        else:
            problems.append("step markers need per-step metrics, and no gated metric has steps")
    if metrics_source == "result-line":
        problems += tracebacks(text)
    if problems:
        v.reason = "; ".join(problems)
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
