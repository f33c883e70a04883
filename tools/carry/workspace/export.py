"""Export: workspace commits -> normalised patch files.

Normalised means re-exporting an unchanged workspace changes no byte: no
commit ids, no signature, no diffstat, full blob ids (so ``git am --3way``
can find the pre-image), and a fixed identity and date in the header.
Otherwise a file holds exactly the bytes git writes (a CR is kept), and
``--check`` compares bytes. What export is about to write is first staged
beside its file and checked with lint's own rules: a patch lint or apply
would refuse (a symlink, a binary section, an empty commit...) stops the
export with exit 2 before any file is replaced.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .. import progress
from ..errors import DirtyTreeError, DriftError, PatchFormatError, UsageError
from ..files import fsync_dir, read_input, stage
from ..git import IDENTITY_EMAIL, IDENTITY_NAME, Git
from ..lock import LOCK_TIMEOUT
from ..series.lint import file_problems, same_content
from ..series.manifest import PatchMeta, Series, load
from ..series.repo import command
from ..shell import Raw, code
from . import overwrite, userwork
from .workdir import PatchRecord, State, UpstreamRecord, WorkDir

_FIXED_FROM = f"From: {IDENTITY_NAME} <{IDENTITY_EMAIL}>".encode()
_FIXED_DATE_HDR = b"Date: Sat, 1 Jan 2000 00:00:00 +0000"


def format_patch(repo: Path, commit: str) -> bytes:
    """The normalised patch of ``commit``: git's bytes, with the header's From and Date fixed.
    Empty for a commit that changes nothing (git writes no patch for it)."""
    data = Git(repo)("format-patch", "-1", "--stdout", "--zero-commit", "--no-signature", "--no-stat",
                     "--full-index", "--no-numbered", "--subject-prefix=PATCH", "--encode-email-headers",
                     "-U3", commit, binary=True).stdout
    head, sep, body = data.partition(b"\n\n")
    head = re.sub(rb"(?m)^From: .*(\n[ \t].*)*$", lambda _: _FIXED_FROM, head, count=1)
    head = re.sub(rb"(?m)^Date: .*$", lambda _: _FIXED_DATE_HDR, head, count=1)
    return head + sep + body


@dataclass
class ExportResult:
    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    drift: list[str] = field(default_factory=list)


def export(series: Series, workdir: Path, check: bool, lock_timeout: float = LOCK_TIMEOUT,
           replace_edited: bool = False) -> ExportResult:
    """``replace_edited``: replace a patch file edited since the workspace was applied from it (or
    exported to it), its copy kept in DIR/.carry/replaced; without it, such a file stops the export."""
    wd = WorkDir(workdir)
    wd.require(series)
    result = ExportResult()
    with wd.lock(lock_timeout):
        wd.recover()
        state = wd.require(series)  # a first apply's swap undone leaves none
        pending: list[tuple[PatchMeta, Path, bytes]] = []
        empty: list[tuple[PatchMeta, str]] = []  # a commit that changes nothing: git writes no patch for it
        added = False
        exported: dict[str, list[str]] = {}  # per upstream, the commit each patch was written from
        drifted: list[str] = []  # the upstreams whose files differ (--check): the only ones to rebuild
        edited: list[tuple[PatchMeta, Path, bytes]] = []  # a file changed since apply or export: not ours to lose
        hashes: dict[str, dict[str, str]] = {}  # per upstream, the hash of each patch file once exported
        known = {p.id for p in series.patches}
        for name, rec in state.records():
            ws = wd.workspace(name)
            g = Git(ws)
            dirty = userwork.uncommitted(ws)
            if dirty:
                raise DirtyTreeError(f"{name}: {ws} has uncommitted changes ({dirty.shown(1)})",
                                     hint=f"{dirty.reveal()}commit them into the patch they belong to first "
                                          f"({userwork.amend_command(ws)} for the last one)")
            back = userwork.moved_back(name, ws, rec)
            if back:
                raise back  # not patches gone: an older commit checked out
            gone = [p.id for p in rec.patches if p.id not in known]
            if gone:  # an entry taken out of series.toml by hand: its commit has no file to go to
                raise UsageError(
                    f"{name}: the workspace holds the commit(s) of {', '.join(gone)}, which series.toml no longer "
                    "names: export cannot tell which file each belongs to; nothing was written",
                    hint="to keep them, put their [[patches]] entries back; to leave them out (a patch upstream has "
                         f"leaves the series with tools/retire.py), {userwork.set_aside_hint(wd.root, name, series)}")
            commits = g.rev_list(f"{rec.base_commit}..HEAD")
            # the record's digest vouches for the files it was made from, never for a new entry's
            vouched = set(rec.selected) if _as_recorded(series, name, rec, known) else set()
            new = _new_entries(series, name, rec, len(commits) - len(rec.patches))
            if new:
                added = True
                # Commits made for entries added to series.toml since apply: they become those patches.
                state.add_new_patches(series, name, [PatchRecord(meta.id, meta.file, commit)
                                                     for meta, commit in zip(new, commits[len(rec.patches):])])
            if len(commits) != len(rec.patches):
                raise UsageError(
                    f"{name}: the workspace has {len(commits)} commit(s) on its base but the series applied "
                    f"{len(rec.patches)} patch(es) there",
                    hint="a new patch needs a [[patches]] entry in series.toml (then apply); fixup! commits "
                         "fold into the patch they fix with "
                         + code(Raw("GIT_SEQUENCE_EDITOR=:"), "git", "-C", ws, "rebase", "-q", "-i", "--autosquash",
                                rec.base_commit))
            exported[name], hashes[name] = commits, {}
            for commit, applied in zip(commits, rec.patches):
                meta = series.patch(applied.id)
                path = series.patch_path(meta)
                data = format_patch(ws, commit)
                if not data:
                    empty.append((meta, commit))
                    continue
                hashes[name][meta.id] = overwrite.sha(data)
                old = read_input(path) if path.exists() else None
                if old == data:
                    result.unchanged.append(meta.file)
                else:
                    (result.drift if check else result.written).append(meta.file)
                    drifted.append(name)
                    pending.append((meta, path, data))
                    edited += overwrite.edited([(meta, path, data)], {meta.id: applied.hashes}, vouched)
        if edited and not check and not replace_edited:
            ups = list(dict.fromkeys(meta.upstream for meta, _, _ in edited))
            overwrite.refuse(edited, "the workspace was applied from it (or exported to it)", "export",
                             f"rebuild the workspace from the patch files: {_apply_again(series, wd.root, state, ups)} "
                             "(a workspace with commits of its own is set aside first, as apply's hint says)",
                             f"`{command('export', series, '--workdir', wd.root, '--replace-edited')}`", wd.root)
        staged = _stage_checked(series, pending, empty, {name: (wd.workspace(name), rec.base_commit)
                                                         for name, rec in state.records()})
        try:
            if check:
                if result.drift:
                    raise DriftError("patch files differ from the workspace: " + ", ".join(result.drift),
                                     files=result.drift,
                                     hint=_drift_hint(series, wd.root, state, list(dict.fromkeys(drifted))))
                return result
            overwrite.keep_copies(wd.root, series, edited)
            for tmp, (_, path, _) in zip(staged, pending):
                tmp.replace(path)
            staged = []
        finally:
            for tmp in staged:
                tmp.unlink(missing_ok=True)
        for folder in dict.fromkeys(path.parent for _, path, _ in pending):
            fsync_dir(folder)  # the renames survive a crash
        progress.checkpoint("exported-files")
        # The workspace now matches the files: record that, so apply sees it as up to date. Also
        # when nothing was written: a run killed after the files but before the record left them
        # equal and the record behind, and apply would send the user back here forever.
        fresh = load(series.root)
        before = state.to_dict()
        for name, rec in state.records():
            chosen = [fresh.patch(pid) for pid in rec.selected]
            state.mark_exported(name, fresh.upstream_digest(name, chosen, rec.base_key),
                                Git(wd.workspace(name)).head() or rec.head, exported[name], hashes[name])
        if pending or state.to_dict() != before or added:
            wd.save_state(state)
    return result


def _stage_checked(series: Series, pending: list[tuple[PatchMeta, Path, bytes]], empty: list[tuple[PatchMeta, str]],
                   workspaces: dict[str, tuple[Path, str]]) -> list[Path]:
    """Each file export is about to write, staged beside its place and checked with lint's rules;
    the staged files (in ``pending``'s order) when every one passes. Else none is left and the
    export stops (exit 2): it never writes a series that lint or apply refuses."""
    staged: list[Path] = []
    try:
        for _, path, data in pending:
            staged.append(stage(path, data))
        problems = [(meta, f"commit {commit[:12]} makes no change (an empty commit: git writes no patch for it)")
                    for meta, commit in empty]
        for (meta, _, _), tmp in zip(pending, staged):
            problems += [(meta, why.replace(str(tmp), meta.file).removeprefix(f"{meta.file}: "))
                         for why in file_problems(tmp, meta.file)]
        new = {meta.id: data for meta, _, data in pending}
        contents = [(p.id, new[p.id] if p.id in new else read_input(series.patch_path(p)))
                    for p in series.patches if p.id in new or series.patch_path(p).is_file()]
        problems += [(series.patch(pid), f"same content as patch {first}")
                     for pid, first in same_content(contents) if pid in new or first in new]
        if problems:
            bad = dict.fromkeys(meta.upstream for meta, _ in problems)
            raise PatchFormatError(
                "the workspace holds what a patch file may not hold; no file was written:\n    "
                + "\n    ".join(f"patch {meta.id} ({meta.file}): {why}" for meta, why in problems),
                hint="a patch changes regular text files inside its upstream's tree: change or drop those "
                     "commits, then export again ("
                     + "; ".join(code("git", "-C", workspaces[u][0], "rebase", "-i", workspaces[u][1]) for u in bad)
                     + " edits them)")
    except BaseException:
        for tmp in staged:
            tmp.unlink(missing_ok=True)
        raise
    return staged


def _as_recorded(series: Series, name: str, rec: UpstreamRecord, known: set[str]) -> bool:
    """Every patch file of the upstream is as apply or export last left it: the record's digest
    (of them all) says so. It vouches for a record from before each file's hash was kept. ``known``:
    the series' patch ids."""
    if not all(pid in known for pid in rec.selected):
        return False
    return series.upstream_digest(name, [series.patch(pid) for pid in rec.selected],
                                  rec.base_key) == rec.digest


def _drift_hint(series: Series, root: Path, state: State, upstreams: list[str]) -> str:
    """Both ways out of drift: keep the workspace's change, or drop it (e.g. after the files
    export wrote were discarded, `git checkout patches/`): apply rebuilds from the files."""
    keep = f"`{command('export', series, '--workdir', root)}`, then commit the files"
    return (f"to keep the workspace's change: {keep}; to drop it and go back to the patch files: "
            f"{_apply_again(series, root, state, upstreams)}")


def _apply_again(series: Series, root: Path, state: State, upstreams: list[str]) -> str:
    """The apply that rebuilds ``upstreams`` from the patch files, with the --cache and --source the
    records say apply was given (export takes neither); a record from before they were kept says so."""
    pairs: dict[tuple[str, str], None] = {}
    untold = False
    for name in upstreams:
        rec = state.record(name)
        untold |= rec is None or rec.inputs is None
        given = rec.inputs if rec and rec.inputs else []
        pairs.update(dict.fromkeys(zip(given[::2], given[1::2])))  # one --cache for several upstreams
    inputs = [word for pair in pairs for word in pair]
    cmd = f"`{command('apply', series, '--workdir', root, '--only', ','.join(upstreams), *inputs)}`"
    return cmd + (" (with the --cache and --source options you applied with)" if untold else "")


def _new_entries(series: Series, upstream: str, rec: UpstreamRecord, extra: int) -> list:
    """The series entries that ``extra`` new workspace commits stand for, or [] if that is unclear.

    Only when the applied patches are the upstream's first entries in series order and exactly
    ``extra`` entries follow them: then the new commits are those entries, oldest first.
    """
    if extra <= 0:
        return []
    mine = [p for p in series.patches if p.upstream == upstream]
    applied = [p.id for p in rec.patches]
    if [p.id for p in mine[:len(applied)]] != applied or len(mine) - len(applied) != extra:
        return []
    return mine[len(applied):]
