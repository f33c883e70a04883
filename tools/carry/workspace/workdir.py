"""Work directories: one git workspace per upstream, the record of what was applied, a journal.

``DIR/<upstream>`` is the patched tree in the upstream's git layout: the
pinned base commit, then one commit per patch. ``DIR/.carry/state.json`` is
the workspace record (``State``, carry.workspace.record). This module owns the file:
it loads, saves and journals it, and swaps the trees it describes.

New trees are built under ``DIR/.carry/staging-*`` and swapped in only when
every upstream succeeded; the swap is journalled, so a run killed half-way
through it is rolled forward by the next run. Until then the previous
workspaces stay exactly as they were.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import sys
import tempfile
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Iterator

from .. import progress
from ..errors import CarryError, DirtyTreeError, NoSpaceError, OperationError, UsageError, no_space
from ..files import fsync_dir, read_input_text, write_json
from ..git import Git
from ..lock import LOCK_TIMEOUT, DirLock, patience
from ..report import kept_back
from ..series.manifest import Series
from ..series.repo import command
from ..shell import again, code, run_again, run_as, tool
from . import kept as keeping
from . import userwork, worktrees
from .record import STATE_VERSION, PatchRecord, State, UpstreamRecord  # noqa: F401  (imported from here)

SAVED_PREFIX = userwork.SAVED_PREFIX
_STAGING_NAME = re.compile(r"staging-[A-Za-z0-9_]+")
_SIMPLE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def _tell_kept(wd: "WorkDir", kept: dict[str, list[dict[str, str]]], what: str) -> None:
    """Say (always: this is no progress line) where the user's commits went."""
    for name, refs in kept.items():
        for k in refs:
            ws = wd.workspace(name)
            print(f"[carry] {name}: {what} the swap an interrupted run left; kept {k['commits']} commit(s) apply "
                  f"did not make (the old {k['from']}) as {k['ref']}: {kept_back(ws, k)}", file=sys.stderr, flush=True)


class SwapError(OperationError):
    """The new trees could not be renamed into place; the previous ones were put back."""


def _mount_points() -> set[str]:
    """Where something is mounted (Linux); a bind mount from the same file system has the same st_dev."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return set()
    # field 5 is the mount point, with space, tab, newline and backslash written as octal escapes
    unescape = re.compile(r"\\([0-7]{3})")
    return {unescape.sub(lambda m: chr(int(m[1], 8)), f[4]) for f in (line.split() for line in lines) if len(f) > 4}


def _what(exc: OSError) -> str:
    return ": ".join(str(x) for x in (exc.strerror or exc, exc.filename) if x is not None)


def _swap_error(exc: OSError, message: str, root: Path, kind: type) -> CarryError:
    """``kind`` with the swap's message, or, for a full disk, the full-disk error (exit 2) naming where."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        full = no_space(exc.filename or root)
        return NoSpaceError(f"{message.replace(f' ({_what(exc)})', '')}: {full.message}", hint=full.hint)
    return kind(message, hint=_swap_hint(exc, root))


def _swap_hint(exc: OSError, root: Path) -> str:
    if exc.errno in (errno.EPERM, errno.EACCES, errno.EROFS):
        return f"make {root} writable ({code('lsattr', '-d', root)} shows an immutable flag), then " + run_again()
    if exc.errno in (errno.EBUSY, errno.EXDEV):
        return f"a workspace in {root} is a mount point or on another file system: unmount it, or choose another --workdir"
    return "fix the cause above, then " + run_again()


class WorkDir:
    def __init__(self, root: Path):
        self.root = root.resolve() if root.exists() else root.absolute()
        self.meta = self.root / ".carry"

    @property
    def state_file(self) -> Path:
        return self.meta / "state.json"

    @property
    def journal_file(self) -> Path:
        return self.meta / "journal.json"

    def workspace(self, name: str) -> Path:
        return self.root / name

    def exists(self) -> bool:
        """A record, or the journal of a first apply interrupted in its swap (the next run finishes it)."""
        return self.state_file.exists() or self.journal_file.exists()

    @contextmanager
    def lock(self, timeout: float = LOCK_TIMEOUT) -> Iterator[None]:
        """Hold DIR's lock; a DIR made only to hold the lock is removed again afterwards."""
        made = not self.root.exists()
        try:
            # The cache's locks taken meanwhile (bases, downloads) wait no longer than this one.
            with DirLock(self.meta / "lock", timeout, what=self.root), patience(timeout):
                worktrees.resume(worktrees.log_of(self.root))  # a move a killed run left half done
                progress.checkpoint("locked")
                yield
        finally:
            if made:
                with suppress(OSError):
                    self.root.rmdir()  # only when the run left nothing in it

    # -- the record ------------------------------------------------------------------------
    def load_state(self) -> State:
        try:
            text = read_input_text(self.state_file)
        except FileNotFoundError:
            return State()
        try:
            return State.from_dict(json.loads(text))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DirtyTreeError(f"{self.state_file} is not a workspace record this tool can read ({exc!r})",
                                 hint=self._all_aside_hint()) from None

    def _all_aside_hint(self) -> str:
        return (f"{code(*tool('kept'), '--workdir', self.root, '--set-aside')} keeps every workspace whole in the "
                "work directory's .carry/kept (the old trees too; tools/kept.py restores them) and drops the record, "
                f"then {run_as('apply') or 'apply the series again'} builds them anew")

    def set_aside(self, names: list[str]) -> None:
        """Move workspaces whole into DIR/.carry/kept (carry.workspace.kept), for a person who wants
        them rebuilt. ``names``: those, once a swap an interrupted run left is finished or undone.
        None named: every workspace as it is, and the trees a swap left in .carry (replaced ones
        kept, staged ones removed: apply built them and builds them again); the record and the
        journal then describe nothing there and go too. Under the lock."""
        if names:
            self.recover()
            bad = [n for n in names if not _SIMPLE_NAME.fullmatch(n) or not (self.workspace(n) / ".git").exists()]
            if bad:
                raise UsageError(f"{self.root} has no workspace {', '.join(map(repr, bad))} (it has: "
                                 f"{', '.join(p.name for p in self._workspaces()) or 'none'})")
        for ws in [self.workspace(n) for n in names] or self._workspaces() + self._in_the_way():
            keeping.set_aside(self.root, ws, ws.name, why="current")
        if not names and self.meta.is_dir():
            for trash in self.meta.glob("trash-*"):
                self._keep_trash(trash)
            for staging in self.meta.glob("staging-*"):
                shutil.rmtree(staging, ignore_errors=True)
            self.journal_file.unlink(missing_ok=True)
            self.state_file.unlink(missing_ok=True)

    def _workspaces(self) -> list[Path]:
        found = self.root.iterdir() if self.root.is_dir() else []
        return sorted(p for p in found if not p.name.startswith(".") and (p / ".git").exists())

    def _in_the_way(self) -> list[Path]:
        """What is not a repository at a place the record or an interrupted swap's journal has a workspace
        of (a folder of the user's, a link, a file): the next apply would refuse it as not its own."""
        names: set[str] = set()
        for read in (lambda: self.load_state().upstreams, lambda: self._read_journal()[1]):
            with suppress(CarryError, OSError):  # an unreadable one tells nothing: set aside with the rest
                names.update(read())
        return [p for p in map(self.workspace, sorted(n for n in names if _SIMPLE_NAME.fullmatch(n)))
                if (p.exists() or p.is_symlink()) and not (p / ".git").exists()]

    def save_state(self, state: State) -> None:
        write_json(self.state_file, state.to_dict())

    # -- staging and the swap ---------------------------------------------------------------
    def new_staging(self) -> Path:
        self.meta.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(dir=self.meta, prefix="staging-"))

    def recover(self) -> list[str]:
        """Finish or undo a swap a killed run started; remove what killed runs left. Under the lock.

        The swap is rolled forward when every new tree is still staged or already in place;
        otherwise (its staging was lost) it is undone: the previous trees go back. Either
        way the work directory ends in the old state or the new one, never between. Before
        either, the trees it replaces are checked for work the user did since (as a rebuild
        does): commits apply did not make are kept in the tree that stays, as refs/carry/saved/*;
        uncommitted or untracked edits stop it, with nothing moved. Returns the names finished.
        """
        done: list[str] = []
        if self.journal_file.exists():
            staging, names, state = self._read_journal()
            before = self.load_state()
            trash = self.meta / f"trash-{staging.name}"
            if all((staging / n).is_dir() or self._moved_in(n, staging, trash, state, before) for n in names):
                kept = self._guard_forward(staging, names, before)
                self._finish(staging, names, state)
                done = names
            else:
                kept = self._guard_undo(names, state, before, trash)
                self._undo(staging, names, state)
            _tell_kept(self, kept, "finished" if done else "undid")
        if self.meta.exists():
            for stale in self.meta.glob("trash-*"):
                self._keep_trash(stale)  # trees a swap replaced: the user's, kept
            for stale in self.meta.glob("staging-*"):
                shutil.rmtree(stale, ignore_errors=True)  # built by a killed run, never moved in
        return done

    def _moved_in(self, name: str, staging: Path, trash: Path, state: State, before: State) -> bool:
        """DIR/name is the new tree, moved in by the interrupted swap (the user may have committed
        in it since: its HEAD need not be the journal's, but it holds that commit)."""
        rec, ws = state.record(name), self.workspace(name)
        if rec is None or (staging / name).is_dir() or not (ws / ".git").exists() or ws.is_symlink():
            return False
        g = Git(ws)
        if g.head() == rec.head:
            return True
        old = before.record(name)
        return g.has_commit(rec.head) and ((trash / name).exists() or old is None or not g.has_commit(old.head))

    def _guard_forward(self, staging: Path, names: list[str], before: State) -> dict[str, list[dict[str, str]]]:
        """Before a swap is finished: each tree still in place (the old one) is replaced by its
        staged successor; the user's commits there go into the staged tree."""
        why = f"finishing the swap an interrupted run left in {self.journal_file} replaces it with the new tree"
        kept: dict[str, list[dict[str, str]]] = {}
        plan = []
        for name in names:
            ws, new = self.workspace(name), staging / name
            if not new.is_dir() or not (ws.exists() or ws.is_symlink()):
                continue  # moved in already, or nothing there to replace
            old = before.record(name)
            if old is None or ws.is_symlink() or not (ws / ".git").exists():
                userwork.refuse_foreign(name, ws, why)
            userwork.refuse_uncommitted(name, ws, why)
            plan.append((name, ws, old, new))
        for name, ws, old, new in plan:  # every tree checked before any commit is copied
            kept[name] = userwork.keep_unknown_commits(ws, old, new)
        return kept

    def _guard_undo(self, names: list[str], state: State, before: State,
                    trash: Path) -> dict[str, list[dict[str, str]]]:
        """Before a swap is undone: each new tree moved in already is replaced by the old one it
        replaced (from the trash) or removed; the user's commits there go into the old tree."""
        why = f"undoing the swap an interrupted run left in {self.journal_file} puts the previous tree back"
        kept: dict[str, list[dict[str, str]]] = {}
        plan = []
        for name in names:
            ws, old_tree, rec = self.workspace(name), trash / name, state.upstreams[name]
            if not (ws / ".git").exists() or ws.is_symlink():
                continue
            if old_tree.exists() or old_tree.is_symlink():
                userwork.refuse_uncommitted(name, ws, why)
                if (old_tree / ".git").exists() and not old_tree.is_symlink():
                    plan.append((name, ws, rec, old_tree))
            elif self._holds(name, state):
                prior = before.record(name)
                if prior is None or prior.head != rec.head:  # removed: nothing to keep its commits in
                    userwork.refuse_uncommitted(name, ws, why)
                    userwork.refuse_unknown_commits(name, ws, rec, why)
        for name, ws, rec, old_tree in plan:
            kept[name] = userwork.keep_unknown_commits(ws, rec, old_tree)
        return kept

    def _read_journal(self) -> tuple[Path, list[str], State]:
        try:
            journal = json.loads(read_input_text(self.journal_file))
            recorded, names = journal["staging"], list(journal["names"])
            state = State.from_dict(journal["state"])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DirtyTreeError(
                f"{self.journal_file} is unreadable ({exc!r}): a swap of workspaces may be half done",
                hint=self._all_aside_hint()) from None
        # Only a staging folder of this work directory is ever moved in. A journal copied with
        # its work directory (`cp -a`) names the original's folder by an absolute path: its
        # name is the copy's own folder. Anything else was not written by a swap of ours.
        name = Path(str(recorded)).name
        bad = [n for n in names if not isinstance(n, str) or not _SIMPLE_NAME.fullmatch(n)]
        if not _STAGING_NAME.fullmatch(name) or bad:
            what = f"names {', '.join(map(repr, bad))}" if bad else f"names the folder {recorded}"
            raise DirtyTreeError(
                f"{self.journal_file} {what}, which is not a staging folder of {self.meta}: not trusted, "
                "nothing was moved",
                hint=f"{code('rm', self.journal_file)}, then {again({}) or 'run the command again'}")
        return self.meta / name, names, state

    def _holds(self, name: str, state: State) -> bool:
        """DIR/name is the tree the journal's record says it will be (moved in already)."""
        rec = state.record(name)
        ws = self.workspace(name)
        return rec is not None and (ws / ".git").exists() and Git(ws).head() == rec.head

    def check_swappable(self, names: list[str]) -> None:
        """The swap renames DIR/name; a workspace on another mount than DIR/.carry cannot be renamed."""
        for name in names:
            ws = self.workspace(name)
            if not ws.exists() or ws.is_symlink():
                continue
            if os.path.ismount(ws) or ws.stat().st_dev != self.root.stat().st_dev or str(ws) in _mount_points():
                raise UsageError(
                    f"{name}: workspace {ws} is a mount point; apply replaces a workspace by renaming a new "
                    "tree into its place, which a mount point does not allow",
                    hint=f"unmount it ({code('umount', ws)}) and mount the work directory itself, or choose "
                         "another --workdir")

    def commit(self, staging: Path, names: list[str], state: State) -> None:
        """Swap the staged trees in. From here on the staging folder is the journal's: only a
        finished swap or an undone one removes it (a run interrupted here is finished by the next)."""
        try:
            write_json(self.journal_file, {"staging": staging.name, "names": names, "state": state.to_dict()})
        except BaseException:
            self.journal_file.unlink(missing_ok=True)
            shutil.rmtree(staging, ignore_errors=True)
            raise
        progress.checkpoint("journalled")
        self._finish(staging, names, state)

    def _finish(self, staging: Path, names: list[str], state: State) -> None:
        try:
            self._swap(staging, names, state)
        except OSError as exc:
            # The same error would stop every later run: undo, so that the next run starts clean.
            try:
                self._undo(staging, names, state)
            except OSError as again:
                err = _swap_error(exc, f"could not swap the new workspaces into {self.root} ({_what(exc)}), nor put "
                                       f"the previous ones back ({_what(again)}); the journal {self.journal_file} "
                                       "is kept", self.root, DirtyTreeError)
                err.hint = f"{err.hint}; the next run finishes or undoes the swap"
                raise err from None
            raise _swap_error(exc, f"could not swap the new workspaces into {self.root} ({_what(exc)}); nothing "
                                   "was changed", self.root, SwapError) from None

    def _swap(self, staging: Path, names: list[str], state: State) -> None:
        trash = self.meta / f"trash-{staging.name}"
        trash.mkdir(parents=True, exist_ok=True)
        for name in names:
            new = staging / name
            if not new.exists():
                continue  # already moved in by the interrupted run
            ws = self.workspace(name)
            if (ws.exists() or ws.is_symlink()) and not (trash / name).exists():
                worktrees.move(ws, trash / name, worktrees.log_of(self.root))
            worktrees.move(new, ws, worktrees.log_of(self.root))
            progress.checkpoint("swapping")
        self.save_state(state)
        self.journal_file.unlink(missing_ok=True)
        fsync_dir(self.meta)
        self._keep_trash(trash)
        shutil.rmtree(staging, ignore_errors=True)

    def _keep_trash(self, trash: Path) -> None:
        """The replaced trees in ``trash`` go to DIR/.carry/kept whole (carry.workspace.kept); the
        trash folder goes only once it is empty."""
        if trash.is_dir():
            for old in sorted(trash.iterdir()):
                keeping.set_aside(self.root, old, old.name)
            trash.rmdir()

    def _undo(self, staging: Path, names: list[str], state: State) -> None:
        """Put the previous trees back (the record was never replaced); drop the journal."""
        trash = self.meta / f"trash-{staging.name}"
        for name in reversed(names):
            ws, old = self.workspace(name), trash / name
            if old.exists() or old.is_symlink():
                if ws.exists() or ws.is_symlink():
                    keeping.set_aside(self.root, ws, name, why="new")  # moved in already; the user may have worked in it
                worktrees.move(old, ws, worktrees.log_of(self.root))
            elif self._holds(name, state):
                before = self.load_state().record(name)
                if before is None or before.head != state.upstreams[name].head:
                    keeping.set_aside(self.root, ws, name, why="new")  # where there was none before
        self.journal_file.unlink(missing_ok=True)
        fsync_dir(self.meta)
        self._keep_trash(trash)
        shutil.rmtree(staging, ignore_errors=True)

    # -- guarding the user's work -------------------------------------------------------------
    def check_untouched(self, name: str, recorded: UpstreamRecord | None, series: Series) -> bool:
        """True when DIR/name is ours and unchanged; False when absent; raises otherwise (carry.workspace.userwork)."""
        return userwork.check_untouched(self.root, name, recorded, series)

    def keep_unknown_commits(self, name: str, recorded: UpstreamRecord, new: Path) -> list[dict[str, str]]:
        """The commits of DIR/name that apply did not make, kept in the rebuilt tree ``new``
        (carry.workspace.userwork)."""
        return userwork.keep_unknown_commits(self.workspace(name), recorded, new)

    def require(self, series: Series) -> State:
        """The record of a work directory that must exist (export, prove, bisect)."""
        if not self.exists():
            raise UsageError(f"{self.root} holds no workspace made by tools/apply.py",
                             hint=f"`{command('apply', series, '--workdir', self.root)}` first")
        return self.load_state()

