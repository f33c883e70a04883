"""What a run printed, read line by line: the lines as the run wrote them, its markers,
``SKIP``/``BUG_HIT`` lines, Python tracebacks and its result line (carry.nightly.judge decides).

Lines. Markers, step markers, ``BUG_HIT`` lines and tracebacks count only as whole lines
printed by the run. A log line is read after removing ANSI colour codes, then at most one
Ray worker prefix, ``(NAME pid=N) `` or ``(pid=N) ``, where NAME may carry a ``[...]``
suffix (``MegatronPolicyWorker[rank=0]``) and the pid an ``, ip=ADDR``; then Ray's
de-duplication suffix (`` [repeated 2x across cluster] ...``) is dropped. A marker counts
when the line then *starts* with it (the details after it are free); a step marker is a
regex that must match at the start of such a line. Nothing else may come first: no
indentation, no logging prefix (``INFO:name:`` could as well be ``ERROR:name:``; the
markers are ``print()``-ed), no quote: ``ERROR: never saw '[gtp] enabling ...'`` does
not count as the marker. Any one matching line satisfies a step marker's step: Ray folds
lines of different workers that differ only in numbers, so a per-rank check must be printed
once for all ranks (integration/README.md, "Verdicts").

Tracebacks (``Traceback (most recent call last):`` as a whole line) fail a
``metrics = "result-line"`` run even with exit 0, after the result line or before it: that
run is one program (the mini test) that prints a traceback only when a rank raised, so a
result line beside one cannot be trusted. Other cells are judged by their exit status,
gates and markers: NeMo-RL's logs carry Ray's and libraries' handled tracebacks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

TAIL_LINES = 40
SKIP_RE = re.compile(r"^SKIP: (?P<reason>.+?)\s*$", re.MULTILINE)
BUG_RE = re.compile(r"BUG_HIT: (?P<id>[a-z0-9][a-z0-9-]*): (?P<message>.*?)\s*$")
TRACEBACK = "Traceback (most recent call last):"
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_RAY_PREFIX_RE = re.compile(r"\((?:[A-Za-z_][\w.]*(?:\[[^\]\s]*\])? )?pid=\d+(?:, ip=[0-9A-Za-z.:-]+)?\) ")
_RAY_DEDUP_RE = re.compile(r"\s*\[repeated \d+x across cluster\].*$")


def tail(text: str, n: int = TAIL_LINES) -> list[str]:
    return text.rstrip("\n").splitlines()[-n:] if text.strip() else []


def run_line(line: str) -> str:
    """A log line as the run printed it: colours, one Ray worker prefix and Ray's dedup suffix off."""
    line = _ANSI_RE.sub("", line)
    m = _RAY_PREFIX_RE.match(line)
    if m:
        line = line[m.end():]
    return _RAY_DEDUP_RE.sub("", line).rstrip()


def run_lines(text: str) -> list[str]:
    return [run_line(ln) for ln in text.splitlines()]


def skip_reason(text: str) -> str | None:
    m = SKIP_RE.search(text)
    return m["reason"] if m else None


def bug_hits(text: str) -> list[tuple[str, str]]:
    return [(m["id"], m["message"]) for m in (BUG_RE.match(ln) for ln in run_lines(text)) if m]


def _result_line_at(text: str) -> tuple[int | None, dict | None]:
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i].strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                doc = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(doc, dict):
                return i, doc
    return None, None


def result_line(text: str) -> dict | None:
    """The last line that is a JSON object (the mini test's final line)."""
    return _result_line_at(text)[1]


def tracebacks(text: str) -> list[str]:
    """One problem per Python traceback in the log, placed against the result line, with its
    exception line (the first unindented line after the frames)."""
    at, _ = _result_line_at(text)
    lines = run_lines(text)
    out = []
    for i, line in enumerate(lines):
        if line != TRACEBACK:
            continue
        exc = next((ln for ln in lines[i + 1:i + 400] if ln and not ln[0].isspace()), "")
        where = "(no result line)" if at is None else ("after the result line" if i > at else "before the result line")
        out.append(f"a Python traceback {where} (log line {i + 1}): {exc[:200] or '?'}")
    return out


def markers_found(text: str, markers: Iterable[str]) -> dict[str, bool]:
    """Whether each marker begins a whole line of the run (module docstring, "Lines")."""
    markers = list(markers)
    found = dict.fromkeys(markers, False)
    for line in run_lines(text):
        for m in markers:
            if not found[m] and m and line.startswith(m):
                found[m] = True
    return found


def last_line(lines: list[str]) -> str:
    """The run's own last words: not blank, not what the launcher added ("[carry] ...")."""
    return next((ln for ln in reversed(lines) if ln.strip() and not ln.startswith("[carry]")), "")
