"""Lint a series: files, metadata, proofs, dependency order, patch safety.

Problems fail the lint. Notes do not: a patch that has no proof and says why
(``proof = "none: <why>"``) is listed, so nobody mistakes it for a proven one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import CarryError
from ..files import read_input
from .manifest import NO_PROOF, PatchMeta, Series
from .patchfile import parse_file, safety_problems
from .patchgit import git_problems

# An upstream link names a pull request, an issue or a commit: what a person opens to see whether
# the fix moved, and what retire's link evidence (merged_in) is checked against.
_LINK_RE = re.compile(r"^https://github\.com/[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*/"
                      r"(pull/[1-9][0-9]*|issues/[1-9][0-9]*|commit/[0-9a-f]{7,40})$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_PROOF_RE = re.compile(r"^proofs/[a-z0-9_]+/test_[a-z0-9_]+\.py(::[A-Za-z_][A-Za-z0-9_]*)?$")
_NEEDS_LINK = ("submitted", "backport", "merged", "rejected")


@dataclass(frozen=True)
class Problem:
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


def notes(series: Series) -> list[Problem]:
    return [Problem(f"patch {p.id}", f"no proof: {p.no_proof}") for p in series.patches if p.no_proof]


def link_problems(p: PatchMeta) -> list[str]:
    """The upstream links' form, and the status and merged_in that depend on them."""
    probs = [f"link {link!r} is not https://github.com/OWNER/REPO/pull/N, /issues/N or /commit/SHA"
             for link in p.links if not _LINK_RE.match(link)]
    if p.status in _NEEDS_LINK and not p.links:
        probs.append(f"status {p.status} needs an upstream link")
    if p.status == "submitted" and p.links and not any("/pull/" in link for link in p.links):
        probs.append("status submitted needs a link to the pull request")
    if p.status == "merged" and not p.merged_in:
        probs.append("status merged needs merged_in (the upstream commit that has it)")
    if p.merged_in is not None and not _COMMIT_RE.match(p.merged_in):
        # retire tests it as an ancestor of a new base: an abbreviated id or a tag name could
        # name another commit later
        probs.append(f"merged_in {p.merged_in!r} must be a full 40-hex upstream commit id")
    return probs


def upstream_test_problems(series: Series, p: PatchMeta) -> list[str]:
    """``upstream_tests`` (upstream's own tests the patch fixes, recorded by tools/upstream_tests.py
    --record-fixed): each once, each UPSTREAM:NODE_ID of an upstream of the series that pins tests."""
    probs = []
    for entry in p.upstream_tests:
        name, _, nodeid = entry.partition(":")
        pin = next((u.tests for u in series.upstreams if u.name == name), None)
        if pin is None:
            probs.append(f"upstream_tests: {entry!r} is not UPSTREAM:NODE_ID of an upstream of this series that pins "
                         "tests")
        elif not (nodeid.startswith(pin.root.rstrip("/") + "/") and ".py::" in nodeid):
            probs.append(f"upstream_tests: {entry!r} is not a test of {name}'s {pin.root}/ "
                         f"({name}:{pin.root}/<file>.py::<test>)")
    twice = sorted({t for t in p.upstream_tests if p.upstream_tests.count(t) > 1})
    return probs + ([f"upstream_tests lists {', '.join(twice)} more than once"] if twice else [])


def file_problems(path: Path, source: str | None = None) -> list[str]:
    """What lint refuses in one patch file (``source`` names it in messages): a file this tool
    cannot read as a patch, an unsafe one, or one git reads otherwise. Export checks each file
    it is about to write with this, so that it never writes a series lint refuses."""
    try:
        parsed = parse_file(path, source)
    except CarryError as exc:
        return [exc.message]
    return safety_problems(parsed) or git_problems([(path, parsed)]).get(path, [])


def same_content(contents: list[tuple[str, bytes]]) -> list[tuple[str, str]]:
    """(patch id, the id of an earlier patch with the very same bytes) for each such pair."""
    seen: dict[bytes, str] = {}
    out = []
    for pid, data in contents:
        if data in seen:
            out.append((pid, seen[data]))
        seen.setdefault(data, pid)
    return out


def lint(series: Series) -> list[Problem]:
    probs: list[Problem] = []
    add = lambda where, msg: probs.append(Problem(where, msg))  # noqa: E731
    upstream_names = {u.name for u in series.upstreams}
    for where, message in series.entry_problems():  # the same check every command loads with
        add(where, message)

    listed = {p.file for p in series.patches}
    for p in series.patches:
        where = f"patch {p.id}"
        for key in ("title", "owner", "why", "retire_when"):
            if not getattr(p, key).strip():
                add(where, f"{key} is empty")
        for msg in link_problems(p):
            add(where, msg)
        if not p.proofs and not p.no_proof:
            add(where, f'has no proof: name a test that fails without the patch, or say why with '
                       f'proof = "{NO_PROOF} <why>"')
        for proof in p.proofs:
            if not _PROOF_RE.match(proof):
                add(where, f"proof {proof!r} must look like proofs/<dir>/test_<name>.py[::test_fn]")
            elif not (series.root / proof.split("::")[0]).exists():  # one that is not a file: entry_problems
                add(where, f"proof file {proof.split('::')[0]} does not exist")
        for msg in upstream_test_problems(series, p):
            add(where, msg)
        path = series.patch_path(p)
        if not path.exists():
            add(where, f"patch file {p.file} does not exist")
        elif path.is_file():  # a directory, a FIFO...: entry_problems says so
            for issue in file_problems(path):
                add(where, issue)

    for where, message in series.requires_problems():
        add(where, message)

    for up in upstream_names:
        folder = series.root / up
        if folder.is_dir():
            for f in sorted(folder.glob("*")):
                rel = f"{up}/{f.name}"
                if f.is_file() and rel not in listed:
                    add(rel, "file in the series folder is not listed in series.toml (orphan)")
    contents = [(p.id, read_input(series.patch_path(p))) for p in series.patches if series.patch_path(p).is_file()]
    for pid, first in same_content(contents):
        add(f"patch {pid}", f"same content as {first}")
    return probs
