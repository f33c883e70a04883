"""The user's work in a workspace that a rebuild or a recovered swap is about to replace.

A workspace is a whole git repository; replacing it (a rebuild's swap, or the next run
finishing or undoing a swap a killed run left) would take with it every commit apply did not
make and every uncommitted edit. Commits are kept: fetched into the tree that stays, as
``refs/carry/saved/<UTC time>[-N]``. Uncommitted or untracked edits cannot be carried over:
the run refuses, and says how to keep them (a stash is a commit, kept like the others).

Before any rebuild, ``check_untouched`` tells a workspace apply may replace from one a person
changed. Its ways out never destroy: export the change, go back to the series' tip, or set
the workspace aside whole (``tools/kept.py --set-aside``, carry.workspace.kept) and rebuild.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import DirtyTreeError
from ..git import Git
from ..series.manifest import Series
from ..series.repo import command
from ..shell import Raw, code, run_again, tool
from .am import BASE_TAG
from .record import UpstreamRecord

SAVED_PREFIX = "refs/carry/saved/"


@dataclass(frozen=True)
class Uncommitted:
    """What a tree holds that no commit does: ``paths`` as ``git status`` names them, then
    ``hidden``, the edited files git status does not look at (their index entries are marked
    assume-unchanged or skip-worktree: `git stash` and `git commit -a` pass them over too)."""
    ws: Path
    paths: list[str]
    hidden: list[tuple[str, str]]  # (path, its marks)

    def __bool__(self) -> bool:
        return bool(self.paths or self.hidden)

    def shown(self, most: int = 5) -> str:
        every = self.paths + [f"{path} (marked {marks})" for path, marks in self.hidden]
        return ", ".join(every[:most]) + (" ..." if len(every) > most else "")

    def reveal(self) -> str:
        """The commands that let git see the hidden edits, to start a hint with ("" when none). One
        per mark: git update-index clears only the first of two such options it is given."""
        clear = [code("git", "-C", self.ws, "update-index", f"--no-{mark}", "--", *paths) for mark in _MARKS
                 if (paths := [path for path, marks in self.hidden if mark in marks])]
        if not clear:
            return ""
        return f"{' and '.join(clear)} clear the marks (git status, stash and commit -a pass over such files), then "


_MARKS = ("assume-unchanged", "skip-worktree")


def uncommitted(ws: Path) -> Uncommitted:
    """Every difference between the tree ``ws`` and its index or HEAD, untracked files included: what
    ``git status`` shows, and each file whose index entry is marked assume-unchanged or skip-worktree
    (git status trusts the mark and never reads the file) whose mode, or content filtered as `git add`
    would filter it, is not its index entry's. A skip-worktree file absent from the tree (a sparse
    checkout) is no edit; another marked file that is absent is one."""
    g = Git(ws)
    hidden: list[str] = []
    asked: list[tuple[str, str]] = []
    marks: dict[str, str] = {}
    # Every name as its bytes (-z, read as bytes, each byte that is not UTF-8 kept as os.fsdecode
    # keeps it), and given back to git as an argument after --: never a line git would unquote.
    for entry in os.fsdecode(g("ls-files", "-z", "-v", "-s", binary=True).stdout).split("\0"):
        meta, _, path = entry.partition("\t")
        tag, mode, blob = (meta.split() + ["", "", ""])[:3]
        if not path or not (tag.islower() or tag == "S") or mode not in ("100644", "100755", "120000"):
            continue  # unmarked (git status reads it), or a submodule
        marks[path] = ", ".join(m for m, on in zip(_MARKS, (tag.islower(), tag in "Ss")) if on)
        f = ws / path
        if not f.is_symlink() and not f.exists():
            if tag.upper() != "S":
                hidden.append(path)
        elif _mode_of(f) != mode:
            hidden.append(path)
        elif mode == "120000":
            if g("hash-object", "--stdin", input=os.fsencode(os.readlink(f))).stdout.strip() != blob:
                hidden.append(path)
        else:
            asked.append((path, blob))
    for i in range(0, len(asked), 200):  # each file filtered as the user's `git add` would, by its own name
        chunk = asked[i:i + 200]  # (their core.autocrlf, core.eol and filters: not the tool's byte-exact config)
        out = g.as_user("hash-object", "--", *(q for q, _ in chunk)).stdout.split()
        hidden += [q for (q, b), got in zip(chunk, out) if got != b]
    return Uncommitted(ws, g.status_paths(), [(q, marks[q]) for q in sorted(hidden)])


def _mode_of(f: Path) -> str:
    if f.is_symlink():
        return "120000"
    if not f.is_file():
        return "040000"
    return "100755" if f.stat().st_mode & 0o100 else "100644"


def keep_unknown_commits(old_ws: Path, recorded: UpstreamRecord, new: Path) -> list[dict[str, str]]:
    """Fetch the commits of ``old_ws`` that apply did not make into the tree ``new`` that replaces it.

    A commit of the user's (an exported fixup whose patch file was then discarded, an amend, a
    branch, a stash) would become unreachable. Each such tip is kept as
    refs/carry/saved/<UTC time>[-N] in ``new``, and refs saved by earlier rebuilds move along.
    Returns {"ref", "from", "commits"} per tip kept.
    """
    old = Git(old_ws)
    made = sorted(c for c in {recorded.base_commit, *recorded.made} if c)
    present = old("cat-file", "--batch-check", input="".join(f"{c}\n" for c in made)).stdout.splitlines()
    known = [line.split()[0] for line in present if line.split()[1:2] == ["commit"]]
    refs = old("for-each-ref", "--format=%(refname)").stdout.split()
    g = Git(new)
    if any(r.startswith(SAVED_PREFIX) for r in refs):
        g("fetch", "-q", "--no-tags", str(old.path), f"+{SAVED_PREFIX}*:{SAVED_PREFIX}*")
    taken = dict(line.split()[::-1] for line in
                 g("for-each-ref", "--format=%(objectname) %(refname)", SAVED_PREFIX).stdout.splitlines())
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    kept: list[dict[str, str]] = []
    seen: set[str] = set()
    rebuilt: set[str] | None = None  # the new tree's patch ids, read once if a tip needs them
    for ref in ["HEAD", *(r for r in refs if not r.startswith(SAVED_PREFIX) and r != f"refs/tags/{BASE_TAG}")]:
        tip = old.rev_parse(ref)
        if not tip or tip in seen:
            continue
        seen.add(tip)
        mine = old("rev-list", tip, "--not", *known).stdout.split()
        if not mine:
            continue
        # A commit whose change the new tree holds (an exported amend, re-applied from its
        # file) is not lost: only the others are kept.
        if rebuilt is None:
            rebuilt = set(_patch_ids(g, f"refs/tags/{BASE_TAG}..HEAD").values())  # on its own base
        ids = _patch_ids(old, "--no-walk=unsorted", *mine)
        count = sum(1 for c in mine if ids.get(c) not in rebuilt)
        if not count:
            continue
        if tip in taken.values():
            continue  # kept already (by the interrupted run itself, or a recovery run again)
        n, saved = 1, SAVED_PREFIX + stamp
        while saved in taken:
            n += 1
            saved = f"{SAVED_PREFIX}{stamp}-{n}"
        taken[saved] = tip
        g("fetch", "-q", "--no-tags", str(old.path), f"+{tip}:{saved}")
        kept.append({"ref": saved, "from": ref, "commits": str(count)})
    return kept


def save_tip(repo: Path, tip: str) -> str:
    """Point a new refs/carry/saved/<UTC time>[-N] of ``repo`` at ``tip`` (a commit it has); returns the ref."""
    g = Git(repo)
    taken = set(g("for-each-ref", "--format=%(refname)", SAVED_PREFIX).stdout.split())
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    n, saved = 1, SAVED_PREFIX + stamp
    while saved in taken:
        n += 1
        saved = f"{SAVED_PREFIX}{stamp}-{n}"
    g("update-ref", saved, tip)
    return saved


def refuse_uncommitted(name: str, ws: Path, why: str) -> None:
    """Raise when ``ws`` has uncommitted or untracked edits; ``why`` says what would replace it."""
    dirty = uncommitted(ws)
    if not dirty:
        return
    raise DirtyTreeError(
        f"{name}: workspace {ws} has uncommitted changes ({dirty.shown()}), and {why}; nothing was moved",
        hint=f"{dirty.reveal()}{code('git', '-C', ws, 'stash', 'push', '-u', '-m', 'kept from carry')} keeps them as a commit (which "
             f"the next run keeps as {SAVED_PREFIX}<time>; {code('git', '-C', ws, 'stash', 'list')} or that ref "
             "gives them back), then run the command again")


def refuse_unknown_commits(name: str, ws: Path, recorded: UpstreamRecord, why: str) -> None:
    """Raise when ``ws`` (about to be removed, with no tree to keep them in) has commits apply did not make."""
    g = Git(ws)
    known = [c for c in {recorded.base_commit, *recorded.made} if c and g.has_commit(c)]
    if g("rev-list", "-1", "--all", "--not", *known).stdout.strip():
        raise DirtyTreeError(f"{name}: workspace {ws} has commits apply did not make, and {why}; nothing was moved",
                             hint=_keep_all_hint(ws))


def refuse_foreign(name: str, ws: Path, why: str) -> None:
    """Raise: ``ws`` is not a workspace apply made, and ``why`` says what would replace it."""
    raise DirtyTreeError(f"{name}: {ws} was not made by tools/apply.py, and {why}; nothing was moved",
                         hint=_keep_all_hint(ws))


def _keep_all_hint(ws: Path) -> str:
    """Set every workspace of the work directory, and the trees the interrupted swap left, aside
    whole (moved with their linked worktrees kept working), then rebuild: what works while a swap
    is pending (--set-aside NAME first finishes the swap, which is what refused)."""
    return (f"set every workspace aside whole ({code(*tool('kept'), '--workdir', ws.parent, '--set-aside')}: they go "
            "to the work directory's .carry/kept, with the interrupted swap's trees, where tools/kept.py restores or "
            "deletes them; the record goes too), then run the command again")


def _patch_ids(g: Git, *revs: str) -> dict[str, str]:
    """git's stable patch id of each commit ``revs`` name, by commit, from one ``git log -p`` (a
    commit that changes nothing has none)."""
    log = g("log", "-p", "--no-color", "--no-ext-diff", "--format=commit %H", *revs).stdout
    pairs = (line.split() for line in g("patch-id", "--stable", input=log).stdout.splitlines())
    return {commit: pid for pid, commit in pairs}


def check_untouched(root: Path, name: str, recorded: UpstreamRecord | None, series: Series) -> bool:
    """True when DIR/name is ours and unchanged; False when absent; raises otherwise."""
    ws = root / name
    export_cmd = f"`{command('export', series, '--workdir', root)}`"
    if not ws.exists():
        return False
    g = Git(ws)
    if recorded is None or not (ws / ".git").exists():
        # a repository (a workspace whose record is gone, one of yours): kept.py sets it aside whole, its
        # worktrees kept working; anything else is moved by hand
        mine = (ws / ".git").exists() and not ws.is_symlink()
        raise DirtyTreeError(f"{ws} exists but was not made by tools/apply.py",
                             hint=set_aside_hint(root, name, series) if mine else "move it away or choose another --workdir")
    head = g.head()
    record = root / ".carry" / "state.json"
    if head != recorded.head and not g.has_commit(recorded.head):
        # A `git reset --hard` to the recorded head cannot work: the record is not this tree's.
        raise DirtyTreeError(
            f"{name}: the record {record} names HEAD {recorded.head[:12]}, which workspace {ws} "
            f"does not have (its HEAD is {str(head)[:12]})",
            hint=set_aside_hint(root, name, series))
    back = moved_back(name, ws, recorded)
    if back:
        raise back
    if head != recorded.head:
        raise DirtyTreeError(
            f"{name}: workspace {ws} has commits the series does not know "
            f"(HEAD {str(head)[:12]}, applied {recorded.head[:12]})",
            hint=f"{export_cmd} writes amended patch commits to the patch files (a new commit needs a "
                 f"[[patches]] entry first); or {set_aside_hint(root, name, series)}")
    dirty = uncommitted(ws)
    if dirty:
        raise DirtyTreeError(
            f"{name}: workspace {ws} has uncommitted changes: {dirty.shown()}",
            hint=f"{dirty.reveal()}commit them into the patch they belong to ({amend_command(ws)} "
                 f"for the last one) and run {export_cmd}, or, to drop them, {set_aside_hint(root, name, series)}")
    return True


def amend_command(ws: Path) -> str:
    """The command that folds every change in ``ws`` into its last commit: new files too (``git
    commit -a`` leaves an untracked file out, and the check that refused would refuse again)."""
    return code("git", "-C", ws, "add", "-A", Raw("&&"), "git", "-C", ws, "commit", "-q", "--amend", "--no-edit")


def set_aside_hint(root: Path, name: str, series: Series) -> str:
    """Set DIR/name aside whole into DIR/.carry/kept, then rebuild it: how a person drops a
    workspace's changes with nothing lost (tools/kept.py --restore gives them back)."""
    return (f"set the workspace aside whole ({code(*tool('kept'), '--workdir', root, '--set-aside', name)}: it goes to "
            "the work directory's .carry/kept, where tools/kept.py restores or deletes it) and rebuild it: "
            f"`{command('apply', series, '--workdir', root)}`")


def moved_back(name: str, ws: Path, recorded: UpstreamRecord) -> DirtyTreeError | None:
    """The error for a workspace whose HEAD is an older commit of its own series (`git checkout
    HEAD~1`, or a branch reset back): nothing is lost, the series' tip is still there; None otherwise."""
    g = Git(ws)
    head = g.head()
    if not head or head == recorded.head or not g("merge-base", "--is-ancestor", head, recorded.head, check=False).ok:
        return None
    at = {p.commit: f"patch {p.id}" for p in recorded.patches}
    at[recorded.base_commit] = "the base"
    behind = len(g.rev_list(f"{head}..{recorded.head}"))
    branches = g("for-each-ref", "--format=%(refname:short)", "--points-at", recorded.head, "refs/heads/").stdout.split()
    detached = not g("symbolic-ref", "-q", "HEAD", check=False).ok
    back = (code("git", "-C", ws, "checkout", "-q", branches[0]) if detached and branches else
            code("git", "-C", ws, "merge", "-q", "--ff-only", recorded.head))  # a branch moved back goes forward
    return DirtyTreeError(
        f"{name}: workspace {ws} is at an older commit of its own series: HEAD {head[:12]} "
        f"({at.get(head, 'a commit')}) is {behind} commit(s) behind the tip apply made, {recorded.head[:12]} "
        "(an older commit was checked out, or the branch moved back); nothing is lost",
        hint=f"{back} goes back to the tip (git refuses if that would overwrite an edit); then {run_again()}")
