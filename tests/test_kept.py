"""A rebuild keeps the whole old workspace aside, and only tools/kept.py removes it (issue 41, items 1-5).

Each form of the user's work that a rebuild lost before: an older stash, a file the
workspace's own .git/info/exclude ignores, a commit in a linked worktree (which must keep
working), a commit only the reflog reaches, an in-progress `git rebase -i`, a remote, a hook.
An edit to a skip-worktree file is an uncommitted edit: it stops the rebuild, and the hint's
--set-aside keeps it whole. Real git, the demo series rebuilt by a series change.
"""

from __future__ import annotations

import os
import subprocess

from helpers import apply_demo, git, tool
from helpers import kept_lines as _kept_lines
from helpers import paste_kept as _paste

ML = "megatron-lm"


def _user_work(ws, tmp):
    """Every form of work the issue lists, in workspace ``ws``; returns what to look for."""
    f = ws / "megatron/core/alpha.py"
    marks = {}
    for n in (1, 2):
        f.write_text(f.read_text() + f"# stash {n}\n")
        git(ws, "stash", "push", "-q", "-m", f"stash {n}")
    marks["stash1"] = git(ws, "rev-parse", "stash@{1}")
    (ws / ".git/info/exclude").write_text("mine.local\n")
    (ws / "mine.local").write_text("ignored but mine\n")
    head = git(ws, "rev-parse", "HEAD")
    (ws / "reflog.txt").write_text("reflog only\n")
    git(ws, "add", "reflog.txt")
    git(ws, "commit", "-q", "-m", "reachable from the reflog only")
    marks["reflog"] = git(ws, "rev-parse", "HEAD")
    git(ws, "reset", "-q", "--hard", head)
    wt = tmp / "linked"
    git(ws, "worktree", "add", "-q", "-b", "mine", str(wt))
    (wt / "wt.txt").write_text("linked worktree\n")
    git(wt, "add", "wt.txt")
    git(wt, "commit", "-q", "-m", "made in a linked worktree")
    marks["linked"], marks["wt"] = git(wt, "rev-parse", "HEAD"), wt
    git(ws, "remote", "add", "mine", "https://example.invalid/mine.git")
    (ws / ".git/hooks/post-commit").write_text("#!/bin/sh\necho mine\n")
    env = dict(os.environ, GIT_SEQUENCE_EDITOR="sed -i s/^pick/edit/")
    subprocess.run(["git", "-C", str(ws), "rebase", "-q", "-i", "HEAD~1"], env=env, check=True, capture_output=True)
    return marks


def _has_it_all(ws, marks) -> None:
    assert git(ws, "rev-parse", "stash@{1}") == marks["stash1"]
    assert (ws / "mine.local").read_text() == "ignored but mine\n"
    assert git(ws, "cat-file", "-t", marks["reflog"]) == "commit"
    assert marks["reflog"] in git(ws, "reflog", "--format=%H")
    assert git(ws, "remote", "get-url", "mine") == "https://example.invalid/mine.git"
    assert (ws / ".git/hooks/post-commit").exists()
    assert (ws / ".git/rebase-merge").is_dir()


def test_a_rebuild_keeps_the_whole_old_workspace(demo):
    apply_demo(demo, check=0)
    ws = demo["work"] / ML
    marks = _user_work(ws, demo["tmp"])
    demo["write_series"](demo["v0"], ids=("clean", "threeway"))
    res = apply_demo(demo)
    assert res.returncode == 0, res.stderr
    lines = _kept_lines(res.stderr)
    assert len(lines) == 1 and ML in lines[0], res.stderr
    kept = demo["work"] / ".carry" / "kept"
    [old] = list(kept.iterdir())
    _has_it_all(old, marks)
    wt = marks["wt"]  # the linked worktree works, against the kept copy
    assert git(wt, "rev-parse", "HEAD") == marks["linked"]
    (wt / "more.txt").write_text("more\n")
    git(wt, "add", "more.txt")
    git(wt, "commit", "-q", "-m", "after the rebuild")
    assert git(old, "log", "-1", "--format=%s", "mine") == "after the rebuild"

    listed = tool("kept", "--workdir", demo["work"], check=0).stdout
    assert old.name in listed and "MiB" in listed
    res = _paste(lines[0], 0)  # restore: the rebuilt tree goes aside, the old one comes back
    assert res.returncode == 0, res.stderr
    _has_it_all(ws, marks)
    assert len(_kept_lines(res.stderr)) == 1 and len(list(kept.iterdir())) == 1
    assert git(wt, "status", "--porcelain") == ""
    [new] = list(kept.iterdir())
    tool("kept", "--workdir", demo["work"], "--delete", new.name, check=0)
    assert not kept.exists() or not list(kept.iterdir())


def test_a_skip_worktree_edit_stops_the_rebuild_and_set_aside_keeps_it(demo):
    apply_demo(demo, check=0)
    ws = demo["work"] / ML
    head = git(ws, "rev-parse", "HEAD")
    git(ws, "update-index", "--skip-worktree", "megatron/core/gamma.py")
    (ws / "megatron/core/gamma.py").write_text("skip-worktree edit\n")
    demo["write_series"](demo["v0"], ids=("clean", "threeway"))
    res = apply_demo(demo, check=1)
    assert "uncommitted changes: megatron/core/gamma.py (marked skip-worktree)" in res.stderr, res.stderr
    assert git(ws, "rev-parse", "HEAD") == head and not (demo["work"] / ".carry" / "kept").exists()
    assert (ws / "megatron/core/gamma.py").read_text() == "skip-worktree edit\n"
    hint = [line for line in res.stderr.splitlines() if "next:" in line][0]
    aside = [c for c in hint.split("`")[1::2] if "--set-aside" in c][0]
    assert subprocess.run(["sh", "-c", aside], capture_output=True, text=True).returncode == 0
    apply_demo(demo, check=0)
    [old] = list((demo["work"] / ".carry" / "kept").iterdir())
    assert (old / "megatron/core/gamma.py").read_text() == "skip-worktree edit\n"
    assert git(old, "rev-parse", "HEAD") == head


def test_prune_removes_only_what_is_older(demo):
    apply_demo(demo, check=0)
    demo["write_series"](demo["v0"], ids=("clean", "threeway"))
    res = apply_demo(demo, check=0)
    [line] = _kept_lines(res.stderr)
    kept = demo["work"] / ".carry" / "kept"
    assert tool("kept", "--workdir", demo["work"], "--prune", "--older-than", "1d", check=0)
    assert len(list(kept.iterdir())) == 1
    assert tool("kept", "--workdir", demo["work"], "--prune", check=2).stderr
    assert tool("kept", "--workdir", demo["work"], "--prune", "--older-than", "soon", check=2)
    assert tool("kept", "--workdir", demo["work"], "--delete", "nothing-20260101T000000Z", check=2)
    res = _paste(line, 1)  # the one line's delete command
    assert res.returncode == 0, res.stderr
    assert not list(kept.iterdir())
    assert "1 kept" not in tool("kept", "--workdir", demo["work"], check=0).stdout


# Daylight-saving time all year (from 0:00 on day 0 to 25:00 on day 365): a zone on summer time
# whatever the date the test runs, as Sydney is in December or New York in July.
SUMMER_TIME = "EST5EDT,0/0,J365/25"


def test_a_copy_made_now_is_new_in_a_zone_on_summer_time(demo):
    """The copy's name is stamped in UTC; its age is now minus that UTC time, in any time zone."""
    apply_demo(demo, check=0)
    tool("kept", "--workdir", demo["work"], "--set-aside", ML, check=0)
    env = {"TZ": SUMMER_TIME}
    listed = tool("kept", "--workdir", demo["work"], env=env, check=0).stdout
    assert " 0.0 h old " in listed, listed
    tool("kept", "--workdir", demo["work"], "--prune", "--older-than", "30m", env=env, check=0)
    assert len(list((demo["work"] / ".carry" / "kept").iterdir())) == 1


def test_a_workspace_that_is_a_symlink_is_kept_listed_restored_and_deleted_as_a_link(demo):
    """Every hint a kept line prints works pasted as printed, for a workspace that was a symlink
    (moved to a bigger disk, linked back): the link is what is kept; what it points at stays."""
    apply_demo(demo, check=0)
    ws, target = demo["work"] / ML, demo["tmp"] / "bigger-disk"
    ws.rename(target)
    ws.symlink_to(target)
    demo["write_series"](demo["v0"], ids=("clean", "threeway"))
    [line] = _kept_lines(apply_demo(demo, check=0).stderr)
    kept = demo["work"] / ".carry" / "kept"
    [link] = [p for p in kept.iterdir() if p.is_symlink()]
    listed = tool("kept", "--workdir", demo["work"], check=0).stdout
    assert link.name in listed and f"link to {target}" in listed, listed
    res = _paste(line, 0)
    assert res.returncode == 0, res.stderr
    assert ws.is_symlink() and ws.resolve() == target
    [line] = _kept_lines(tool("kept", "--workdir", demo["work"], "--set-aside", ML, check=0).stderr)
    res = _paste(line, 1)  # delete: the link goes, the tree it pointed at stays
    assert res.returncode == 0, res.stderr
    assert not ws.is_symlink() and not [p for p in kept.iterdir() if p.is_symlink()]
    assert git(target, "rev-parse", "HEAD")


def test_a_repository_of_the_users_set_aside_with_the_workspaces_comes_back_by_its_hint(demo):
    """--set-aside alone moves every folder of the work directory with a .git: a repository of the
    user's, whatever its name (a space in it, a leading dash), is kept like a workspace, and its
    printed --restore and --delete commands work pasted as printed."""
    apply_demo(demo, check=0)
    names = ("my notes", "-dash")
    for name in names:
        git(demo["work"], "init", "-q", f"./{name}")
        (demo["work"] / name / "todo.txt").write_text(f"{name}: important\n")
    res = tool("kept", "--workdir", demo["work"], "--set-aside", check=0)
    lines = {name: line for name in names for line in _kept_lines(res.stderr) if f"{name}-" in line}
    assert len(lines) == 2 and len(_kept_lines(res.stderr)) == 3, res.stderr
    listed = tool("kept", "--workdir", demo["work"], check=0).stdout
    assert "3 kept workspace(s)" in listed and "my notes" in listed and "-dash" in listed, listed
    for name, line in lines.items():
        res = _paste(line, 0)
        assert res.returncode == 0, res.stderr
        assert (demo["work"] / name / "todo.txt").read_text() == f"{name}: important\n"
    res = tool("kept", "--workdir", demo["work"], "--set-aside", check=0)  # the two again (the workspace is kept)
    assert len(_kept_lines(res.stderr)) == 2, res.stderr
    for line in _kept_lines(res.stderr):
        res = _paste(line, 1)
        assert res.returncode == 0, res.stderr
    assert [p.name[:len(ML)] for p in (demo["work"] / ".carry" / "kept").iterdir()] == [ML]


def test_a_folder_named_with_a_newline_is_listed_and_restored_too(demo):
    """A name holding a newline: its kept line stays one line (the name shown as $'...'), and the restore it
    prints works pasted; the copy is kept.py's to list too."""
    apply_demo(demo, check=0)
    name = "new\nline"
    git(demo["work"], "init", "-q", name)
    res = tool("kept", "--workdir", demo["work"], "--set-aside", check=0)
    [line] = [x for x in _kept_lines(res.stderr) if "$'new\\nline" in x]
    assert line.startswith("[carry] $'new\\nline': the current workspace is kept whole in "), line
    [copy] = [p.name for p in (demo["work"] / ".carry" / "kept").iterdir() if p.name.startswith(name)]
    assert "2 kept workspace(s)" in tool("kept", "--workdir", demo["work"], check=0).stdout
    pasted = subprocess.run(["bash", "-c", line.split("`")[1]], capture_output=True, text=True)  # $'...' is bash's
    assert pasted.returncode == 0, pasted.stderr
    assert (demo["work"] / name / ".git").is_dir()
