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
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import progress
from ..errors import ConflictError, DirtyTreeError, UsageError
from ..files import read_input, read_input_text, write_atomic, write_json
from ..runner import Git
from ..series import edit as seriesedit
from ..series.manifest import Series
from ..series.patchfile import parse_file
from ..series.repo import command
from ..shell import Raw, code, release_instead
from ..workspace import sourcepath, sources, trial
from ..workspace.am import ABSENT, am_patches, clone_base, older_bases
from ..workspace.export import format_patch
from .retire import Verdict, commit_retirement, link_signal

MARKER = "carry-rebase.json"
MERGED = "merged-upstream"  # conflicts, and its merged_in is an ancestor of the new base


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


def _changes(data: bytes) -> list[bytes]:
    """The +/- lines of a patch: what it does, without context or positions (a CR is the line's)."""
    out = []
    for line in data.split(b"\n"):
        if line.startswith((b"+++", b"---")):
            continue
        if line.startswith((b"+", b"-")):
            out.append(line)
    return out


def rebase(series: Series, name: str, onto: str, cache: Path, workdir: Path, source: Path | None,
           cont: bool = False) -> RebaseReport:
    up = series.upstream(name)
    mine = series.patches_for(name)
    if not mine:
        raise UsageError(f"{name} has no patch in series {series.name}")
    stuck = sourcepath.pin_can_move(up, source)
    if stuck:
        raise UsageError(f"{stuck}: the rebased series would still name the old pin; nothing was changed",
                         hint=release_instead("--onto", name))
    new_up, base = sources.retarget(up, onto, cache, source)
    ws = workdir / name
    rep = RebaseReport(series.name, name, onto, base.describe, str(ws))
    g = Git(ws)
    again = [*(["--source", f"{name}={source.expanduser().resolve()}"] if source else []), "--workdir", workdir]
    if cont:
        marker = _marker(g, ws, series, name, onto, again)
        if marker["base_commit"] != base.commit:
            was = f"{name}={marker['onto']}"
            raise UsageError(f"{ws} was rebased onto another base ({marker['onto']})",
                             hint=f"`{command('rebase', series, '--onto', was, *again, '--continue')}`")
        if (g.git_dir() / "rebase-apply").exists():
            raise DirtyTreeError(f"git am is still in progress in {ws}",
                                 hint=f"finish it ({code('git', '-C', ws, 'am', '--continue')}) or abort it "
                                  f"({code('git', '-C', ws, 'am', '--abort')})")
        statuses = marker["statuses"]
        merged = marker.get("merged", {})
    else:
        if ws.exists():
            if not (ws / ".git").exists() or not (g.git_dir() / MARKER).exists():
                raise DirtyTreeError(f"{ws} exists and is not a rebase workspace", hint="choose another --workdir")
            shutil.rmtree(ws)
        _new_workspace(base, ws, onto)
        older = older_bases(base)
        statuses = {}
        merged: dict[str, list[str]] = {}
        stop = None
        history = [base.repo] + ([source.expanduser().resolve()] if source is not None and source.is_dir() else [])
        new_commit = new_up.git.commit if new_up.git else None
        for p in mine:
            r = am_patches(ws, series, [p], older)[0]
            statuses[p.id] = r.status
            evidence: list[str] = []
            if r.status == "failed" and link_signal(p, new_commit, history, evidence) == "landed":
                # Upstream merged it in its own words (the text conflicts, merged_in is an ancestor):
                # it leaves the series here, with that evidence, instead of stopping for a person.
                statuses[p.id] = MERGED
                merged[p.id] = [f"text: the patch conflicts with the new base ({r.detail})", *evidence]
                continue
            if r.status == "failed":
                stop = (p, r.detail)
                break
        write_json(g.git_dir() / MARKER, {"base_commit": base.commit, "onto": onto, "statuses": statuses,
                                          "merged": merged})
        if stop:
            p, detail = stop
            absent = ABSENT in detail
            if not absent:
                # Leave the merge for a person: run the conflicting patch again without aborting.
                g("am", "--3way", str(series.patch_path(p)), check=False)
            rest = [str(series.patch_path(q)) for q in mine[mine.index(p) + 1:]]
            for q in mine:
                rep.patches.append(Entry(q.id, q.file, "conflicting" if q.id == p.id else
                                         ("pending" if q.id not in statuses else _pre(statuses[q.id])),
                                         detail if q.id == p.id else ""))
            rep.ok = False
            # A file the new base lacks (moved or removed upstream): git am would follow a rename
            # silently; a person makes the change where it now belongs and commits it.
            first = (f"make {p.id}'s change by hand where it belongs in {ws} (its file is not in the new base: "
                     f"moved or removed upstream?), {code('git', '-C', ws, 'commit', '-a', '-m', Raw('SUBJECT'))}"
                     if absent else
                     f"resolve the conflict in {ws} ({code('git', '-C', ws, 'status')}), "
                     f"{code('git', '-C', ws, 'add', Raw('FILES'))}, {code('git', '-C', ws, 'am', '--continue')}")
            rep.next = (first
                        + (f", then {code('git', '-C', ws, 'am', '--3way', *rest)}" if rest else "")
                        + f"; then `{command('rebase', series, '--onto', f'{name}={onto}', *again, '--continue')}`")
            return rep
    # Every patch is in: map the new commits to the series in order.
    dropped = {pid for pid, st in statuses.items() if st in ("already-applied", MERGED)}
    kept = [p for p in mine if p.id not in dropped]
    commits = g.rev_list(f"{base.commit}..HEAD")
    if len(commits) < len(kept):
        # A person skipped a patch while finishing the am: if upstream merged it (merged_in an
        # ancestor of the new base), it is retired here rather than by a hand edit of series.toml.
        subjects = {g("log", "-1", "--format=%s", c).stdout.strip() for c in commits}
        history = [base.repo] + ([source.expanduser().resolve()] if source is not None and source.is_dir() else [])
        for q in [q for q in kept if parse_file(series.patch_path(q)).subject not in subjects]:
            ev = ["text: skipped while the rebase was finished by hand (it conflicted with the new base)"]
            if link_signal(q, new_up.git.commit if new_up.git else None, history, ev) == "landed":
                statuses[q.id], merged[q.id] = MERGED, ev
        dropped = {pid for pid, st in statuses.items() if st in ("already-applied", MERGED)}
        kept = [p for p in mine if p.id not in dropped]
    if len(commits) != len(kept):
        raise UsageError(f"{ws} has {len(commits)} commit(s) on the new base, expected {len(kept)} "
                         f"({', '.join(p.id for p in kept)})",
                         hint="one commit per remaining patch, in series order; a patch upstream already has "
                              f"leaves the series first (`{command('retire', series, '--against', f'{name}={onto}', *again[:-2])}`)")
    if g.status_porcelain():
        raise DirtyTreeError(f"{ws} has uncommitted changes",
                             hint=f"commit them into their patch's commit ({code('git', '-C', ws, 'commit', '-a', '--amend', '--no-edit')} "
                                  "for the last one)")
    new_texts = {}
    for p, c in zip(kept, commits):
        new = format_patch(ws, c)
        old = read_input(series.patch_path(p))
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
        rep.patches.append(Entry(pid, p.file, "dropped", "merged upstream in its own words: retired, with "
                                 + merged[pid][-1] if statuses[pid] == MERGED else "already upstream: retire it with "
                                 + command("retire", series, "--against", f"{name}={onto}", "--write")))
    order = {p.id: i for i, p in enumerate(mine)}
    rep.patches.sort(key=lambda e: order[e.id])
    retired = [Verdict(pid, "landed", "conflicts", "not-run", "landed", evidence=ev) for pid, ev in merged.items()
               if statuses.get(pid) == MERGED]
    _write(series, new_up, new_texts, cache, source, rep, retired)
    return rep


def _new_workspace(base: sources.Base, ws: Path, onto: str) -> None:
    """Clone beside ``ws``, mark the clone ours, then rename it into place: a run killed at any
    point leaves no ``ws`` (the next run clears the scratch clone) or a marked one it may replace."""
    scratch = ws.parent / f".{ws.name}.rebase-new"
    if scratch.exists():
        shutil.rmtree(scratch)
    g = clone_base(base, scratch)
    progress.checkpoint("rebase-cloned")
    write_json(g.git_dir() / MARKER, {"base_commit": base.commit, "onto": onto, "statuses": {}, "building": True})
    os.rename(scratch, ws)


def _pre(status: str) -> str:
    return {"applied": "refreshed", "already-applied": "dropped", MERGED: "dropped"}.get(status, status)


def _write(series: Series, new_up, new_texts: dict[str, bytes], cache: Path, source: Path | None,
           rep: RebaseReport, retired: list[Verdict]) -> None:
    text = read_input_text(series.root / "series.toml")
    if retired:
        text = seriesedit.remove_patches(text, {v.id for v in retired})
    text = seriesedit.repin(text, new_up, new_up.sources[0])
    check = trial.trial_apply(series, text, new_texts, new_up.name, cache, source)
    if not check.ok:
        raise ConflictError("the refreshed series does not re-apply on the new base; nothing was written:\n"
                            + (check.error or ""))
    for pid, body in new_texts.items():
        write_atomic(series.patch_path(series.patch(pid)), body)
    if retired:
        commit_retirement(series, text, retired, rep.new_base, f"{new_up.name}={rep.onto} (rebase)")
    else:
        write_atomic(series.root / "series.toml", text)
    rep.written = True


def _marker(g: Git, ws: Path, series: Series, name: str, onto: str, again: list) -> dict:
    start = f"`{command('rebase', series, '--onto', f'{name}={onto}', *again)}`"
    if not ws.exists() or not (g.git_dir() / MARKER).exists():
        raise UsageError(f"no rebase in progress in {ws}", hint=f"start one: {start}")
    try:
        marker = json.loads(read_input_text(g.git_dir() / MARKER))
        marker["base_commit"], marker["onto"], marker["statuses"]
    except (ValueError, KeyError, TypeError) as exc:
        raise DirtyTreeError(f"{g.git_dir() / MARKER} is unreadable ({exc!r})", hint=f"start again: {start}") from None
    if marker.get("building"):
        raise UsageError(f"the rebase in {ws} was interrupted before it had applied the patches",
                         hint=f"start it again: {start}")
    return marker
