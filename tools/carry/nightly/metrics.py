"""What a run's metrics and check lines are read as: gates, metric values, steps.

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
no step keys and are not compared. A cell configured for N steps (the matrix's ``steps``, or
``--steps N`` in its argv) wants steps 1..N in every gated series, lists included (entries
1..n): a step missing from all of them fails too.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass
from typing import Any, Iterable

from ..errors import ConfigError
from .runlog import ends_clean, run_lines

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


# Values a metric's own definition rules out, by the end of its name: (suffix, low, high, whole, why).
# A value outside is no measurement of that metric (a wrong sign, a ratio the wrong way up, a
# log-probability error taken as its logarithm), so a gate never passes on it.
DOMAINS = (
    ("token_mult_prob_error", 1.0, math.inf, False,
     "mean exp|generation logprob - training logprob| over tokens, at least 1"),
    ("pct_mixed", 0.0, 100.0, False, "a percentage of groups"),
    ("changed_fraction", 0.0, 1.0, False, "a fraction of elements"),
    ("accuracy", 0.0, 1.0, False, "a fraction of problems"),
    ("accuracy_gain", -1.0, 1.0, False, "a difference of two fractions"),
    ("rel_l2_change", 0.0, math.inf, False, "a norm ratio"),
    ("grad_norm", 0.0, math.inf, False, "a norm"),
    ("_tensors", 0.0, math.inf, True, "a count"),
    ("tensors_equal", 0.0, math.inf, True, "a count"),
    ("tensors_checked", 0.0, math.inf, True, "a count"),
    ("_params", 0.0, math.inf, True, "a count"),
    ("_gathered", 0.0, math.inf, True, "a count"),
    ("_elements", 0.0, math.inf, True, "a count"),
    ("_mib", 0.0, math.inf, False, "an amount of memory"),
    ("_seconds", 0.0, math.inf, False, "a duration"),
    ("_bytes_received", 0.0, math.inf, True, "a count of bytes"),
)


def ruled_out(key: str, value: float) -> str:
    """Why VALUE cannot be a value of metric KEY by its definition (DOMAINS), else ""."""
    for suffix, low, high, whole, why in DOMAINS:
        if key.endswith(suffix):
            if not low <= value <= high or (whole and value != int(value)):
                span = f"a whole number >= {low:g}" if whole else (
                    f">= {low:g}" if high == math.inf else f"in [{low:g}, {high:g}]")
                return f"{why}: {span}"
            return ""
    return ""


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
        why = ruled_out(key, f)
        if why:
            raise MetricError(f"{key} is {_fmt(f)}{at}, which its definition rules out ({why})", f)
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


def _series_steps(value: Any) -> list[str] | None:
    if isinstance(value, dict):
        return [step_label(s) for s in value]
    if isinstance(value, list):
        return [str(i) for i in range(1, len(value) + 1)]
    return None


def gated_steps(gates: Iterable[Gate], metrics: dict[str, Any],
                expected: int | None = None, first: int = 1) -> tuple[list[str], list[str]]:
    """The steps the gated series must show, and a problem for each gated series that lacks one.

    Without ``expected`` they are the union of what the gated {step: value} series show. With it
    (the run's configuration: the matrix's ``steps``, or ``--steps N`` in its command line) they are
    steps 1..expected, for {step: value} series and lists alike: a step missing from every series
    (steps 1 and 3 of 3) or a run cut short (step 1 of 2) fails, and so does a step past the last.
    Without it the union must still be FIRST..N with no gap (FIRST is 1 unless the run resumed from a
    checkpoint: then the step after it)."""
    keyed = {g.key: metrics[g.key] for g in gates if g.agg != "len" and g.key in metrics
             and (isinstance(metrics[g.key], dict) or (expected is not None and isinstance(metrics[g.key], list)))
             and metrics[g.key]}
    have = {k: set(_series_steps(v) or ()) for k, v in keyed.items()}
    problems = []
    if expected is not None:
        steps = [str(i) for i in range(1, expected + 1)]
        for key, own in have.items():
            lack = [s for s in steps if s not in own]
            extra = sorted(own - set(steps), key=_step_key)
            if lack:
                problems.append(f"{key} has no value at {_steps(lack)} (the run is configured for {expected} steps)")
            if extra:
                problems.append(f"{key} has a value at {_steps(extra)}, past the {expected} steps it is configured for")
        return steps, problems
    steps = sorted(set().union(*have.values()), key=_step_key) if have else []
    for key, own in have.items():
        lack = [s for s in steps if s not in own]
        if lack:
            problems.append(f"{key} has no value at {_steps(lack)}, which other gated metrics have")
    # Without a configured count the steps still run 1..N, one after another: a series at steps 1, 2
    # and 4 lost step 3 from every series; one at steps 0 or "x" is not a run's steps.
    if steps:
        numbered = [s for s in steps if s.isdigit() and int(s) >= first]
        odd = [s for s in steps if s not in numbered]
        if odd:
            problems.append(f"the gated series have {_steps(odd)}, which no run makes (its steps are "
                            f"{first}, {first + 1}, ...)")
        elif numbered != [str(i) for i in range(first, first + len(numbered))]:
            gap = [str(i) for i in range(first, int(numbered[-1]) + 1) if str(i) not in numbered]
            problems.append(f"the gated series lack {_steps(gap)} of steps {first}..{numbered[-1]}: a run's "
                            "steps have no gap")
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


def marker_match(sm: StepMarker, line: str):
    """SM's match at the start of LINE, where it stops as a word or a number does (``rank 1`` is
    not ``rank 10``: runlog.ends_clean); else None."""
    m = sm.pattern.match(line)
    return m if m and ends_clean(line, m.end()) else None


def step_markers_missing(text: str, step_markers: Iterable[StepMarker], steps: list[str]) -> list[str]:
    """For each step marker, the steps no whole line of the run matches it for. A named group
    other than ``step`` is a count of what the line checked: a line whose count is 0 (``0 of 0
    tensors equal``) checked nothing and does not count for its step."""
    out = []
    lines = run_lines(text)
    for sm in step_markers:
        seen, empty = set(), set()
        for line in lines:
            m = marker_match(sm, line)
            if not m or m.group("step") is None:
                continue
            step = step_label(m.group("step"))
            counts = {k: v for k, v in m.groupdict().items() if k != "step" and v is not None and v.isdigit()}
            if any(int(v) == 0 for v in counts.values()):
                empty.add(step)
            else:
                seen.add(step)
        lack = [s for s in steps if s not in seen]
        if lack:
            why = [s for s in lack if s in empty]
            note = f" (a line at {_steps(why)} counts 0: it checked nothing)" if why else ""
            out.append(f"no log line matches step marker {sm.text!r} at {_steps(lack)}{note}")
    return out
