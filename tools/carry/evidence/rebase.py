"""Rebase: move one upstream's patches onto a new base with 3-way merging.

The patches are re-applied in a workspace on the new base; when all apply,
they are exported (normalised), the result is re-applied from scratch as a
check, and the new patch files and the moved pin are written as one journalled
step (carry.series.retirement). A conflict stops there with ``git am`` in progress
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
from ..files import read_input, read_input_text, write_json
from ..git import Git
from ..series import edit as seriesedit
from ..series.manifest import PatchMeta, Series, Upstream
from ..series.patchfile import parse_file
from ..series.repo import command
from ..shell import Raw, code, release_instead
from ..workspace import kept, overwrite, sourcepath, sources, trial, userwork
from ..workspace.am import ABSENT, am_patches, clone_base, older_bases
from ..workspace.export import format_patch
from ..workspace.userwork import amend_command
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


@dataclass
class _Job:
    """One rebase: the patches it moves, the new base, its workspace, and its command's options."""
    series: Series
    name: str
    onto: str
    mine: list[PatchMeta]
    new_up: Upstream
    base: sources.Base
    ws: Path
    again: list           # --source and --workdir, as the hints that run rebase again need them
    history: list[Path]   # where merged_in is looked up: the new base, and a --source checkout
    rep: RebaseReport
    replace_edited: bool = False  # --replace-edited: write over a patch file edited since it was read, a copy kept
    read: dict[str, str] = field(default_factory=dict)  # the sha256 of each patch file as the replay read it

    @property
    def g(self) -> Git:
        return Git(self.ws)

    @property
    def new_commit(self) -> str | None:
        return self.new_up.git.commit if self.new_up.git else None

    def command(self, *args: object) -> str:
        """This rebase (or --continue) as a whole command."""
        return command("rebase", self.series, "--onto", f"{self.name}={self.onto}", *self.again, *args)


def rebase(series: Series, name: str, onto: str, cache: Path, workdir: Path, source: Path | None,
           cont: bool = False, replace_edited: bool = False) -> RebaseReport:
    """Move ``name``'s patches onto ``onto``. Four steps: replay them on the new base (or, with
    ``cont``, take the workspace a person finished); match its commits to the series; compare
    each new patch with the old; write the series as one journalled step."""
    job = _prepare(series, name, onto, cache, workdir, source)
    job.replace_edited = replace_edited
    if cont:
        statuses, merged = _resume(job)
    else:
        statuses, merged, stop = _replay(job)
        if stop:
            _stopped(job, *stop, statuses)
            return job.rep
    kept, dropped, commits = _match(job, statuses, merged)
    new_texts = _summarise(job, kept, dropped, commits, statuses, merged)
    retired = [Verdict(pid, "landed", "conflicts", "not-run", "landed", evidence=ev) for pid, ev in merged.items()
               if statuses.get(pid) == MERGED]
    _write(job, new_texts, cache, source, retired)
    return job.rep


def _prepare(series: Series, name: str, onto: str, cache: Path, workdir: Path, source: Path | None) -> _Job:
    """Check the rebase can move the pin; fetch the new base."""
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
    checkout = source.expanduser().resolve() if source is not None else None
    again = [*(["--source", f"{name}={checkout}"] if checkout else []), "--workdir", workdir]
    history = [base.repo] + ([checkout] if checkout is not None and checkout.is_dir() else [])
    return _Job(series, name, onto, mine, new_up, base, ws, again, history,
                RebaseReport(series.name, name, onto, base.describe, str(ws)))


def _resume(job: _Job) -> tuple[dict[str, str], dict[str, list[str]]]:
    """--continue: the statuses the first run left in the workspace a person has finished."""
    marker = _marker(job)
    if marker["base_commit"] != job.base.commit:
        was = f"{job.name}={marker['onto']}"
        raise UsageError(f"{job.ws} was rebased onto another base ({marker['onto']})",
                         hint=f"`{command('rebase', job.series, '--onto', was, *job.again, '--continue')}`")
    if (job.g.git_dir() / "rebase-apply").exists():
        raise DirtyTreeError(f"git am is still in progress in {job.ws}",
                             hint=f"finish it ({code('git', '-C', job.ws, 'am', '--continue')}) or abort it "
                                  f"({code('git', '-C', job.ws, 'am', '--abort')})")
    job.read = marker.get("read", {})  # none from a rebase started before they were kept: every file differing is refused
    return marker["statuses"], marker.get("merged", {})


def _replay(job: _Job) -> tuple[dict[str, str], dict[str, list[str]], tuple[PatchMeta, str] | None]:
    """``git am`` each patch on the new base in a new workspace, until one conflicts. A patch
    upstream merged in its own words (its text conflicts, its merged_in is an ancestor of the new
    base) leaves the series here, with that evidence, instead of stopping for a person.
    Returns the statuses, that evidence, and the patch that stopped it (with why)."""
    ws, g = job.ws, job.g
    if ws.exists():
        if not (ws / ".git").exists() or not (g.git_dir() / MARKER).exists():
            raise DirtyTreeError(f"{ws} exists and is not a rebase workspace", hint="choose another --workdir")
        # Started again: what a person did there (a resolution, commits, notes) is kept whole.
        kept.set_aside(ws.parent, ws, job.name, why="earlier rebase's")
    _new_workspace(job.base, ws, job.onto)
    older = older_bases(job.base)
    statuses: dict[str, str] = {}
    merged: dict[str, list[str]] = {}
    stop = None
    job.read = {p.id: overwrite.sha(read_input(job.series.patch_path(p))) for p in job.mine}
    for p in job.mine:
        r = am_patches(ws, job.series, [p], older)[0]
        statuses[p.id] = r.status
        evidence: list[str] = []
        if r.status == "failed" and link_signal(p, job.new_commit, job.history, evidence) == "landed":
            statuses[p.id] = MERGED
            merged[p.id] = [f"text: the patch conflicts with the new base ({r.detail})", *evidence]
            continue
        if r.status == "failed":
            stop = (p, r.detail)
            break
    write_json(g.git_dir() / MARKER, {"base_commit": job.base.commit, "onto": job.onto, "statuses": statuses,
                                      "merged": merged, "read": job.read})
    return statuses, merged, stop


def _stopped(job: _Job, p: PatchMeta, detail: str, statuses: dict[str, str]) -> None:
    """A patch conflicts: leave its merge for a person, and say how to finish and continue."""
    ws, series, mine = job.ws, job.series, job.mine
    absent = ABSENT in detail
    if not absent:
        # Leave the merge for a person: run the conflicting patch again without aborting.
        job.g("am", "--3way", str(series.patch_path(p)), check=False)
    rest = [str(series.patch_path(q)) for q in mine[mine.index(p) + 1:]]
    for q in mine:
        job.rep.patches.append(Entry(q.id, q.file, "conflicting" if q.id == p.id else
                                     ("pending" if q.id not in statuses else _pre(statuses[q.id])),
                                     detail if q.id == p.id else ""))
    job.rep.ok = False
    # A file the new base lacks (moved or removed upstream): git am would follow a rename
    # silently; a person makes the change where it now belongs and commits it.
    first = (f"make {p.id}'s change by hand where it belongs in {ws} (its file is not in the new base: "
             f"moved or removed upstream?), {code('git', '-C', ws, 'add', '-A', Raw('&&'), 'git', '-C', ws, 'commit', '-m', Raw('SUBJECT'))}"
             if absent else
             f"resolve the conflict in {ws} ({code('git', '-C', ws, 'status')}), "
             f"{code('git', '-C', ws, 'add', Raw('FILES'))}, {code('git', '-C', ws, 'am', '--continue')}")
    job.rep.next = (first + (f", then {code('git', '-C', ws, 'am', '--3way', *rest)}" if rest else "")
                    + f"; then `{job.command('--continue')}`")


def _match(job: _Job, statuses: dict[str, str],
           merged: dict[str, list[str]]) -> tuple[list[PatchMeta], set[str], list[str]]:
    """Every patch is in: map the workspace's new commits to the series, in order. Returns the
    patches that stay, the ids that leave, and one commit per patch that stays."""
    g, mine = job.g, job.mine
    dropped = {pid for pid, st in statuses.items() if st in ("already-applied", MERGED)}
    kept = [p for p in mine if p.id not in dropped]
    commits = g.rev_list(f"{job.base.commit}..HEAD")
    if len(commits) < len(kept):
        # A person skipped a patch while finishing the am: if upstream merged it (merged_in an
        # ancestor of the new base), it is retired here rather than by a hand edit of series.toml.
        subjects = {g("log", "-1", "--format=%s", c).stdout.strip() for c in commits}
        for q in [q for q in kept if parse_file(job.series.patch_path(q)).subject not in subjects]:
            ev = ["text: skipped while the rebase was finished by hand (it conflicted with the new base)"]
            if link_signal(q, job.new_commit, job.history, ev) == "landed":
                statuses[q.id], merged[q.id] = MERGED, ev
        dropped = {pid for pid, st in statuses.items() if st in ("already-applied", MERGED)}
        kept = [p for p in mine if p.id not in dropped]
    if len(commits) != len(kept):
        raise UsageError(f"{job.ws} has {len(commits)} commit(s) on the new base, expected {len(kept)} "
                         f"({', '.join(p.id for p in kept)})",
                         hint="one commit per remaining patch, in series order; a patch upstream already has "
                              f"leaves the series first (`{command('retire', job.series, '--against', f'{job.name}={job.onto}', *job.again[:-2])}`)")
    dirty = userwork.uncommitted(job.ws)
    if dirty:
        raise DirtyTreeError(f"{job.ws} has uncommitted changes: {dirty.shown()}",
                             hint=f"{dirty.reveal()}commit them into their patch's commit ({amend_command(job.ws)} "
                                  "for the last one)")
    return kept, dropped, commits


def _summarise(job: _Job, kept: list[PatchMeta], dropped: set[str], commits: list[str], statuses: dict[str, str],
               merged: dict[str, list[str]]) -> dict[str, str]:
    """Each patch's outcome, in series order, on the report; returns the new text of each patch that stays."""
    series, rep = job.series, job.rep
    new_texts = {}
    for p, c in zip(kept, commits):
        new = format_patch(job.ws, c)
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
                                 + command("retire", series, "--against", f"{job.name}={job.onto}", "--write")))
    order = {p.id: i for i, p in enumerate(job.mine)}
    rep.patches.sort(key=lambda e: order[e.id])
    return new_texts


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


def _write(job: _Job, new_texts: dict[str, bytes], cache: Path, source: Path | None, retired: list[Verdict]) -> None:
    """Re-apply the new series in a scratch copy; only then write it, as one journalled step
    (carry.series.retirement): the changed patch files, the new pin, the patches retired. A
    run killed before the journal leaves the series as it was; after it, the next command
    that loads the series finishes the rebase."""
    series, new_up, rep = job.series, job.new_up, job.rep
    text = read_input_text(series.root / "series.toml")
    if retired:
        text = seriesedit.remove_patches(text, {v.id for v in retired})
    text = seriesedit.repin(text, new_up, new_up.sources[0])
    check = trial.trial_apply(series, text, new_texts, new_up.name, cache, source)
    if not check.ok:
        raise ConflictError("the refreshed series does not re-apply on the new base; nothing was written:\n"
                            + (check.error or ""))
    pending = [(series.patch(pid), series.patch_path(series.patch(pid)), body) for pid, body in new_texts.items()]
    edited = overwrite.edited(pending, {pid: (h,) for pid, h in job.read.items()})
    if edited and not job.replace_edited:  # the check export makes, with the same way past it
        overwrite.refuse(edited, "the rebase read it", "rebase", f"start the rebase again from the files: "
                         f"`{job.command()}` (it sets this rebase's workspace aside whole first)",
                         f"`{job.command('--continue', '--replace-edited')}`", job.ws.parent)
    overwrite.keep_copies(job.ws.parent, series, edited)
    paths = {path: body for _, path, body in pending}
    writes = {path: body for path, body in paths.items() if read_input(path) != body}
    commit_retirement(series, text, retired, rep.new_base, f"{new_up.name}={rep.onto} (rebase)",
                      writes=writes, kind="rebase", what=f"{new_up.name} onto {rep.onto}")
    rep.written = True


def _marker(job: _Job) -> dict:
    ws, g = job.ws, job.g
    start = f"`{job.command()}`"
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
