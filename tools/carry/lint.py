"""Lint a series: files, metadata, proofs, dependency order, patch safety."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import CarryError
from .manifest import Series
from .patchfile import parse_file, safety_problems

_LINK_RE = re.compile(r"^https://[A-Za-z0-9.-]+/\S+$")
_PROOF_RE = re.compile(r"^proofs/[a-z0-9_]+/test_[a-z0-9_]+\.py(::[A-Za-z_][A-Za-z0-9_]*)?$")
_NEEDS_LINK = ("submitted", "backport", "merged", "rejected")


@dataclass(frozen=True)
class Problem:
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


def lint(series: Series) -> list[Problem]:
    probs: list[Problem] = []
    add = lambda where, msg: probs.append(Problem(where, msg))  # noqa: E731
    upstream_names = {u.name for u in series.upstreams}
    ids = {p.id for p in series.patches}
    for clash in sorted(ids & upstream_names):
        add(clash, "a patch id equals an upstream name (--only would be ambiguous)")

    listed: dict[str, str] = {}
    for p in series.patches:
        where = f"patch {p.id}"
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]*[a-z0-9]", p.id):
            add(where, "id must be lowercase kebab-case")
        if not p.file.startswith(f"{p.upstream}/") or not p.file.endswith(".patch"):
            add(where, f"file {p.file!r} must be {p.upstream}/<name>.patch")
        if p.file in listed:
            add(where, f"file {p.file} is also listed by {listed[p.file]}")
        listed[p.file] = p.id
        for key in ("title", "owner", "why", "retire_when"):
            if not getattr(p, key).strip():
                add(where, f"{key} is empty")
        for link in p.links:
            if not _LINK_RE.match(link):
                add(where, f"link {link!r} is not an https URL")
        if p.status in _NEEDS_LINK and not p.links:
            add(where, f"status {p.status} needs an upstream link")
        if p.status == "merged" and not p.merged_in:
            add(where, "status merged needs merged_in (the upstream commit or release that has it)")
        for proof in p.proofs:
            if not _PROOF_RE.match(proof):
                add(where, f"proof {proof!r} must look like proofs/<dir>/test_<name>.py[::test_fn]")
            elif not (series.root / proof.split("::")[0]).is_file():
                add(where, f"proof file {proof.split('::')[0]} does not exist")
        path = series.patch_path(p)
        if not path.is_file():
            add(where, f"patch file {p.file} does not exist")
        else:
            try:
                parsed = parse_file(path)
            except CarryError as exc:
                add(where, exc.message)
            else:
                for issue in safety_problems(parsed):
                    add(where, issue)
        for dep in p.requires:
            if dep not in ids:
                add(where, f"requires unknown patch {dep!r}")
            elif dep == p.id:
                add(where, "requires itself")

    order = {p.id: i for i, p in enumerate(series.patches)}
    by_id = {p.id: p for p in series.patches}
    for p in series.patches:
        for dep in p.requires:
            d = by_id.get(dep)
            if d and d.upstream == p.upstream and order[dep] > order[p.id]:
                add(f"patch {p.id}", f"requires {dep}, which comes later in the same upstream's series")
    for cycle in _cycles(series):
        add("requires", "cycle: " + " -> ".join(cycle))

    for up in upstream_names:
        folder = series.root / up
        if folder.is_dir():
            for f in sorted(folder.glob("*")):
                rel = f"{up}/{f.name}"
                if f.is_file() and rel not in listed:
                    add(rel, "file in the series folder is not listed in series.toml (orphan)")
    seen_bytes: dict[bytes, str] = {}
    for p in series.patches:
        path = series.patch_path(p)
        if path.is_file():
            data = path.read_bytes()
            if data in seen_bytes:
                add(f"patch {p.id}", f"same content as {seen_bytes[data]}")
            seen_bytes.setdefault(data, p.id)
    return probs


def _cycles(series: Series) -> list[list[str]]:
    graph = {p.id: list(p.requires) for p in series.patches}
    state: dict[str, int] = {}
    found: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in graph.get(node, []):
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                found.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif state.get(nxt) is None:
                visit(nxt, path + [nxt])
        state[node] = 2

    for n in graph:
        if n not in state:
            visit(n, [n])
    return found
