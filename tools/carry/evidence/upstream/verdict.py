"""Pristine against patched, test by test: what the series broke, fixed, or left as it was.

- ``regression``: patched fails a test that pristine did not (passed, skipped), skips one that pristine
  passed (the series hid it), fails a test only it has, or lost a test pristine had; the night fails,
  and each is bisected to the patch that made it;
- ``fixed``: pristine fails, patched passes: the carry fixes upstream's own test (evidence for the patch
  that turns it green, found by the same bisection);
- ``known-failure``: both fail (listed with each side's first error line, never counted green), each for the
  test's own reason: where a side's failure is the machine's limit (machine_limit: it ran past the per-test
  timeout, or ran out of GPU memory or host threads, which every rank of both sides shares on one GPU), no
  verdict, ``not-compared`` (a later run runs it again);
- ``passed``, ``skipped``, ``xfailed``: the same on both sides; ``new``: only the patched side has it,
  and it passes; ``changed``: another move that is not a failure either way (a skip that now runs);
- ``not-compared``: a side did not reach it (its time budget, the launch), said why;
- ``flaky``: a regression or fix that did not happen again when its trees ran it a second time
  (carry.evidence.upstream.check): listed with each run's outcome, it does not fail the night.
A module that fails to collect is one row (``error`` in phase collect) standing for its tests; where
the other side ran them, it is each of those tests' ``error`` instead (one row per test).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from .launch import SideResult
from .results import Outcome, is_failing, unmet_world

NOT_GREEN = ("regression",)
CATEGORIES = ("regression", "fixed", "flaky", "known-failure", "passed", "skipped", "xfailed", "new", "changed",
              "not-compared")


@dataclass
class Row:
    id: str
    pristine: str
    patched: str
    category: str
    pristine_reason: str = ""
    patched_reason: str = ""
    note: str = ""

    @property
    def file(self) -> str:
        return file_of(self.id)

    def to_dict(self) -> dict:
        return {"id": self.id, "pristine": self.pristine, "patched": self.patched, "category": self.category,
                "pristine_reason": self.pristine_reason, "patched_reason": self.patched_reason, "note": self.note}


def file_of(nodeid: str) -> str:
    """The test file of a test id (``FILE::name``), or the id itself when it is a file's (a module's row)."""
    return nodeid.split("::", 1)[0]


def outcomes_of(side: SideResult) -> dict[str, Outcome]:
    """The side's outcomes with each module that failed to collect as one ``error`` row."""
    out = dict(side.outcomes)
    for node, reason in side.collect_errors.items():
        out.setdefault(node, Outcome("error", reason, "collect"))
    return out


def classify(p: str, q: str) -> tuple[str, str]:
    """(category, note) of a test whose outcome is ``p`` on pristine and ``q`` patched.

    ``absent``: the side never had the test; ``not-run``: it had it and did not reach it."""
    if "not-run" in (p, q):
        return "not-compared", ""
    if p == "absent":
        return ("regression", "only the patched side has it, and it fails") if is_failing(q) else ("new", "")
    if q == "absent":
        return "regression", "the patched side lost a test the pristine side has"
    if is_failing(q):
        return ("known-failure", "") if is_failing(p) else ("regression", "")
    if is_failing(p):
        return ("fixed", "") if q in ("passed", "xpassed") else ("changed", f"{p} on pristine, {q} patched")
    if p == "passed" and q in ("skipped", "xfailed"):
        return "regression", f"passed on pristine, {q} patched: the series hides it"
    if p == q:
        return (p if p in CATEGORIES else "passed"), ""
    if {p, q} <= {"passed", "xpassed"}:
        return "passed", ""
    return "changed", f"{p} on pristine, {q} patched"


# the machine's limits, not the test's: what a failure says where the GPU's memory (every rank of both sides on one GPU
# in --shared-gpu) or the host's threads ran out
_MACHINE = re.compile(r"CUDA out of memory|CUDA error: out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED"
                      r"|Resource temporarily unavailable")


def machine_limit(outcome: str, reason: str) -> str:
    """Why one side's failure says nothing of the test, only of the machine it ran on (its per-test timeout, its GPU's
    memory, its threads), or "" where the failure is the test's."""
    if outcome == "timeout":
        return "ran past the per-test timeout"
    if is_failing(outcome) and (m := _MACHINE.search(reason or "")):
        return f"met the machine's limit ({m.group(0)})"
    return ""


def no_verdict(p: str, p_reason: str, q: str, q_reason: str) -> str:
    """Of a test both sides failed (P and Q, each with its first error line): the note that makes it no verdict where a
    side's failure is the machine's limit (machine_limit), else "": a known failure, each side failing for the test."""
    for side, outcome, reason in (("pristine", p, p_reason), ("patched", q, q_reason)):
        if limit := machine_limit(outcome, reason):
            return f"no verdict: the {side} side {limit}, not the test's failure; a later run runs it again"
    return ""


def outcome_in(side: SideResult, nodeid: str) -> str:
    """One test's outcome in a run of just some tests (a bisection's probe): its own, else ``error`` when
    its module failed to collect there, else ``not-run``."""
    if nodeid in side.outcomes:
        return side.outcomes[nodeid].outcome
    if nodeid in side.collect_errors or file_of(nodeid) in side.collect_errors:
        return "error"
    return "not-run"


def _stand_in(mine: dict[str, Outcome], side: SideResult, other: dict[str, Outcome], other_side: SideResult) -> None:
    """A module that failed to collect on one side, whose tests the other side ran (or had and did not
    reach), is compared test by test: each of those tests is an ``error`` on this side, for the
    module's reason, and the module's own row goes (else a module fixed by the series read as a test
    the patched side lost, and each of its tests as one only the patched side has)."""
    for module, reason in side.collect_errors.items():
        tests = [t for t in other.keys() | other_side.not_run.keys() if t.startswith(module + "::")]
        if not tests or module in other or module in other_side.not_run:
            continue
        for t in tests:
            mine.setdefault(t, Outcome("error", reason, "collect"))
        del mine[module]


def _not_run(side: SideResult, nodeid: str) -> str | None:
    """Why SIDE did not run NODEID, if it did not: named itself, or its file named (a side whose launches
    ended before any collected names the files it did not reach, h100/2026-12-06-mlm-three-shards)."""
    return side.not_run.get(nodeid) or side.not_run.get(file_of(nodeid))


def compare(pristine: SideResult, patched: SideResult) -> list[Row]:
    a, b = outcomes_of(pristine), outcomes_of(patched)
    _stand_in(a, pristine, b, patched)
    _stand_in(b, patched, a, pristine)
    rows = []
    ids = a.keys() | b.keys() | pristine.not_run.keys() | patched.not_run.keys()
    # a file one side did not reach, whose tests the other side names, is those tests' rows, not one of its own
    tested = {file_of(i) for i in a.keys() | b.keys() if "::" in i}
    for nodeid in sorted(i for i in ids if i in a or i in b or i not in tested):
        p = a[nodeid].outcome if nodeid in a else "not-run" if _not_run(pristine, nodeid) else "absent"
        q = b[nodeid].outcome if nodeid in b else "not-run" if _not_run(patched, nodeid) else "absent"
        category, note = classify(p, q)
        why = (a[nodeid].reason if nodeid in a else "", b[nodeid].reason if nodeid in b else "")
        if category == "not-compared":
            note = _not_run(pristine, nodeid) or _not_run(patched, nodeid) or ""
        elif category == "known-failure" and (limit := no_verdict(p, why[0], q, why[1])):
            category, note = "not-compared", limit
        rows.append(Row(nodeid, p, q, category, why[0], why[1], note))
    return rows


def counts(rows: list[Row], root: str = "") -> dict[str, dict[str, int]]:
    """Per test folder (relative to ``root``), how many rows fall in each category; "*" is the total."""
    per: dict[str, Counter] = {"*": Counter()}
    for r in rows:
        folder = r.file.rsplit("/", 1)[0] if "/" in r.file else "."
        if root and (folder == root or folder.startswith(root + "/")):
            folder = folder[len(root):].lstrip("/") or "."
        per.setdefault(folder, Counter())[r.category] += 1
        per["*"][r.category] += 1
    return {k: dict(v) for k, v in sorted(per.items())}


def side_counts(side: SideResult) -> dict[str, int]:
    c = Counter(o.outcome for o in outcomes_of(side).values())
    c["not-run"] = len(side.not_run)
    c["deselected by upstream"] = len(side.deselected)
    return dict(c)


@dataclass(frozen=True)
class Compared:
    """What earlier runs (their result.json, of one upstream, tests pin and series) compared between them, as
    today's judge reads them, read once:

    - ``known``: per test file, the tests any of them knows there (a row, or a test it passed over as compared
      before; a row that names the file alone is no test);
    - ``by``: the tests one of them compared with nothing to look at again (compared_tests) and none found
      regressed: a later run on the same series passes them over;
    - ``whole``: the files each of whose known tests is in ``by``, and the files one found holding no test where
      none knows a test (nothing to run again). So a file stays in while a test of it was not compared,
      regressed, was flaky, refused the world size it ran at (launch.unmet_world: an older judge took that for
      a verdict), came from ranks out of step (earlier.read_back, by whoever loads the result) or
      is a known failure named to run again (--look-again); while its module failed to collect on either side
      in every run that knows it (it ran no test there: what kept it from importing may be there now); and for
      as long as a run found a test of it regressed (a row today's judge of that run's own sides finds again:
      _still_regressed) and its bisection took that regression up (ran it again or bisected it: an entry of its
      "bisect"). A regression its run's bisection never took up (cut, or not finished) is one patched failure
      seen once: where another run on this series compared the same test with nothing to look at again and the
      patched trees passed it, the test failed once and passed once on the same trees, flaky as a bisection's
      second run would have found it (``cleared``); until one does (both sides failing it is no pass), it holds
      its file open. A row that names the file alone (a side that never collected it) says nothing against the
      runs that compared its tests;
    - ``begun``: the files a test of which one of them compared, not only collected;
    - ``deselected``: the files of ``whole`` where none knows a test and one found each test upstream's own marker
      expression deselected (on a side: its CI runs none of them; a file the series changed markers in has rows),
      one that ran under today's MARKERS (its "markers", earlier.read_back): under another expression, or one
      not known, what it deselected says nothing of what today's deselects;
    - ``ends``: per test file, how many launches of theirs ended in a test of it (a rank died or ran past the
      per-test timeout there, or the launcher stopped a rank left behind in it): each costs a launch's start-up;
    - ``cleared``: the tests of ``by`` that one of them found regressed without its bisection taking that up;
    - ``asks``: per test, the most ranks one of them found it asks for (a refusal at the size it ran at, read as
      launch.unmet_world reads it, or a row not compared for it: results.unmet_note's words): where none of
      them reached it at that size, a run of its file needs a launch of that many."""
    known: dict[str, frozenset[str]]
    by: frozenset[str]
    whole: frozenset[str]
    begun: frozenset[str]
    deselected: frozenset[str]
    ends: dict[str, int]
    cleared: frozenset[str] = frozenset()
    asks: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, results: list[dict], markers: str, most: int) -> Compared:
        known: dict[str, set[str]] = {}
        for r in results:
            for nodeid in [row["id"] for row in r.get("rows", [])] + list(r.get("tests_compared_before", [])):
                if "::" in nodeid:
                    known.setdefault(file_of(nodeid), set()).add(nodeid)
        regressed, taken_up, passed = set(), set(), set()
        for r in results:
            mine = _still_regressed(r, {row["id"] for row in r.get("rows", []) if row["category"] == "regression"})
            regressed |= mine
            taken_up |= mine & {e.get("id") for e in (r["bisect"] if isinstance(r.get("bisect"), list) else [])
                                if isinstance(e, dict)}
            passed |= {row["id"] for row in r.get("rows", []) if row["patched"] in ("passed", "xpassed")}
        # compared_tests leaves out a run's own regressions: one in by was compared by another run, and it is cleared
        # only where the patched trees passed it there (both sides failing it again is no pass on the same trees)
        by = set().union(*(compared_tests(r, most) for r in results)) - taken_up - (regressed - passed)
        empty = set().union(*(r.get("no_tests", []) for r in results)) - known.keys()
        begun = {file_of(row["id"]) for r in results for row in r.get("rows", []) if row["category"] != "not-compared"}
        deselected = {file_of(nodeid) for r in results if r.get("markers") == markers
                      for side in r.get("sides", {}).values() for nodeid in side.get("deselected", {})} - known.keys()
        return cls({f: frozenset(ids) for f, ids in known.items()}, frozenset(by),
                   frozenset({f for f, ids in known.items() if ids <= by} | empty | deselected), frozenset(begun),
                   frozenset(deselected), _launch_ends(results), frozenset(by & regressed), _asks(results, most))

    def left_in(self, path: str) -> dict[str, int | None]:
        """Of one test file left: the tests these runs know there, how many of them none compared (None where no run
        knows a test of it), how many of their launches ended in one of its tests (each such test costs one), and
        how many of those not compared ask for more ranks, per size ({"8": 55}: a launch of eight)."""
        known = self.known.get(path, ())
        asking = Counter(str(self.asks[t]) for t in known if t not in self.by and t in self.asks)
        return {"tests_known": len(known), "tests_not_compared": sum(t not in self.by for t in known) if known else None,
                "launches_ended": self.ends.get(path, 0),
                "asking_for_ranks": dict(sorted(asking.items(), key=lambda kv: int(kv[0])))}

    def standing(self, selected: set[str]) -> dict[str, int]:
        """Where these runs stand against the SELECTED test files: how many they compared whole and how many are
        left; of those, the files that hold tests some run knows and none compared (and how many such tests:
        regressed ones included), the files no run knows a test of (never collected, or never reached), and the
        tests already compared in them, which a run passes over. The files whose every test upstream's markers
        deselect are neither compared nor left: counted apart."""
        left = [self.left_in(f) for f in selected - self.whole]
        open_ = [e["tests_not_compared"] for e in left if e["tests_not_compared"] is not None]
        deselected = len(selected & self.deselected)
        return {"files": len(selected), "compared_whole": len(selected) - len(left) - deselected,
                "deselected_whole": deselected, "left": len(left),
                "left_with_tests_not_compared": len(open_), "tests_not_compared": sum(open_),   # none of them 0: whole
                "left_with_no_test_known": len(left) - len(open_),
                "tests_compared_in_those_left": sum(e["tests_known"] for e in left) - sum(open_)}


def look_again(results: list[dict], texts: list[str]) -> dict[str, int]:
    """Name in each result ("look_again": their ids, which compared_tests reads as tests to run again) its known
    failures (both sides failed) whose first error line, on either side, holds one of TEXTS; how many each text
    named."""
    named = dict.fromkeys(texts, 0)
    for r in results:
        ids = set()
        for row in r.get("rows", []):
            lines = (row.get("pristine_reason") or "", row.get("patched_reason") or "")
            for text in texts if row.get("category") == "known-failure" else ():
                if any(text in line for line in lines):
                    ids.add(row["id"])
                    named[text] += 1
        r["look_again"] = sorted(ids)
    return named


def compared_tests(result: dict, most: int) -> set[str]:
    """The tests one run compared and found nothing to look at again: none not compared, regressed or flaky,
    none refusing the world size it ran at for one CI launches (at most MOST ranks: the pin's nproc, unmet_world),
    none from ranks out of step, none of a module that failed to collect on either side, no known failure named
    to run again (--look-again: "look_again", set by whoever loads the result), and none an older judge took for a
    known failure where a side met the machine's limit (no_verdict)."""
    ids, files = _looked_at_again(result, most)
    return {row["id"] for row in result.get("rows", [])
            if row["id"] not in ids and file_of(row["id"]) not in files}


def _looked_at_again(result: dict, most: int) -> tuple[set[str], set[str]]:
    """(test ids, files) of an earlier run that a later one runs again: see compared_tests."""
    ids = {row["id"] for row in result.get("rows", []) if row["category"] in ("not-compared", "regression", "flaky")}
    ids |= {row["id"] for row in result.get("rows", []) if row["category"] == "known-failure"   # an older judge's
            and no_verdict(row["pristine"], row.get("pristine_reason") or "",
                           row["patched"], row.get("patched_reason") or "")}
    ids |= set(result.get("out_of_step", []))
    ids |= set(result.get("look_again", []))   # known failures named by --look-again: the host has changed since
    files: set[str] = set()
    for side in result.get("sides", {}).values():
        files |= {file_of(module) for module in side.get("collect_errors", {})}
        ids |= _refusals(side, most).keys()
    return ids, files


def _still_regressed(result: dict, ids: set[str]) -> set[str]:
    """Of IDS, a result's regression rows, those today's judge finds regressed again from the result's own sides
    (compare): a row an older judge wrote where a side never ran the test is none (h100/2026-12-06-mlm-three-shards'
    pristine side never began: 87 such rows). All of them where its sides cannot be read."""
    if not ids:
        return ids
    try:
        sides = {name: SideResult.from_dict(side) for name, side in result["sides"].items()}
        return ids & {r.id for r in compare(sides["pristine"], sides["patched"]) if r.category == "regression"}
    except (KeyError, TypeError):
        return ids


def _refusals(side: dict, most: int) -> dict[str, int]:
    """Of a result's side (its "sides" entry): each test whose outcome refused the size it ran at, and the size it asks
    for (unmet_world: at most MOST ranks)."""
    return {nodeid: n for nodeid, o in side.get("outcomes", {}).items() if isinstance(o, dict)
            and (n := unmet_world(Outcome(o["outcome"], o.get("reason", ""), world=o.get("world", 1)), most))}


def files_without_rows(files: list[str], rows: list[Row], sides) -> list[str]:
    """The selected FILES that no row stands for and whose tests upstream's markers did not deselect: pytest
    collected no test from them on either side (a file it could not collect, or did not reach, has a row)."""
    seen = {r.file for r in rows}
    seen |= {file_of(nodeid) for side in sides for nodeid in side.deselected}
    return [f for f in files if f not in seen]


_ASKED = re.compile(r"\bit asks for (\d+) ranks \(")   # results.unmet_note's words


def _asks(results: list[dict], most: int) -> dict[str, int]:
    """Per test, the most ranks RESULTS found it asks for (see Compared.asks)."""
    asks: dict[str, int] = {}
    for r in results:
        found = [(row["id"], int(m.group(1))) for row in r.get("rows", []) if (m := _ASKED.search(row.get("note") or ""))]
        for side in r.get("sides", {}).values():
            found += _refusals(side, most).items()
        for nodeid, n in found:
            asks[nodeid] = max(n, asks.get(nodeid, 0))
    return asks


def _launch_ends(results: list[dict]) -> dict[str, int]:
    """Per test file, the launches of RESULTS' sides that ended in a test of it: a test a rank died in or ran past
    its timeout in (``crashed``, ``timeout``), and the test a rank was left behind in when the launcher stopped it."""
    ends: dict[str, int] = {}
    for r in results:
        for side in r.get("sides", {}).values():
            tests = [nodeid for nodeid, o in side.get("outcomes", {}).items()
                     if isinstance(o, dict) and o.get("outcome") in ("crashed", "timeout")]
            tests += [x["stopped"]["test"] for x in side.get("launches", [])
                      if isinstance(x.get("stopped"), dict) and isinstance(x["stopped"].get("test"), str)]
            for nodeid in tests:
                ends[file_of(nodeid)] = ends.get(file_of(nodeid), 0) + 1
    return ends
