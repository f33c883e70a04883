"""Work inside a submodule of an --into checkout is the user's too.

A checkout's own config may tell git to recurse into submodules (`submodule.recurse`) and to hide
their edits from status (`diff.ignoreSubmodules`, `submodule.<name>.ignore`), or mark the gitlink
assume-unchanged. Judged clean so, the re-apply's `git reset --hard` to its start then recursed
into the submodule and wrote over its uncommitted edit, with no copy anywhere. The tool's own git
runs neither recurse nor let a checkout's config hide a submodule's edits from its status. Real
git, the demo series, a real submodule.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import git, tool

ML = "megatron-lm"
MINE = "my uncommitted work in the submodule\n"


def _into(demo: dict, target: Path, *extra: str, check: int | None = None):
    return tool("apply", "--series", demo["series"], "--workdir", demo["work"], "--cache", demo["cache"],
                "--into", f"{ML}={target}", *extra, check=check)


def _with_submodule(demo: dict, tmp_path: Path) -> Path:
    """A clone of the demo upstream at its base, with a submodule committed, applied --only clean."""
    src = tmp_path / "subsrc"
    src.mkdir()
    git(src, "init", "-q")
    (src / "s.txt").write_text("orig\n")
    git(src, "add", "s.txt")
    git(src, "-c", "user.name=u", "-c", "user.email=u@example.com", "commit", "-qm", "s")
    target = tmp_path / "checkout"
    git(tmp_path, "clone", "-q", str(demo["up"]), str(target))
    git(target, "checkout", "-q", "-B", "main", demo["v0"])
    git(target, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(src), "vendor/sub")
    git(target, "-c", "user.name=u", "-c", "user.email=u@example.com", "commit", "-qm", "add a submodule")
    git(target, "config", "submodule.recurse", "true")
    _into(demo, target, "--only", "clean", check=0)
    return target


@pytest.mark.parametrize("hide", ["diff.ignoreSubmodules", "submodule.ignore", "assume-unchanged"])
def test_into_again_never_writes_over_a_submodules_uncommitted_work(demo, tmp_path, hide):
    target = _with_submodule(demo, tmp_path)
    head = git(target, "rev-parse", "HEAD")
    mine = target / "vendor/sub/s.txt"
    mine.write_text(MINE)
    if hide == "diff.ignoreSubmodules":
        git(target, "config", "diff.ignoreSubmodules", "dirty")
    elif hide == "submodule.ignore":
        git(target, "config", "submodule.vendor/sub.ignore", "all")
    else:
        git(target, "update-index", "--assume-unchanged", "vendor/sub")
    assert git(target, "status", "--porcelain") == ""  # what git status alone judged by
    res = _into(demo, target, check=None)  # every patch: the reset to the start comes first
    assert mine.read_text() == MINE, res.stdout + res.stderr
    if hide != "assume-unchanged":  # seen, and refused as any uncommitted edit
        assert res.returncode == 1 and "uncommitted changes: vendor/sub" in res.stderr, res.stderr
        assert git(target, "rev-parse", "HEAD") == head
