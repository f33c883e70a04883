"""Old workspaces kept whole: what a rebuild replaces is moved aside, never deleted.

A workspace is the user's git repository as much as ours: commits in any ref, reflog or
stash entry, linked worktrees, hooks, remotes, files ``.git/info/exclude`` ignores, edits to
skip-worktree files. Listing each form to rescue it lost the next one. So nothing is
listed: the replaced tree (its ``.git`` and every file) is renamed, in one step on the same
file system, to ``DIR/.carry/kept/<upstream>-<UTC time>[-N]``, and one line says so with the
commands that restore it or delete it. Only ``tools/kept.py`` deletes such a copy, when asked.
"""

from __future__ import annotations

import calendar
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import DirtyTreeError, UsageError
from ..files import fsync_dir
from ..shell import code, shown, tool
from . import worktrees

KEPT_DIR = "kept"
_STAMP = "%Y%m%dT%H%M%SZ"
# Any name set_aside may be given (a folder of the work directory: a space, a leading dash), so
# that every copy it says it kept is listed, restored and deleted by that name.
_ENTRY = re.compile(r"(?P<name>.+?)-(?P<stamp>\d{8}T\d{6}Z)(?:-\d+)?", re.DOTALL)


@dataclass(frozen=True)
class Kept:
    path: Path
    upstream: str
    made: float  # seconds since the epoch, from the name

    @property
    def key(self) -> str:
        return self.path.name


def kept_dir(root: Path) -> Path:
    return root / ".carry" / KEPT_DIR


def set_aside(root: Path, tree: Path, name: str, why: str = "replaced") -> Path:
    """Rename ``tree`` (DIR/<name>, or the swap's trash copy of it) to DIR/.carry/kept/<name>-<time>.

    Its linked worktrees, and the repository of a linked worktree, are reconnected at their places
    now (carry.workspace.worktrees), so they keep working. Says where it went in one line, with
    the commands that restore or delete it.
    """
    home = kept_dir(root)
    home.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime(_STAMP, time.gmtime())
    dest, n = home / f"{name}-{stamp}", 1
    while dest.exists() or dest.is_symlink():
        n += 1
        dest = home / f"{name}-{stamp}-{n}"
    worktrees.move(tree, dest, worktrees.log_of(root))
    fsync_dir(home)
    print(f"[carry] {shown(name)}: the {why} workspace is kept whole in {shown(dest)}: "
          f"{code(*tool('kept'), '--workdir', root, '--restore', dest.name)} puts it back, "
          f"{code(*tool('kept'), '--workdir', root, '--delete', dest.name)} deletes it",
          file=sys.stderr, flush=True)
    return dest


def entries(root: Path) -> list[Kept]:
    """The kept workspaces of work directory ``root``, oldest first."""
    home = kept_dir(root)
    if not home.is_dir():
        return []
    out = []
    for p in home.iterdir():
        m = _ENTRY.fullmatch(p.name)
        if m and (p.is_dir() or p.is_symlink()):  # a workspace that was a link is kept as the link
            made = calendar.timegm(time.strptime(m["stamp"], _STAMP))  # the stamp is UTC
            out.append(Kept(p, m["name"], made))
    return sorted(out, key=lambda k: (k.made, k.key))


def find(root: Path, key: str) -> Kept:
    for k in entries(root):
        if k.key == key:
            return k
    known = ", ".join(k.key for k in entries(root)) or "none"
    raise UsageError(f"{kept_dir(root)} holds no kept workspace {key!r} (kept: {known})",
                     hint=f"{code(*tool('kept'), '--workdir', root)} lists them")


def restore(root: Path, key: str) -> Path:
    """Put kept workspace ``key`` back as DIR/<upstream>; the tree there now is kept aside first."""
    k = find(root, key)
    ws = root / k.upstream
    if ws.exists() or ws.is_symlink():
        set_aside(root, ws, k.upstream, why="current")
    worktrees.move(k.path, ws, worktrees.log_of(root))
    fsync_dir(root)
    return ws


def delete(root: Path, key: str) -> Kept:
    """Delete kept copy ``key``; refused (nothing deleted) while it is the repository of a linked
    worktree outside it, which the move kept working and which dies with it, or holds a linked
    worktree of a repository elsewhere (its HEAD and index die with the folder)."""
    k = find(root, key)
    if k.path.is_symlink():
        k.path.unlink()  # the link kept; the tree it points at was never the tool's to keep
        return k
    live = worktrees.cut_off(k.path)
    if live:
        wt, repo = live[0]
        raise DirtyTreeError(
            f"{k.path} is the repository of, or holds, linked worktree(s) {', '.join(t for t, _ in live)}, which "
            "work and hold a HEAD and an index of their own (and commits, where it is their repository): deleting it "
            "deletes them; nothing was deleted",
            hint=f"keep them: {code(*tool('kept'), '--workdir', root, '--restore', key)} puts the copy back "
                 f"(the workspace there now is kept first); or, to drop a worktree (git refuses while it has "
                 f"uncommitted changes; its branch goes with the copy), {code('git', '-C', repo, 'worktree', 'remove', wt)}"
                 f"{' and the like for each' if len(live) > 1 else ''}, then "
                 f"{code(*tool('kept'), '--workdir', root, '--delete', key)} again")
    shutil.rmtree(k.path)
    return k


def size(path: Path) -> int:
    """Bytes on disk under ``path`` (as ``du`` counts them: blocks, a hard-linked file once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for top, dirs, files in os.walk(path):
        for f in [*dirs, *files]:
            st = os.lstat(os.path.join(top, f))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def parse_age(text: str) -> float:
    """``30d``, ``12h``, ``45m``, ``90s`` (or plain seconds) as seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if not m:
        raise UsageError(f"--older-than {text!r} is not an age", hint="write it as 30d, 12h, 45m or 90s")
    return float(m[1]) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m[2]]
