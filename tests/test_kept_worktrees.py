"""Linked worktrees stay connected when the tool moves a workspace, or a worktree, into .carry/kept
and back: inside the workspace, beside it in the work directory, outside it.

git links a worktree to its repository both ways by absolute path; a rename of either breaks the
link, `git status` then fails in the worktree and the repository calls it "prunable", where the
`git worktree prune` git suggests drops the worktree's index and the only ref to its HEAD. Real
git, the demo series rebuilt by a series change.
"""

from __future__ import annotations

import subprocess

from helpers import apply_demo, git, kill_at, tool
from helpers import kept_lines as _kept_lines
from helpers import paste_kept as _paste

ML = "megatron-lm"
EDITED = "megatron/core/alpha.py"


def _work_in(wt) -> str:
    """A commit on a detached HEAD (no branch holds it) and an uncommitted edit, staged and not, in
    linked worktree ``wt``; returns the commit."""
    git(wt, "checkout", "-q", "--detach")
    git(wt, "commit", "-q", "--allow-empty", "-m", "detached work in a linked worktree")
    f = wt / EDITED
    f.write_text(f.read_text() + "# staged\n")
    git(wt, "add", EDITED)
    f.write_text(f.read_text() + "# not staged\n")
    return git(wt, "rev-parse", "HEAD")


def _still_works(wt, repo, commit: str) -> None:
    """``wt`` is a working linked worktree of ``repo`` (both where they are now), at ``commit``,
    with its edit, and ``repo`` lists it as such (not prunable)."""
    assert git(wt, "status", "--porcelain") == f"MM {EDITED}"
    assert git(wt, "rev-parse", "HEAD") == commit
    assert git(wt, "rev-parse", "--git-common-dir") == str(repo / ".git")
    listed = git(repo, "worktree", "list", "--porcelain")
    assert f"worktree {wt}\n" in listed + "\n", listed
    assert "prunable" not in listed, listed


def _worktree_inside_then_a_series_change(demo) -> tuple:
    """The demo applied, a linked worktree inside its workspace with work in it (_work_in), then a series change
    the next apply rebuilds for: the workspace and the worktree's commit."""
    apply_demo(demo, check=0)
    ws = demo["work"] / ML
    with (ws / ".git/info/exclude").open("a") as f:
        f.write("/inner/\n")
    git(ws, "worktree", "add", "-q", "-b", "feat", str(ws / "inner"))
    commit = _work_in(ws / "inner")
    demo["write_series"](demo["v0"], ids=("clean", "threeway"))
    return ws, commit


def test_a_worktree_inside_the_workspace_moves_with_it_and_back(demo):
    ws, commit = _worktree_inside_then_a_series_change(demo)
    res = apply_demo(demo, check=0)
    [line] = _kept_lines(res.stderr)
    [old] = (demo["work"] / ".carry" / "kept").iterdir()
    _still_works(old / "inner", old, commit)
    assert "inner" not in git(ws, "worktree", "list")  # the rebuilt tree has none of its own
    res = _paste(line, 0)  # restore: the old workspace, its worktree inside, back in place
    assert res.returncode == 0, res.stderr
    _still_works(ws / "inner", ws, commit)


def test_a_run_killed_between_the_rename_and_the_repair_leaves_the_repair_to_the_next(demo):
    """apply killed just after it renamed the old workspace (its worktree inside) out of the way, before git
    reconnected that worktree: the next command under the work directory's lock (here the listing of kept
    copies) repairs it from the log the move wrote first, and the finished swap keeps it working."""
    ws, commit = _worktree_inside_then_a_series_change(demo)
    kill_at("moved", "--series", demo["series"], "--workdir", demo["work"], "--cache", demo["cache"],
            "--source", f"megatron-lm={demo['up']}")
    [moved] = (demo["work"] / ".carry").glob(f"trash-*/{ML}")
    broken = subprocess.run(["git", "-C", str(moved / "inner"), "status"], capture_output=True, text=True)
    assert broken.returncode != 0, "the kill came after the repair: the test tests nothing"
    assert (demo["work"] / ".carry" / "moving.json").exists()
    tool("kept", "--workdir", demo["work"], check=0)
    assert not (demo["work"] / ".carry" / "moving.json").exists()
    _still_works(moved / "inner", moved, commit)
    apply_demo(demo, check=0)  # the swap finished: the old tree kept, its worktree with it
    [old] = (demo["work"] / ".carry" / "kept").iterdir()
    _still_works(old / "inner", old, commit)


def test_an_unreadable_move_log_is_said_and_dropped(demo):
    """A .carry/moving.json cut short (a full disk, say) repairs nothing: the command says so, with the git
    command that reconnects by hand, drops it and goes on (it never stops every later command)."""
    apply_demo(demo, check=0)
    log = demo["work"] / ".carry" / "moving.json"
    for text in ('{"from": "/x", "to"', '["/x", "/y"]'):   # cut short; JSON, but not what a move writes
        log.write_text(text)
        res = tool("kept", "--workdir", demo["work"], check=0)
        assert f"{log} is unreadable" in res.stderr and "`git worktree repair`" in res.stderr, res.stderr
        assert not log.exists()


def test_a_worktree_beside_the_workspace_is_set_aside_and_restored(demo):
    apply_demo(demo, check=0)
    ws, beside = demo["work"] / ML, demo["work"] / "mlm-feature"
    git(ws, "worktree", "add", "-q", "-b", "feat", str(beside))
    commit = _work_in(beside)
    res = tool("kept", "--workdir", demo["work"], "--set-aside", check=0)  # every folder with a .git
    lines = _kept_lines(res.stderr)
    assert len(lines) == 2, res.stderr
    kept = demo["work"] / ".carry" / "kept"
    [old] = kept.glob(f"{ML}-*")
    [wt] = kept.glob("mlm-feature-*")
    _still_works(wt, old, commit)
    for line in lines:  # both restored, in the order printed
        res = _paste(line, 0)
        assert res.returncode == 0, res.stderr
    _still_works(beside, ws, commit)


def test_a_worktree_git_cannot_reconnect_is_named_and_the_rebuild_goes_on(demo):
    """A worktree record whose folder is now a repository of its own: git refuses to repair it,
    the move is done (the tree is kept whole) and the line says so, naming the command that shows it."""
    apply_demo(demo, check=0)
    ws, gone = demo["work"] / ML, demo["tmp"] / "gone"
    git(ws, "worktree", "add", "-q", "-b", "feat", str(gone))
    subprocess.run(["rm", "-rf", str(gone)], check=True)
    git(demo["tmp"], "init", "-q", str(gone))
    demo["write_series"](demo["v0"], ids=("clean", "threeway"))
    res = apply_demo(demo, check=0)
    [old] = (demo["work"] / ".carry" / "kept").iterdir()
    said = [x for x in res.stderr.splitlines() if "could not reconnect" in x]  # at each move: the swap's, the keeping
    assert said and str(old) in said[-1], res.stderr
    assert ".git is not a file" in said[-1] and "worktree list" in said[-1], said


def _other_repo_work(repo, wt) -> str:
    """Repository ``repo`` with a linked worktree ``wt`` holding a commit on a detached HEAD and a
    staged file; returns the commit."""
    git(repo.parent, "init", "-q", str(repo))
    (repo / "a").write_text("a\n")
    git(repo, "add", "a")
    git(repo, "commit", "-q", "-m", "init")
    git(repo, "worktree", "add", "-q", "--detach", str(wt))
    (wt / "b").write_text("b\n")
    git(wt, "add", "b")
    git(wt, "commit", "-q", "-m", "detached work")
    (wt / "c").write_text("staged\n")
    git(wt, "add", "c")
    return git(wt, "rev-parse", "HEAD")


def _other_still_works(wt, repo, commit: str) -> None:
    git(repo, "worktree", "prune")  # what git suggests for a prunable one: it must drop nothing
    assert git(wt, "status", "--porcelain") == "A  c"
    assert git(wt, "rev-parse", "HEAD") == commit
    listed = git(repo, "worktree", "list", "--porcelain")
    assert f"worktree {wt}\n" in listed + "\n" and "prunable" not in listed, listed


def test_another_repositorys_worktree_inside_the_workspace_is_reconnected(demo):
    """A linked worktree of a repository outside the work directory, placed inside the workspace:
    set aside and restored with the workspace, it stays that repository's working worktree."""
    apply_demo(demo, check=0)
    ws, other = demo["work"] / ML, demo["tmp"] / "other"
    commit = _other_repo_work(other, ws / "other-wt")
    res = tool("kept", "--workdir", demo["work"], "--set-aside", ML, check=0)
    [line] = _kept_lines(res.stderr)
    [old] = (demo["work"] / ".carry" / "kept").iterdir()
    _other_still_works(old / "other-wt", other, commit)
    res = _paste(line, 0)
    assert res.returncode == 0, res.stderr
    _other_still_works(ws / "other-wt", other, commit)


def test_a_repository_inside_the_workspace_keeps_its_worktrees_outside(demo):
    """A repository of the user's inside the workspace, with a linked worktree outside it: the
    worktree stays connected to it when the workspace is set aside and restored."""
    apply_demo(demo, check=0)
    ws = demo["work"] / ML
    inner, wt = ws / "inner-repo", demo["tmp"] / "inner-wt"
    commit = _other_repo_work(inner, wt)
    res = tool("kept", "--workdir", demo["work"], "--set-aside", ML, check=0)
    [line] = _kept_lines(res.stderr)
    [old] = (demo["work"] / ".carry" / "kept").iterdir()
    _other_still_works(wt, old / "inner-repo", commit)
    res = _paste(line, 0)
    assert res.returncode == 0, res.stderr
    _other_still_works(wt, inner, commit)


def test_a_kept_copy_with_a_live_worktree_outside_is_not_deleted(demo):
    """A kept copy is the repository of the worktree beside the workspace, which keeps working and
    taking commits: --delete and --prune refuse it (nothing deleted) and name the worktree; the
    hint's worktree remove, then the delete again, as pasted, delete it."""
    apply_demo(demo, check=0)
    ws, beside = demo["work"] / ML, demo["tmp"] / "feature"
    git(ws, "worktree", "add", "-q", "-b", "feature", str(beside))
    tool("kept", "--workdir", demo["work"], "--set-aside", ML, check=0)
    [old] = (demo["work"] / ".carry" / "kept").iterdir()
    git(beside, "commit", "-q", "--allow-empty", "-m", "made after the move")
    res = tool("kept", "--workdir", demo["work"], "--delete", old.name, check=1)
    assert str(beside) in res.stderr and "nothing was deleted" in res.stderr, res.stderr
    res = tool("kept", "--workdir", demo["work"], "--prune", "--older-than", "0s", check=1)
    assert f"kept {old.name}" in res.stderr and str(beside) in res.stderr, res.stderr
    assert git(beside, "log", "-1", "--format=%s") == "made after the move"  # still there, still working
    hint = res.stderr.split("next: ", 1)[1]
    for which in (1, 2):  # git worktree remove, then the delete again
        res = _paste(hint, which)
        assert res.returncode == 0, res.stderr
    assert not old.exists() and not beside.exists()


def test_a_kept_copy_holding_another_repositorys_worktree_is_not_deleted(demo):
    """A linked worktree of a repository elsewhere, inside the workspace, goes into the kept copy with it
    and keeps working there: --delete refuses the copy (its HEAD and staged work would die with the
    folder) and names the worktree; the hint's worktree remove (refused by git while the worktree holds
    uncommitted work), then the delete again, as pasted, delete it."""
    apply_demo(demo, check=0)
    ws, other = demo["work"] / ML, demo["tmp"] / "other"
    commit = _other_repo_work(other, ws / "other-wt")
    tool("kept", "--workdir", demo["work"], "--set-aside", ML, check=0)
    [old] = (demo["work"] / ".carry" / "kept").iterdir()
    res = tool("kept", "--workdir", demo["work"], "--delete", old.name, check=1)
    assert str(old / "other-wt") in res.stderr and "nothing was deleted" in res.stderr, res.stderr
    _other_still_works(old / "other-wt", other, commit)
    hint = res.stderr.split("next: ", 1)[1]
    assert _paste(hint, 1).returncode != 0  # git keeps a worktree with uncommitted work
    git(old / "other-wt", "commit", "-q", "-m", "staged work, committed")
    for which in (1, 2):
        res = _paste(hint, which)
        assert res.returncode == 0, res.stderr
    assert not old.exists() and "other-wt" not in git(other, "worktree", "list")  # removed by git, as asked
