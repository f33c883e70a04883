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
not count as the marker. Any one matching line satisfies a step marker's step. Ray folds
lines of different workers that differ only in numbers into one, so a check that runs on
several ranks prints one line per rank, each rank with a step marker of its own (the learning
entry's ``... on rank 0`` and ``... on rank 1``), and its run keeps Ray from folding them
(``RAY_DEDUP_LOGS=0``, integration/README.md, "Verdicts").

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
TAIL_WIDTH = 1000  # characters kept of each tail line (run.json, the summary): a 1 MB line is not a reason
# The capability guard's line, as its writers print it (integration/gtp_refit_mini/run.py:
# "SKIP: gtp_refit_mini: REASON"; integration/nemo_rl_gtp/run-in-image.sh and NeMo-RL's L1 script:
# "SKIP: NAME.sh: REASON"), matched against a whole run line.
SKIP_RE = re.compile(r"SKIP: (?P<who>[A-Za-z0-9_][A-Za-z0-9_.-]*): (?P<reason>\S.*)")
BUG_RE = re.compile(r"BUG_HIT: (?P<id>[a-z0-9][a-z0-9-]*): (?P<message>.*)")
TRACEBACK = "Traceback (most recent call last):"
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_RAY_PREFIX_RE = re.compile(r"\((?:[A-Za-z_][\w.]*(?:\[[^\]\s]*\])? )?pid=\d+(?:, ip=[0-9A-Za-z.:-]+)?\) ")
# No leading \s*: searched from every start of a run of blanks, it made a line of n blanks cost n^2.
_RAY_DEDUP_RE = re.compile(r"\[repeated \d+x across cluster\]")


def tail(text: str, n: int = TAIL_LINES) -> list[str]:
    lines = text.rstrip("\n").splitlines()[-n:] if text.strip() else []
    return [ln if len(ln) <= TAIL_WIDTH else ln[:TAIL_WIDTH] + f" [... {len(ln) - TAIL_WIDTH} more characters]"
            for ln in lines]


def run_line(line: str) -> str:
    """A log line as the run printed it: colours, one Ray worker prefix and Ray's dedup suffix off.
    Linear in the line's length (every pattern here is anchored or literal-led)."""
    if "\x1b" in line:
        line = _ANSI_RE.sub("", line)
    if line.startswith("("):
        m = _RAY_PREFIX_RE.match(line)
        if m:
            line = line[m.end():]
    if "[repeated " in line:
        m = _RAY_DEDUP_RE.search(line)
        if m:
            line = line[:m.start()]
    return line.rstrip()


def run_lines(text: str) -> list[str]:
    return [run_line(ln) for ln in text.splitlines()]


def _skip_lines(lines: list[str]) -> list[int]:
    return [i for i, ln in enumerate(lines) if ln.startswith("SKIP:")]


def skip_line(text: str) -> tuple[str | None, str]:
    """The capability guard's reason when the run ends with its line, in the form and the place its
    writers print it; else None and, when a ``SKIP:`` line is there at all, why it does not count.

    Form: ``SKIP: NAME: REASON`` as a whole run line (module docstring, "Lines"). Place: the
    guard prints it and stops, so it is the run's last line, followed at most by the mini test's
    result line and the launcher's own ``[carry]`` lines; and it is the only one.
    """
    lines = run_lines(text)
    seen = _skip_lines(lines)
    if not seen:
        return None, ""
    at, _ = _result_line_at(text)
    last = next((i for i in range(len(lines) - 1, -1, -1)
                 if lines[i].strip() and i != at and not lines[i].startswith("[carry]")), None)
    if len(seen) > 1:
        return None, f"{len(seen)} SKIP: lines (log lines {', '.join(str(i + 1) for i in seen[:5])}); the guard prints one"
    m = SKIP_RE.fullmatch(lines[seen[0]])
    if not m:
        return None, f"log line {seen[0] + 1} is not the guard's form 'SKIP: NAME: REASON'"
    if last != seen[0] or (at is not None and at < seen[0]):
        return None, f"its SKIP: line (log line {seen[0] + 1}) is not the run's last line: the run went on"
    return f"{m['who']}: {m['reason']}", ""


def skip_reason(text: str) -> str | None:
    return skip_line(text)[0]


def bug_hits(text: str) -> list[tuple[str, str]]:
    return [(m["id"], m["message"].rstrip()) for m in (BUG_RE.match(ln) for ln in run_lines(text)) if m]


def _result_line_at(text: str) -> tuple[int | None, dict | None]:
    at, doc, _ = read_result_line(text)
    return at, doc


def read_result_line(text: str) -> tuple[int | None, dict | None, str]:
    """The result line: the last line that starts with ``{`` (the mini test prints it last), as a
    JSON object; else a problem. A last such line that is not a whole JSON object (cut off by a
    kill or a full disk, nested past the parser's depth, a number past its digit limit) is the
    problem: an earlier line is never taken in its place."""
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i].strip()
        if not line.startswith("{"):
            continue
        try:
            doc = json.loads(line)
        except RecursionError:
            return None, None, f"the result line (log line {i + 1}) is nested too deeply to read"
        except ValueError as exc:  # JSONDecodeError, and the int digit limit's plain ValueError
            why = str(exc)[:200]
            return None, None, (f"the result line (log line {i + 1}, {len(line)} characters) is not valid "
                                f"JSON, cut off or damaged: {why}")
        if not isinstance(doc, dict):
            return None, None, f"the result line (log line {i + 1}) is not a JSON object"
        return i, doc, ""
    return None, None, ""


def result_line(text: str) -> dict | None:
    """The result line as a JSON object, or None (read_result_line says why)."""
    return read_result_line(text)[1]


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
