"""Recovering an interrupted swap keeps what the user did since (issue 32, items 1 and 14).

A run interrupted in its swap (SIGINT at the journal, SIGKILL between two renames) is finished
or undone by the next export, apply or prove. The user may have worked in the workspaces
meanwhile: an amended commit, an untracked file. Recovery keeps their commits as
refs/carry/saved/* in the tree that stays and refuses, with nothing moved, while edits are
uncommitted; the hint's command keeps them. Two upstreams, real git, real signals.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from fakeup import NO_PROOF, patch_entry, series_toml
from carry.git import Git
from helpers import git, kill_at, read_json, sigint_at, tool

ML, BR = "megatron-lm", "megatron-bridge"


def _two(demo: dict) -> dict:
    """The demo series over two upstreams: megatron-bridge is a copy of the demo upstream."""
    up2 = demo["tmp"] / "upstream2"
    if not up2.exists():
        shutil.copytree(demo["up"], up2, symlinks=True)
    sdir = demo["series"]
    for name in ("0001-clean.patch", "0002-threeway.patch"):
        (sdir / BR).mkdir(exist_ok=True)
        shutil.copy(sdir / ML / name, sdir / BR / name)

    def write(ml=("clean", "threeway", "conflict"), br=("bclean", "bthreeway")):
        files = {"clean": "0001-clean.patch", "threeway": "0002-threeway.patch", "conflict": "0004-conflict.patch"}
        entries = [patch_entry(pid, f"{ML}/{files[pid]}") for pid in ml]
        entries += [patch_entry(pid, f"{BR}/{files[pid[1:]]}", upstream=BR) for pid in br]
        text = series_toml(demo["v0"], "https://example.invalid/upstream.git", entries)
        head, _, rest = text.partition("[[patches]]")
        head += (f'[upstreams.{BR}]\npython_path = "."\nsources = ["git"]\n\n'
                 f'[upstreams.{BR}.git]\nurl = "https://example.invalid/upstream2.git"\ncommit = "{demo["v0"]}"\n\n')
        (sdir / "series.toml").write_text(head + "[[patches]]" + rest)

    write()
    (sdir / ML / "0003-upstreamed.patch").unlink(missing_ok=True)
    return dict(demo, up2=up2, write=write)


def _args(d: dict, verb: str = "apply") -> list:
    args = ["--series", d["series"], "--workdir", d["work"]]
    if verb == "apply":
        args += ["--cache", d["cache"], "--source", f"{ML}={d['up']}", "--source", f"{BR}={d['up2']}"]
    return args


def _run(d: dict, verb: str, check: int | None = None):
    return tool(verb, *_args(d, verb), check=check)


def _sigint_at(d: dict, stop: str) -> None:
    """apply, stopped at ``stop`` and sent SIGINT as a terminal's Ctrl-C sends it."""
    rc, err = sigint_at(stop, *_args(d))
    assert rc == 130, err


def _amend(ws: Path, text: str) -> str:
    f = ws / "megatron/core/alpha.py"
    f.write_text(f.read_text() + f"# {text}\n")
    git(ws, "commit", "-q", "-a", "--amend", "--no-edit")
    return git(ws, "rev-parse", "HEAD")


def _saved(ws: Path) -> dict[str, str]:
    out = git(ws, "for-each-ref", "--format=%(objectname) %(refname)", "refs/carry/saved/")
    return {ref: sha for sha, ref in (line.split() for line in out.splitlines())}


def _paste(hint: str) -> None:
    """Run the first backticked command of a next: line, as a user pastes it."""
    cmd = hint.split("`")[1]
    subprocess.run(["sh", "-c", cmd], check=True, capture_output=True, env=dict(os.environ))


@pytest.mark.parametrize("verb", ["export", "apply"])
def test_sigint_at_the_journal_then_user_work_is_kept(demo, verb):
    d = _two(demo)
    _run(d, "apply", check=0)
    d["write"](ml=("clean", "threeway"), br=("bclean",))  # both upstreams are rebuilt
    _sigint_at(d, "journalled")
    ws1, ws2 = d["work"] / ML, d["work"] / BR
    amended = _amend(ws1, "my amend, after the interrupted apply")
    (ws2 / "notes.txt").write_text("my notes\n")

    res = _run(d, verb)
    assert res.returncode == 1, res.stderr
    assert "uncommitted changes" in res.stderr and "notes.txt" in res.stderr and "Traceback" not in res.stderr
    assert (d["work"] / ".carry" / "journal.json").exists(), "the swap went on"
    assert git(ws1, "rev-parse", "HEAD") == amended and (ws2 / "notes.txt").exists()

    _paste(res.stderr.split("next: ", 1)[1])  # keeps the untracked file as a stash
    stash = git(ws2, "rev-parse", "refs/stash")
    res = _run(d, verb)
    assert res.returncode in (0, 1), res.stderr  # export of a workspace with saved refs may find drift: not lost
    assert not (d["work"] / ".carry" / "journal.json").exists()
    assert amended in _saved(ws1).values(), (res.stderr, _saved(ws1))
    assert stash in _saved(ws2).values(), (res.stderr, _saved(ws2))
    assert "my notes" in git(ws2, "show", f"{stash}^3:notes.txt")
    assert "refs/carry/saved/" in res.stderr
    head = read_json(d["work"] / ".carry" / "state.json")["upstreams"][ML]["head"]
    assert git(ws1, "rev-parse", "HEAD") == head  # the swap was finished
    assert len(git(ws1, "log", "--format=%H", "HEAD").splitlines()) == 3


def test_sigkill_between_the_renames_keeps_work_in_both_trees(demo):
    d = _two(demo)
    _run(d, "apply", check=0)
    d["write"](ml=("clean", "threeway"), br=("bclean",))
    kill_at("swapping", *_args(d))  # megatron-lm is the new tree, megatron-bridge still the old one
    ws1, ws2 = d["work"] / ML, d["work"] / BR
    new1 = _amend(ws1, "amend in the new tree")
    old2 = _amend(ws2, "amend in the old tree")
    res = _run(d, "apply")
    assert not (d["work"] / ".carry" / "journal.json").exists(), res.stderr
    assert git(ws1, "rev-parse", "HEAD") == new1  # the new tree moved in stays, with the user's commit
    # and apply, having finished the swap, guards it as ever: export it or drop it
    assert res.returncode == 1 and f"{ML}: workspace {ws1} has commits the series does not know" in res.stderr
    assert old2 in _saved(ws2).values(), (res.stderr, _saved(ws2))


def test_an_undone_swap_keeps_the_commits_made_in_the_new_tree(demo):
    d = _two(demo)
    _run(d, "apply", check=0)
    old_heads = {n: git(d["work"] / n, "rev-parse", "HEAD") for n in (ML, BR)}
    d["write"](ml=("clean", "threeway"), br=("bclean",))
    kill_at("swapping", *_args(d))
    ws1 = d["work"] / ML
    mine = _amend(ws1, "amend in the new tree")
    (ws1 / "scratch.txt").write_text("scratch\n")
    for staging in (d["work"] / ".carry").glob("staging-*"):
        shutil.rmtree(staging)  # the rest of the swap cannot be finished: it is undone
    res = _run(d, "export")
    assert res.returncode == 1 and "scratch.txt" in res.stderr, res.stderr
    assert git(ws1, "rev-parse", "HEAD") == mine
    (ws1 / "scratch.txt").unlink()
    res = _run(d, "export")
    assert "refs/carry/saved/" in res.stderr, res.stderr
    assert {n: git(d["work"] / n, "rev-parse", "HEAD") for n in (ML, BR)} == old_heads
    assert mine in _saved(ws1).values()


def test_a_hint_path_with_a_space_pastes(demo):
    d = _two(demo)
    d["work"] = d["tmp"] / "my work"
    _run(d, "apply", check=0)
    d["write"](ml=("clean",), br=("bclean",))
    kill_at("journalled", *_args(d))
    (d["work"] / BR / "x y.txt").write_text("x\n")
    res = _run(d, "apply", check=1)
    hint = res.stderr.split("next: ", 1)[1]
    assert shlex.quote(str(d["work"] / BR)) in hint
    _paste(hint)
    res = _run(d, "apply", check=0)
    assert _saved(d["work"] / BR)
    notice = next(line for line in res.stderr.splitlines() if "refs/carry/saved/" in line)
    shown = subprocess.run(["sh", "-c", notice.split("`")[1]], capture_output=True, text=True, check=True)
    assert "x y.txt" in shown.stdout, shown.stdout  # the stash it kept shows the new file it holds


@pytest.mark.parametrize("stop", ["journalled", "swapping"])
def test_export_after_an_interrupted_first_apply_finishes_the_swap(demo, stop):
    d = _two(demo)
    kill_at(stop, *_args(d))
    assert not (d["work"] / ".carry" / "state.json").exists()
    res = _run(d, "export")
    assert res.returncode == 0, res.stderr
    assert "holds no workspace" not in res.stderr
    state = read_json(d["work"] / ".carry" / "state.json")
    assert sorted(state["upstreams"]) == [BR, ML]
    assert sorted(p.name for p in (d["work"] / ".carry").iterdir() if p.name != "kept") == ["lock", "state.json"] or \
        sorted(p.name for p in (d["work"] / ".carry").iterdir() if p.name != "kept") == ["state.json"]


def test_prove_after_an_interrupted_first_apply_finishes_the_swap(demo):
    d = _two(demo)
    proof = d["series"] / "proofs" / "test_alpha.py"
    proof.parent.mkdir()
    proof.write_text("import megatron.core.alpha as a\n\ndef test_patched():\n    assert a.value_5 == 'patched'\n")
    toml = d["series"] / "series.toml"
    toml.write_text(toml.read_text().replace(f'proof = "{NO_PROOF}"', 'proof = "proofs/test_alpha.py"', 1))
    kill_at("journalled", *_args(d))
    res = tool("prove", *_args(d, "prove"), "--only", "clean", "--cache", d["cache"])
    assert "holds no workspace" not in res.stderr, res.stderr
    assert (d["work"] / ".carry" / "state.json").exists(), res.stderr
    assert not (d["work"] / ".carry" / "journal.json").exists()


# -- --into: a killed run's journal never discards the checkout's edits (item 2) ------------------
def _into(demo: dict, target: Path, check: int | None = None):
    return tool("apply", "--series", demo["series"], "--workdir", demo["work"], "--cache", demo["cache"],
                "--into", f"{ML}={target}", check=check)


def _killed_into(demo: dict, tmp_path: Path) -> tuple[Path, str]:
    target = tmp_path / "checkout"
    git(tmp_path, "clone", "-q", str(demo["up"]), str(target))
    git(target, "checkout", "-q", demo["v0"])
    kill_at("staged", "--series", demo["series"], "--workdir", demo["work"], "--cache", demo["cache"],
            "--into", f"{ML}={target}")
    assert (Git(target).git_dir() / "carry-into-journal.json").exists()
    assert git(target, "rev-parse", "HEAD") != demo["v0"]  # the killed run's commits are in
    return target, git(target, "rev-parse", "HEAD")


def test_into_after_a_kill_refuses_uncommitted_edits_and_keeps_them(demo, tmp_path):
    target, _ = _killed_into(demo, tmp_path)
    (target / "README.md").write_text("my edit after the kill\n")
    (target / "mine.txt").write_text("mine\n")
    res = _into(demo, target, check=1)
    assert "uncommitted changes" in res.stderr and "README.md" in res.stderr, res.stderr
    assert (target / "README.md").read_text() == "my edit after the kill\n" and (target / "mine.txt").exists()
    _paste(res.stderr.split("next: ", 1)[1])
    _into(demo, target, check=0)
    assert "my edit after the kill" in git(target, "show", "stash@{0}:README.md")
    assert "mine" in git(target, "show", "stash@{0}^3:mine.txt")


def test_into_after_a_kill_keeps_a_commit_made_since(demo, tmp_path):
    target, _ = _killed_into(demo, tmp_path)
    (target / "mine.txt").write_text("mine\n")
    git(target, "add", "mine.txt")
    git(target, "commit", "-q", "-m", "my commit after the kill")
    mine = git(target, "rev-parse", "HEAD")
    res = _into(demo, target, check=0)
    assert "refs/carry/saved/" in res.stderr, res.stderr
    assert mine in _saved(target).values()


def test_into_leaves_a_git_am_of_the_users_alone(demo, tmp_path):
    target = tmp_path / "checkout"
    git(tmp_path, "clone", "-q", str(demo["up"]), str(target))
    git(target, "checkout", "-q", demo["v1"])
    failed = Git(target)("am", str(demo["series"] / ML / "0004-conflict.patch"), check=False)
    assert not failed.ok and (Git(target).git_dir() / "rebase-apply").exists()
    res = _into(demo, target, check=1)
    assert "git am" in res.stderr and "in progress" in res.stderr, res.stderr
    assert (Git(target).git_dir() / "rebase-apply").exists()


def test_a_folder_of_the_users_where_a_killed_swap_would_go_is_kept_by_the_pasted_hint(demo):
    """A swap killed after its journal; before the next run, a folder of the user's (no .git: not a
    workspace apply made) took the workspace's place. Finishing the swap would replace it: refused, nothing
    moved; the hint's --set-aside (every workspace, with the swap's trees) pasted as printed, then the
    command again, rebuild the workspaces, and the folder is in .carry/kept byte for byte."""
    d = _two(demo)
    _run(d, "apply", check=0)
    d["write"](ml=("clean",), br=("bclean",))
    kill_at("journalled", *_args(d))
    ws = d["work"] / BR
    shutil.rmtree(ws)
    ws.mkdir()
    (ws / "my notes.txt").write_text("mine, not the tool's\n")
    res = _run(d, "apply", check=1)
    assert "was not made by tools/apply.py" in res.stderr and "nothing was moved" in res.stderr, res.stderr
    assert (ws / "my notes.txt").read_text() == "mine, not the tool's\n"
    _paste(res.stderr.split("next: ", 1)[1])
    _run(d, "apply", check=0)
    kept = [p for p in (d["work"] / ".carry" / "kept").rglob("my notes.txt")]
    assert [p.read_text() for p in kept] == ["mine, not the tool's\n"], kept
    assert (d["work"] / BR / ".git").exists() and (d["work"] / ML / ".git").exists()


def test_a_tree_an_undone_first_swap_left_with_the_users_commit_is_kept_by_the_pasted_hint(demo):
    """A first apply killed between its renames, its staging lost since, and the user committed in the tree
    it moved in: the swap is undone, the tree left where it is (nothing of the user's removed) with no record
    that it is a workspace. Refused; the hint's --set-aside and apply, pasted as printed, rebuild the
    workspace, and the commit is in .carry/kept (before: "move it away", no command)."""
    d = _two(demo)
    kill_at("swapping", *_args(d))
    ws1 = d["work"] / ML
    mine = _amend(ws1, "amend in the tree the first swap moved in")
    for staging in (d["work"] / ".carry").glob("staging-*"):
        shutil.rmtree(staging)  # the rest of the swap cannot be finished: it is undone
    res = _run(d, "apply", check=1)
    assert "was not made by tools/apply.py" in res.stderr, res.stderr
    assert git(ws1, "rev-parse", "HEAD") == mine
    aside, rebuild = res.stderr.split("next: ", 1)[1].split("`")[1::2][:2]
    for cmd in (aside, rebuild):
        subprocess.run(["sh", "-c", cmd], check=True, capture_output=True, env=dict(os.environ))
    kept = [p for p in (d["work"] / ".carry" / "kept").iterdir() if (p / ".git").exists()]
    assert any(git(p, "cat-file", "-t", mine, check=False) == "commit" for p in kept), kept
    assert git(d["work"] / ML, "rev-parse", "HEAD") != mine
