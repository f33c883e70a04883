"""gtp-carry kept / tools/kept.py."""

from __future__ import annotations

import os
import sys
import time

from ..errors import DirtyTreeError
from ..workspace import kept
from ..workspace.workdir import WorkDir
from . import options

DESCRIPTION = """\
The old workspaces a rebuild kept. apply (and the next run after an interrupted one) never deletes
a workspace it replaces, nor rebase a rebase workspace it starts afresh (DIR: rebase's --workdir): it moves the whole tree, its .git (every commit, reflog, stash, worktree
record, hook, remote) and every file (ignored ones too), to DIR/.carry/kept/<upstream>-<UTC time>,
and says so in one line. Linked worktrees, inside the workspace or not, are reconnected where they
are and keep working.
Nothing removes a kept copy but this command:

  kept.py --workdir DIR                         list them: name, age, size
  kept.py --workdir DIR --restore NAME          put NAME back as DIR/<upstream> (the tree there now is kept first)
  kept.py --workdir DIR --delete NAME           delete NAME (refused while a linked worktree it is the repository of, or holds, still works)
  kept.py --workdir DIR --prune --older-than 30d  delete every copy older than that (s, m, h, d, w), but such a repository
  kept.py --workdir DIR --set-aside NAME        keep workspace DIR/NAME there now (the next apply rebuilds it)
  kept.py --workdir DIR --set-aside             keep every workspace, and drop the record (apply starts anew)"""


def main(argv: list[str], prog: str) -> int:
    p = options.parser(prog, DESCRIPTION)
    options.add_workdir(p)
    act = p.add_mutually_exclusive_group()
    act.add_argument("--restore", metavar="NAME", help="put kept workspace NAME back in its place")
    act.add_argument("--delete", metavar="NAME", help="delete kept workspace NAME")
    act.add_argument("--prune", action="store_true", help="delete the kept workspaces older than --older-than")
    act.add_argument("--set-aside", nargs="*", metavar="NAME",
                     help="keep these workspaces (none named: every one, and drop the record) so apply rebuilds them")
    p.add_argument("--older-than", type=kept.parse_age, metavar="AGE", help="with --prune: 30d, 12h, 45m, 90s")
    options.add_lock_timeout(p)
    a = p.parse_args(_named(argv))
    if a.prune != (a.older_than is not None):
        p.error("--prune and --older-than go together")
    wd = WorkDir(a.workdir)
    with wd.lock(a.lock_timeout):
        if a.restore:
            print(f"restored {a.restore} as {kept.restore(wd.root, a.restore)}")
        elif a.delete:
            kept.delete(wd.root, a.delete)
            print(f"deleted {a.delete}")
        elif a.set_aside is not None:
            wd.set_aside(a.set_aside)
            print(f"{len(kept.entries(wd.root))} kept workspace(s) in {kept.kept_dir(wd.root)}; the next apply "
                  "builds what was set aside anew")
        elif a.prune:
            old = [k for k in kept.entries(wd.root) if time.time() - k.made > a.older_than]
            skipped = 0
            for k in old:
                try:
                    kept.delete(wd.root, k.key)
                except DirtyTreeError as exc:  # the repository of a live worktree: kept, and said why
                    skipped += 1
                    print(f"kept {k.key}: {exc.render()}", file=sys.stderr, flush=True)
                    continue
                print(f"deleted {k.key}")
            print(f"{len(old) - skipped} kept workspace(s) deleted" + (f", {skipped} kept (see above)" if skipped else ""))
            return 1 if skipped else 0
        else:
            _list(wd)
    return 0


def _named(argv: list[str]) -> list[str]:
    """``--restore NAME`` and ``--delete NAME`` as argparse takes them when NAME begins with a dash
    (the copy of a folder so named, as the line that kept it prints it): ``--restore=NAME``."""
    for i, arg in enumerate(argv[:-1]):
        if arg in ("--restore", "--delete") and argv[i + 1].startswith("-"):
            return [*argv[:i], f"{arg}={argv[i + 1]}", *argv[i + 2:]]
    return argv


def _list(wd: WorkDir) -> None:
    rows = kept.entries(wd.root)
    for k in rows:
        age = (time.time() - k.made) / 3600
        what = f"link to {os.readlink(k.path)}" if k.path.is_symlink() else f"{kept.size(k.path) / 2**20:.1f} MiB"
        print(f"{k.key}  {k.upstream}  {age:.1f} h old  {what}")
    print(f"{len(rows)} kept workspace(s) in {kept.kept_dir(wd.root)}")
