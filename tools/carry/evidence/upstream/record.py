"""Upstream's own tests a patch fixes, recorded beside it: ``upstream_tests`` in its [[patches]] table.

A test that fails on the pristine base and passes on the patched trees is the carry fixing upstream's own
test (verdict ``fixed``). Run again on the patched trees and bisected to the patch that turns it green, it
is evidence for that patch: ``tools/upstream_tests.py --record-fixed RESULT`` writes each such test, as
``UPSTREAM:NODE_ID`` (a Megatron-LM patch can fix a test of Megatron-Bridge's), into the ``upstream_tests``
of the patch its bisection named. Lint checks the entries; retire names them in the patch's evidence and,
with --upstream-tests, runs them on the new base without the patch (rerun.fixed_upstream).

Only a result of this series and of the upstream's tests pin counts: another series' bisection named other
patches. A fixed test whose bisection did not finish (not confirmed, not bisected, flaky) names no patch
and is not recorded: the command says how many were left so. Recording again adds what is new; the file is
written once, whole (an atomic replace), after the new text reads back as the lists it meant to write.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from ...errors import OperationError, UsageError
from ...files import read_input_text, write_atomic
from ...series.edit import set_upstream_tests
from ...series.manifest import Series


def names_its_patch(entry: dict) -> bool:
    """A bisection entry (bisect.json) of a fixed test whose move was confirmed and traced to a patch."""
    return (entry.get("category") == "fixed" and bool(entry.get("changed")) and entry.get("target") == "passing"
            and bool(entry.get("first_patch")))


def fixed_by(series: Series, results: list[tuple[Path, dict]]) -> tuple[dict[str, list[str]], list[str]]:
    """Per patch id, the tests (UPSTREAM:NODE_ID) the results' bisections found it turns green; and the
    fixed tests that named no patch (their id and why)."""
    digest = series.digest(series.patches)[:12]
    found: dict[str, set[str]] = {}
    unnamed = []
    for path, doc in results:
        name = doc["upstream"]
        pin = series.upstream(name).tests
        if pin is None:
            raise UsageError(f"--record-fixed {path}: {name} pins no tests in series {series.name}")
        if doc.get("series_digest") != digest:
            raise UsageError(f"--record-fixed {path}: a result of another series ({doc.get('series_digest') or 'unnamed'}; "
                             f"this one is {digest}): the patches its bisection named may have changed since",
                             hint="run the upstream's tests on this series, then record that result")
        if doc.get("tests") != pin.describe():
            raise UsageError(f"--record-fixed {path}: its tests ({doc.get('tests')}) are not the pinned ones "
                             f"({pin.describe()})")
        entries = doc.get("bisect") if isinstance(doc.get("bisect"), list) else []
        for b in (b for b in entries if isinstance(b, dict) and b.get("category") == "fixed"):
            if names_its_patch(b):
                series.patch(b["first_patch"])   # (an unknown id: the digest would have differed)
                found.setdefault(b["first_patch"], set()).add(f"{name}:{b['id']}")
            else:
                unnamed.append(f"{b.get('id')}: {b.get('note') or 'not bisected'}")
        if doc.get("bisect") == "not finished":
            unnamed += [f"{r['id']}: the run was cut before its bisection" for r in doc.get("fixed") or []]
    return {pid: sorted(tests) for pid, tests in found.items()}, unnamed


def record(series: Series, found: dict[str, list[str]]) -> dict[str, list[str]]:
    """Add FOUND to each patch's ``upstream_tests`` in series.toml; per patch, the tests that were new."""
    manifest = series.root / "series.toml"
    text = read_input_text(manifest)
    added, want = {}, {}
    for p in series.patches:
        new = [t for t in found.get(p.id, []) if t not in p.upstream_tests]
        if new:
            added[p.id] = new
            want[p.id] = sorted({*p.upstream_tests, *new})
            text = set_upstream_tests(text, p.id, want[p.id])
    if not added:
        return {}
    got = {t.get("id"): t.get("upstream_tests") for t in tomllib.loads(text).get("patches", [])}
    if any(got.get(pid) != tests for pid, tests in want.items()):   # never write a manifest that says otherwise
        raise OperationError(f"{manifest}: the edited text does not read back as the tests to record; nothing written")
    write_atomic(manifest, text)
    return added
