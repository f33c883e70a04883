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

What a line is. A log's lines end at ``\n`` (one ``\r`` before it is dropped), nothing else:
a carriage return, U+2028, U+2029, NEL and the other separators ``str.splitlines`` honours are
what a terminal, an editor or a reader may split or join differently, so a line that holds one
is ambiguous and counts for no marker, step marker or ``SKIP:`` line (``run_lines``). The signs
of failure (``BUG_HIT``, ``FAIL:``, tracebacks, fatal errors) are read the other way: every one
of those separators splits (``signal_lines``), so that no way of splitting hides one. A marker
that ends in a letter or digit counts only where the line does not go on with one: ``... on
rank 1`` is not a line that says ``... on rank 10``.

The run's own word on its outcome. A whole line ``FAIL: ...`` (the functional script's and the
mini test's form) fails the run whatever its exit status, as ``BUG_HIT`` does; so does a result
line whose own ``status`` is not ``passed`` (carry.nightly.judge).

Tracebacks (``Traceback (most recent call last):`` as a whole line) fail a
``metrics = "result-line"`` run even with exit 0, after the result line or before it: that
run is one program (the mini test) that prints a traceback only when a rank raised, so a
result line beside one cannot be trusted. The other forms a Python crash takes count the same:
an exception group's ``Exception Group Traceback (most recent call last):`` (drawn with ``+``
and ``|`` before it), a chained exception's ``During handling of the above exception ...`` and
``The above exception was the direct cause ...``, and a crashed interpreter's
``Fatal Python error: ...`` dump (faulthandler's ``Current thread 0x... (most recent call
first):``). Other cells are judged by their exit status,
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


# What str.splitlines splits at besides \n: a line holding one is ambiguous (module docstring).
SEPARATORS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_SEPARATOR_RE = re.compile("[" + re.escape(SEPARATORS) + "\n]")
AMBIGUOUS = "\ufffd"   # what an ambiguous line reads as: it starts no marker, no SKIP:, no step marker


def log_lines(text: str) -> list[str]:
    """The log's lines as written: split at \n only, one \r before it dropped."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def run_lines(text: str) -> list[str]:
    """Whole run lines (run_line each); an ambiguous line reads as AMBIGUOUS + its text."""
    return [AMBIGUOUS + ln if any(c in SEPARATORS for c in ln) else run_line(ln) for ln in log_lines(text)]


def signal_lines(text: str) -> list[str]:
    """Lines as any reader may split them (every separator splits): where the signs of failure are read."""
    return [run_line(ln) for ln in _SEPARATOR_RE.split(text.replace("\r\n", "\n"))]


def starts_with(line: str, marker: str) -> bool:
    """LINE starts with MARKER, and where the marker ends in a letter or digit, the line does not go on
    with one (``rank 1`` is no prefix of ``rank 10``)."""
    if not marker or not line.startswith(marker):
        return False
    return not (marker[-1].isalnum() and len(line) > len(marker) and line[len(marker)].isalnum())


def ends_clean(line: str, end: int) -> bool:
    """A regex match of LINE that stops at END stops where a word or number stops."""
    return not (0 < end < len(line) and line[end - 1].isalnum() and line[end].isalnum())


FAIL_RE = re.compile(r"FAIL: (?P<message>\S.*)")


def fail_lines(text: str) -> list[str]:
    """The run's own ``FAIL: ...`` lines (whole lines, read as the signs of failure are)."""
    return [m["message"].rstrip() for m in (FAIL_RE.match(ln) for ln in signal_lines(text)) if m]


class DuplicateKey(ValueError):
    """A JSON object with a key twice: which value counts is the reader's choice, so the output is ambiguous."""


def no_duplicate_keys(pairs: list) -> dict:
    seen: dict = {}
    for key, value in pairs:
        if key in seen:
            raise DuplicateKey(f"the key {key[:80]!r} is there twice (which value counts would be the reader's "
                               "choice)")
        seen[key] = value
    return seen


def loads_object(text: str):
    """json.loads refusing an object with a key twice (DuplicateKey, a ValueError), at any depth."""
    return json.loads(text, object_pairs_hook=no_duplicate_keys)


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
    return [(m["id"], m["message"].rstrip()) for m in (BUG_RE.match(ln) for ln in signal_lines(text)) if m]


def _result_line_at(text: str) -> tuple[int | None, dict | None]:
    at, doc, _ = read_result_line(text)
    return at, doc


def read_result_line(text: str) -> tuple[int | None, dict | None, str]:
    """The result line: the last line that starts with ``{`` (the mini test prints it last), as a
    JSON object; else a problem. A last such line that is not a whole JSON object (cut off by a
    kill or a full disk, nested past the parser's depth, a number past its digit limit) is the
    problem: an earlier line is never taken in its place."""
    lines = log_lines(text)
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i].strip()
        if not line.startswith("{"):
            continue
        try:
            doc = loads_object(line)
        except RecursionError:
            return None, None, f"the result line (log line {i + 1}) is nested too deeply to read"
        except DuplicateKey as exc:
            return None, None, f"the result line (log line {i + 1}) is ambiguous: {exc}"
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


# The forms a Python crash is printed in (module docstring), read after the exception group's
# drawing ("  + ", "    | ") and indentation are taken off.
CRASH_RE = re.compile(r"(?:Traceback \(most recent call last\):"
                      r"|Exception Group Traceback \(most recent call last\):"
                      r"|During handling of the above exception, another exception occurred:"
                      r"|The above exception was the direct cause of the following exception:"
                      r"|Fatal Python error: .*"
                      r"|(?:Current thread|Thread) 0x[0-9a-fA-F]+ (?:\[.*\] )?\(most recent call first\):)$")
_DRAWING_RE = re.compile(r"^[ \t+|-]*")
_GROUP_DRAWING_RE = re.compile(r"^ *[+|] ?")


def crash_line(line: str) -> bool:
    return bool(CRASH_RE.match(_DRAWING_RE.sub("", line, count=1)))


def tracebacks(text: str) -> list[str]:
    """One problem per Python crash in the log (a traceback, an exception group, a chained exception, a
    fatal-error dump), placed against the result line, with its exception line (the first line after
    the frames that is not indented once the group's drawing is off)."""
    at, _ = _result_line_at(text)
    lines = signal_lines(text)
    # The result line's place among these lines: what the log lines before it split into.
    result = None if at is None else sum(len(_SEPARATOR_RE.split(ln)) for ln in log_lines(text)[:at])
    out = []
    for i, line in enumerate(lines):
        if not crash_line(line):
            continue
        if i > 0 and crash_line(lines[i - 1]):
            continue   # one crash, however many headers it prints in a row
        # An exception group draws "  | " before each of its lines: off, a frame is indented and the
        # exception line is not, as in a plain traceback.
        bare = [_GROUP_DRAWING_RE.sub("", ln, count=1) for ln in lines[i + 1:i + 400]]
        exc = next((ln for ln in bare if ln and not ln[0].isspace() and not ln.startswith("+-")
                    and not crash_line(ln)), "")
        where = ("(no result line)" if result is None
                 else ("after the result line" if i > result else "before the result line"))
        out.append(f"a Python traceback {where} (log line {i + 1}): {exc[:200] or '?'}")
    return out


def markers_found(text: str, markers: Iterable[str]) -> dict[str, bool]:
    """Whether each marker begins a whole line of the run (module docstring, "Lines")."""
    markers = list(markers)
    found = dict.fromkeys(markers, False)
    for line in run_lines(text):
        for m in markers:
            if not found[m] and starts_with(line, m):
                found[m] = True
    return found


def last_line(lines: list[str]) -> str:
    """The run's own last words: not blank, not what the launcher added ("[carry] ...")."""
    return next((ln for ln in reversed(lines) if ln.strip() and not ln.startswith("[carry]")), "")
