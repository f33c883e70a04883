"""A patch as git itself reads it: the second opinion on what patchfile parsed.

``git apply --numstat --summary -z`` names every file section git would apply, in order, and
the modes of the files it creates or changes. A patch is safe only when git's list of sections
is exactly the one carry.series.patchfile found (so every check made on that parse is a check
of what ``git am`` applies), and when none of git's names or modes is one patchfile refuses.
git runs outside any repository (a repository's sub-folder would prefix the names); it reads
the files and touches nothing.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..files import read_input
from ..git import Git
from .patchfile import Patch, path_problems

_VERSION = b"patchgit 1\0"  # a new check reads every patch again
_LINKS = {"120000": "symlink (mode 120000)", "160000": "submodule entry (mode 160000)"}


def git_problems(files: list[tuple[Path, Patch]], seen: Path | None = None) -> dict[Path, list[str]]:
    """Problems per patch file where git's reading differs from ours or is unsafe; {} when none.

    One git process for all of them; a patch is read on its own again only when that one
    process disagrees (to say which patch it is). ``seen``: a folder that remembers the
    contents git already read so (a file named by the sha256 of the bytes, and of this
    check's version): those are not asked again (apply's cache; lint always asks).
    """
    if seen is not None:
        marks = {path: seen / hashlib.sha256(_VERSION + read_input(path)).hexdigest() for path, _ in files}
        todo = [(path, patch) for path, patch in files if not marks[path].exists()]
        found = git_problems(todo)
        for path, _ in todo:
            if path not in found:
                marks[path].parent.mkdir(parents=True, exist_ok=True)
                marks[path].touch()
        return found
    if not files:
        return {}
    problems = _compare(files)
    if not problems or len(files) == 1:
        return {files[0][0]: problems} if problems else {}
    out = {}
    for path, patch in files:
        mine = _compare([(path, patch)])
        if mine:
            out[path] = mine
    return out or {files[0][0]: problems}


def _compare(files: list[tuple[Path, Patch]]) -> list[str]:
    first = files[0][0].parent
    # no repository above: git apply would prefix a sub-folder's path to every name
    res = Git(first)("apply", "--numstat", "--summary", "-z", *(str(p) for p, _ in files), check=False,
                     env={"GIT_CEILING_DIRECTORIES": str(first.parent)})
    if not res.ok:
        tail = " ".join(res.stderr.strip().splitlines()[-2:])
        return [f"git apply cannot read it ({tail}): the patch file is malformed"]
    *records, summary = res.stdout.split("\0")
    theirs = [r.split("\t", 2)[2] for r in records if r.count("\t") >= 2]
    ours = [f.path for _, patch in files for f in patch.files]
    problems = []
    if theirs != ours:
        problems.append(f"git apply reads {len(theirs)} file section(s) ({', '.join(map(repr, theirs))}) where "
                        f"this tool reads {len(ours)} ({', '.join(map(repr, ours))}): git am would apply "
                        "what is not checked here")
    for name in theirs:
        problems += [f"{name}: {why} (as git reads it)" for why in path_problems(name)]
    for line in summary.splitlines():
        words = line.split()
        if words[:1] in (["create"], ["delete"], ["mode"]):
            for mode in words:
                if mode in _LINKS:
                    problems.append(f"{line.strip()}: {_LINKS[mode]} (as git reads it)")
    return problems
