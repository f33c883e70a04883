"""The tests that moved between the sides (regressions, fixed tests): run again, then bisected over the series.

Each moving test is first run again on the patched trees (a move that does not happen again is ``flaky``, never
a regression), then bisected over the series' prefixes. The regressions go first, with probes of their own: a
fixed test's probes never take their time. Within a group, one probe per prefix serves every test it asks for.

A probe on the failing side of a move is the dear one. Upstream's tests often fail on one rank and leave the
others waiting in a collective; the launch ends there, and each further failing test costs a launch of its own
(Megatron-LM's 29 ``data/test_builder.py`` cases, which the pristine base fails on rank 0 alone, took about 40 s a
launch on one H100, h100/2026-12-06-second-runs: 29 launches a probe, so none was bisected). So the tests of one
kind (one test function, failing alike: the same first error line on the side the test moved from) are
bisected in two passes: first one test of each kind, then the others, with the budget that is left. A test of a
kind whose first was bisected and that its own probes did not reach is left not bisected, and its note says
where its kind's first turned; it is never charged to a patch on its kind's word.
"""

from __future__ import annotations

from typing import Callable

from ..bisect import bisect
from .results import signature
from .verdict import Row

# probe(k, ids, folder): the outcome of each of IDS run once on prefix k, its launches in the bisection's FOLDER
Probe = Callable[[int, list[str], str], dict[str, str]]


def kind_of(r: Row) -> tuple[str, str]:
    """A moving test's kind: its test function (the node id without its parameters) and the first error line of
    the side it moved from (the pristine base's for a fixed test, the patched trees' for a regression)."""
    return r.id.split("[", 1)[0], r.pristine_reason if r.category == "fixed" else r.patched_reason


def first_of_each_kind(movers: list[Row]) -> tuple[list[Row], list[Row]]:
    """MOVERS split into the first test of each kind, in their order, and the others."""
    seen: set[tuple[str, str]] = set()
    first, rest = [], []
    for r in movers:
        (rest if kind_of(r) in seen else first).append(r)
        seen.add(kind_of(r))
    return first, rest


def bisect_movers(rows: list[Row], order: list, series_ids: list[str], probe: Probe,
                  another_host: bool = False) -> list[dict]:
    """Every regression and fixed test of ROWS run again and bisected over ORDER (the series' patches as
    applied); their entries of bisect.json, in the rows' order, each row's category and note set as judged.
    ANOTHER_HOST: the rows' run may have had another host (--bisect-again), so no test is called flaky."""
    cache: dict[int, dict[str, str]] = {}
    n = len(order)
    found: dict[str, dict] = {}

    def outcomes(k: int, ids: list[str], folder: str) -> dict[str, str]:
        have = cache.setdefault(k, {})
        need = [i for i in ids if i not in have]
        if need:
            have.update(probe(k, need, folder))
        return have

    movers = [r for group in ("regression", "fixed") for r in rows if r.category == group]
    for group in ("regression", "fixed"):
        first, rest = first_of_each_kind([r for r in movers if r.category == group])
        for part, batch in (("", first), ("-rest", rest)):
            ids = [r.id for r in batch]
            folder = "k{:03d}" + ("" if group == "regression" else f"-{group}") + part
            for r in batch:
                found[r.id] = bisect_row(r, order, lambda k, ids=ids, folder=folder: outcomes(k, ids, folder.format(k)),
                                         n, series_ids, another_host)
        _name_their_kinds_first(first, rest, found, n)
    return [found[r.id] for r in movers]


def _name_their_kinds_first(first: list[Row], rest: list[Row], found: dict[str, dict], n: int) -> None:
    """The note of each test of REST left not bisected says where its kind's first turned, if it did."""
    turned = {kind_of(r): found[r.id] for r in first if found[r.id].get("first_patch")}
    for r in rest:
        mine, theirs = found[r.id], turned.get(kind_of(r))
        if theirs and not mine.get("first_patch") and mine["category"] != "flaky":
            r.note = mine["note"] = (f"{r.note}; the first of its kind, {theirs['id']}, turns at patch "
                                     f"{theirs['first_index']} of {n}, {theirs['first_patch']}")


class _NotReached(Exception):
    pass


def bisect_row(r: Row, order: list, outcomes: Callable[[int], dict[str, str]], n: int, series_ids: list[str],
               another_host: bool = False) -> dict:
    """One moving test: run again on the patched trees (``outcomes(n)``), then bisected over the prefixes;
    its entry of bisect.json (its row's category and note set as judged). A probe that did not reach it (the
    bisection's budget ran out, or its launches did) leaves it not bisected, never charged to a patch. A move
    that does not happen again is flaky, unless ANOTHER_HOST: then it is left not bisected, its verdict kept."""

    def not_again(why: str) -> dict:
        if another_host:
            r.note = (f"not bisected again: {why}, on the host of --bisect-again, which may not be the run's "
                      "(a flaky verdict needs both runs on one host)")
        else:
            r.category, r.note = "flaky", f"flaky: {why}"
        return {"id": r.id, "category": r.category, "note": r.note}

    target = "failing" if r.category == "regression" else "passing"
    again = outcomes(n)[r.id]
    if again == "not-run":  # the second run never reached it: nothing is confirmed, nothing excused
        r.note = "not confirmed: the second run on the patched trees did not reach it"
        return {"id": r.id, "category": r.category, "note": r.note}
    if signature(again) != target:
        return not_again(f"{r.patched} on the patched trees, then {again} on the same trees")

    def probe(k: int) -> tuple[str, str, str]:
        o = outcomes(k)[r.id]
        if o == "not-run":   # no outcome is neither side of the change: the search would move past it
            raise _NotReached(k)
        return signature(o), o, ""

    try:
        res = bisect(order, target, probe, series_ids)
    except _NotReached as stop:
        r.note = (f"not bisected: the probe of the first {stop.args[0]} patch(es) did not reach it "
                  "(the bisection's budget ran out, or its launches did)")
        return {"id": r.id, "category": r.category, "note": r.note}
    if not res.changed:
        kept = not_again(f"{r.pristine} on the pristine base, then {outcomes(0)[r.id]} on the same base")
        if another_host:
            return kept
    return {"id": r.id, "category": r.category, **res.to_dict()}
