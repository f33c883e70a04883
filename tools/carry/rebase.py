"""Rebase: move one upstream's patches onto a new base with 3-way merging.

The patches are re-applied in a workspace on the new base; when all apply,
they are exported (normalised), the pin is moved and the result re-applied
from scratch as a check. A conflict stops there with ``git am`` in progress
in the workspace: resolve it with git, finish the remaining patches, then
``--continue`` picks the workspace up. Each patch is summarised like a
range-diff: unchanged, refreshed (context only), modified, dropped (already
upstream), conflicting.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import apply as applying
from . import seriesedit, sources
from .errors import ConflictError, DirtyTreeError, UsageError
from .export import format_patch
from .manifest import Series
from .runner import Git, run

MARKER = "carry-rebase.json"


@dataclass
class Entry:
    id: str
    file: str
    outcome: str      # unchanged | refreshed | modified | dropped | conflicting | pending
    detail: str = ""


@dataclass
class RebaseReport:
    series: str
    upstream: str
    onto: str
    new_base: str
    workspace: str
    ok: bool = True
    written: bool = False
    patches: list[Entry] = field(default_factory=list)
    next: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _changes(text: str) -> list[str]:
    """The +/- lines of a patch: what it does, without context or positions."""
    out = []
    for line in text.splitlines():
        if line.startswith(("+++", "---")):
            continue
        if line.startswith(("+", "-")):
            out.append(line)
    return out


def rebase(series: Series, name: str, onto: str, cache: Path, workdir: Path, source: Path | None,
           cont: bool = False) -> RebaseReport:
    up = series.upstream(name)
    mine = series.patches_for(name)
    if not mine:
        raise UsageError(f"{name} has no patch in series {series.name}")
    new_up, base = sources.retarget(up, onto, cache, source)
    ws = workdir / name
    rep = RebaseReport(series.name, name, onto, base.describe, str(ws))
    g = Git(ws)
    marker_path = lambda: Path(g("rev-parse", "--absolute-git-dir").stdout.strip()) / MARKER  # noqa: E731
    if cont:
        if not ws.exists() or not marker_path().exists():
            raise UsageError(f"no rebase in progress in {ws}", hint="start one without --continue")
        marker = json.loads(marker_path().read_text())
        if marker["base_commit"] != base.commit:
            raise UsageError(f"{ws} was rebased onto another base ({marker['onto']})")
        if Path(g("rev-parse", "--absolute-git-dir").stdout.strip(), "rebase-apply").exists():
            raise DirtyTreeError(f"git am is still in progress in {ws}",
                                 hint=f"finish it (git -C {ws} am --continue) or abort it first")
        statuses = marker["statuses"]
    else:
        if ws.exists():
            if not (ws / ".git").exists() or not marker_path().exists():
                raise DirtyTreeError(f"{ws} exists and is not a rebase workspace", hint="choose another --workdir")
            shutil.rmtree(ws)
        ws.parent.mkdir(parents=True, exist_ok=True)
        run(["git", "clone", "-q", "--local", "--branch", "main", str(base.repo), str(ws)])
        g("remote", "remove", "origin")
        older = [b for b in base.repo.parent.glob("*.git") if b != base.repo]
        statuses = {}
        stop = None
        for p in mine:
            r = applying.am_patches(ws, series, [p], older)[0]
            statuses[p.id] = r.status
            if r.status == "failed":
                stop = (p, r.detail)
                break
        marker_path().write_text(json.dumps({"base_commit": base.commit, "onto": onto, "statuses": statuses}))
        if stop:
            p, detail = stop
            # Leave the merge for a person: run the conflicting patch again without aborting.
            g("am", "--3way", str(series.patch_path(p)), check=False)
            rest = [str(series.patch_path(q)) for q in mine[mine.index(p) + 1:]]
            for q in mine:
                rep.patches.append(Entry(q.id, q.file, "conflicting" if q.id == p.id else
                                         ("pending" if q.id not in statuses else _pre(statuses[q.id])),
                                         detail if q.id == p.id else ""))
            rep.ok = False
            rep.next = (f"resolve the conflict in {ws} (git status), `git add` the files, `git am --continue`"
                        + (f", then `git am --3way {' '.join(rest)}`" if rest else "")
                        + f"; then run tools/rebase.py --series {series.name} --onto {name}={onto} --workdir "
                          f"{workdir} --continue")
            return rep
    # Every patch is in: map the new commits to the series in order.
    dropped = {pid for pid, st in statuses.items() if st == "already-applied"}
    kept = [p for p in mine if p.id not in dropped]
    commits = g.rev_list(f"{base.commit}..HEAD")
    if len(commits) != len(kept):
        raise UsageError(f"{ws} has {len(commits)} commit(s) on the new base, expected {len(kept)} "
                         f"({', '.join(p.id for p in kept)})",
                         hint="one commit per remaining patch, in series order")
    if g.status_porcelain():
        raise DirtyTreeError(f"{ws} has uncommitted changes")
    new_texts = {}
    for p, c in zip(kept, commits):
        new = format_patch(ws, c)
        old = series.patch_path(p).read_text()
        if new == old:
            outcome = "unchanged"
        elif _changes(new) == _changes(old):
            outcome = "refreshed"
        else:
            outcome = "modified"
        new_texts[p.id] = new
        rep.patches.append(Entry(p.id, p.file, outcome, "applied with a 3-way merge"
                                 if statuses.get(p.id) == "applied" and outcome != "unchanged" else ""))
    for pid in dropped:
        p = series.patch(pid)
        rep.patches.append(Entry(pid, p.file, "dropped", "already upstream: retire it with "
                                 f"tools/retire.py --series {series.name} --against {name}={onto} --write"))
    order = {p.id: i for i, p in enumerate(mine)}
    rep.patches.sort(key=lambda e: order[e.id])
    _write(series, new_up, new_texts, cache, source, rep)
    return rep


def _pre(status: str) -> str:
    return {"applied": "refreshed", "already-applied": "dropped"}.get(status, status)


def _write(series: Series, new_up, new_texts: dict[str, str], cache: Path, source: Path | None,
           rep: RebaseReport) -> None:
    text = seriesedit.repin((series.root / "series.toml").read_text(), new_up, new_up.sources[0])
    check = seriesedit.trial_apply(series, text, new_texts, new_up.name, cache, source)
    if not check.ok:
        raise ConflictError("the refreshed series does not re-apply on the new base; nothing was written:\n"
                            + (check.error or ""))
    for pid, body in new_texts.items():
        seriesedit.write_atomic(series.patch_path(series.patch(pid)), body)
    seriesedit.write_atomic(series.root / "series.toml", text)
    rep.written = True
