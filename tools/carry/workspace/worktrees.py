"""Moving a repository or a linked worktree with the links between them kept.

git ties a linked worktree (``git worktree add``) to its repository both ways: the repository's
``.git/worktrees/<id>/gitdir`` names the worktree's ``.git`` file, and that file names the
``<id>`` folder back, each by its full path. A rename of either side, or of a folder holding
both (a worktree inside a workspace), breaks them: ``git status`` fails in the worktree, and the
repository calls it "prunable", where the ``git worktree prune`` git suggests drops the
worktree's index and HEAD, and with it the only ref to a commit made on a detached HEAD.
``move`` renames, then has git reconnect every linked worktree of each repository the moved
tree holds a worktree of (its own, one inside it, another repository's linked worktree placed in
it), at the place each is now, in both directions (``git worktree repair <path>...``).

Before the rename it writes what it will repair to a log (the work directory's
``.carry/moving.json``); a run killed between the rename and the repair leaves the log, and the next
command that takes the work directory's lock repairs from it (``resume``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from .. import progress
from ..files import write_json
from ..git import Git
from ..shell import code


def log_of(workdir: Path) -> Path:
    """Where the moves within work directory ``workdir`` write what they will repair."""
    return workdir / ".carry" / "moving.json"


def move(src: Path, dest: Path, log: Path) -> None:
    """``os.rename(src, dest)``; then every linked worktree of every repository with a worktree
    under ``src`` (``src`` itself, a repository inside it, a linked worktree of any repository
    inside it) is reconnected where it is now, each by its own repository (a symlink moves as a
    link: what it points at stays where it is, and so do the links). ``log``: where the repair is
    written down until it is done (see ``resume``)."""
    found = {} if src.is_symlink() else repositories_in(src)
    here = os.path.realpath(src)
    there = os.path.join(os.path.realpath(dest.parent), dest.name)
    if found:
        write_json(log, {"from": here, "to": there, "repositories": found})
    os.rename(src, dest)
    progress.checkpoint("moved")
    _reconnect(found, here, there, dest)
    log.unlink(missing_ok=True)


def resume(log: Path) -> None:
    """The repair of a move killed after its rename, from its ``log``; nothing where the rename
    never happened. The log goes either way (an unreadable one, said so: it repairs nothing)."""
    try:
        doc = json.loads(log.read_text())
        if not isinstance(doc, dict):
            raise ValueError(f"a JSON {type(doc).__name__}, not an object")
    except FileNotFoundError:
        return
    except (OSError, ValueError) as exc:
        print(f"[carry] {log} is unreadable ({exc}); {code('git', 'worktree', 'repair')} in a moved linked worktree "
              "reconnects it by hand", file=sys.stderr, flush=True)
        log.unlink(missing_ok=True)
        return
    here, there = doc.get("from"), doc.get("to")
    found = doc.get("repositories")
    if isinstance(here, str) and isinstance(there, str) and isinstance(found, dict) \
            and all(isinstance(ts, list) for ts in found.values()) \
            and os.path.lexists(there) and not os.path.lexists(here):
        _reconnect({str(c): [str(t) for t in ts] for c, ts in found.items()}, here, there, Path(there))
    log.unlink(missing_ok=True)


def _reconnect(found: dict[str, list[str]], here: str, there: str, dest: Path) -> None:
    for common, trees in found.items():
        common = _after(common, here, there)
        now = [p for p in (_after(t, here, there) for t in trees) if os.path.lexists(os.path.join(p, ".git"))]
        if not now:
            continue
        # git -C the common folder: the repository's, bare or not, wherever its main worktree is.
        res = Git(Path(common))("worktree", "repair", *now, check=False)
        if not res.ok:
            print(f"[carry] {dest}: git could not reconnect every linked worktree of the repository {common} "
                  f"({' '.join(res.stderr.split())}); {code('git', '-C', common, 'worktree', 'list')} shows which",
                  file=sys.stderr, flush=True)


def repositories_in(tree: Path) -> dict[str, list[str]]:
    """Each repository with linked worktrees that has a worktree (main or linked) at or under
    ``tree``: its common git folder, with the paths of all its linked worktrees (real paths)."""
    found: dict[str, list[str]] = {}
    for top, dirs, files in os.walk(tree):
        if ".git" in dirs or ".git" in files:
            dirs[:] = [d for d in dirs if d != ".git"]  # a repository's own folder holds no worktree
            repo = _repository_of(Path(top))
            if repo is not None:
                found.setdefault(*repo)
    return found


def cut_off(tree: Path) -> list[tuple[str, str]]:
    """(worktree, common git folder) for each linked worktree that still works and that deleting
    ``tree`` cuts off: one outside ``tree`` of a repository inside it (its commits, HEAD and index
    go with the repository), and one inside ``tree`` of a repository elsewhere (its HEAD and index
    go with the folder). Its ``.git`` file still names that repository's record of it."""
    here = os.path.realpath(tree)
    live = []
    for common, trees in repositories_in(tree).items():
        for t in trees:
            if _within(t, here) == _within(common, here):
                continue  # both go, or neither: nothing is left cut off
            admin = _pointer(Path(t) / ".git", "gitdir:")
            if admin is not None and _within(os.path.realpath(admin), common):
                live.append((t, common))
    return live


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top + os.sep)


def _after(path: str, here: str, there: str) -> str:
    """Where ``path`` is once ``here`` was renamed to ``there``."""
    return there + path[len(here):] if _within(path, here) else path


def _repository_of(tree: Path) -> tuple[str, list[str]] | None:
    """The common git folder of the repository whose worktree ``tree`` is (main or linked), with
    the paths of that repository's linked worktrees; None when ``tree`` is no worktree of a
    repository with linked ones."""
    dotgit = tree / ".git"
    if dotgit.is_dir():
        common = os.path.realpath(dotgit)
    elif dotgit.is_file():
        admin = _pointer(dotgit, "gitdir:")
        if admin is None or not os.path.isdir(admin):
            return None
        shared = _pointer(Path(admin) / "commondir", "")
        common = os.path.realpath(shared if shared else admin)
    else:
        return None
    trees = []
    admins = Path(common) / "worktrees"
    for entry in sorted(admins.iterdir()) if admins.is_dir() else []:
        gitfile = _pointer(entry / "gitdir", "")
        if gitfile is not None:
            trees.append(os.path.realpath(os.path.dirname(gitfile)))
    return (common, trees) if trees else None


def _pointer(path: Path, prefix: str) -> str | None:
    """The full path file ``path`` holds after ``prefix`` (one line; a relative one is relative to
    the file's folder), or None when it cannot be read."""
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not text.startswith(prefix) or not text[len(prefix):].strip():
        return None
    return os.path.normpath(os.path.join(os.path.realpath(path.parent), text[len(prefix):].strip()))
