"""Edits `git status` does not show stop a command like any other uncommitted edit.

A file whose index entry is marked assume-unchanged or skip-worktree is never read by git status,
git stash or git commit -a. Judged clean by git status alone, an --into checkout with such an
edit lost it with no copy anywhere: git am wrote over it (a patched file), `git reset --hard`
did (another --only; a failed run's rollback; a killed run's recovery). The same judgement
guarded a rebuild, the recovery of a swap and export. carry.workspace.userwork.uncommitted
compares each marked file with its index entry; a skip-worktree file that is absent (a sparse
checkout) is no edit. Real git, the demo series, each hint pasted as printed.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from carry.git import Git
from helpers import git, kill_at, sigint_at, tool

ML = "megatron-lm"
EDIT = "# my hidden edit\n"


def _into(demo: dict, target: Path, *extra: str, check: int | None = None) -> subprocess.CompletedProcess:
    return tool("apply", "--series", demo["series"], "--workdir", demo["work"], "--cache", demo["cache"],
                "--into", f"{ML}={target}", *extra, check=check)


def _checkout(demo: dict, tmp_path: Path) -> Path:
    target = tmp_path / "checkout"
    git(tmp_path, "clone", "-q", str(demo["up"]), str(target))
    git(target, "checkout", "-q", "-B", "main", demo["v0"])
    return target


def _hide_edit(repo: Path, rel: str, mark: str = "assume-unchanged") -> Path:
    git(repo, "update-index", f"--{mark}", rel)
    f = repo / rel
    f.write_text(f.read_text() + EDIT)
    assert git(repo, "status", "--porcelain") == ""  # what git status alone judged by
    return f


def _paste(stderr: str) -> None:
    """Every backticked command of the next: line, in order, as a user pastes them."""
    (line,) = [x for x in stderr.splitlines() if x.strip().startswith("next:")]
    for cmd in re.findall(r"`([^`]+)`", line):
        if "tools/" in cmd:
            break  # the rest is the run again, which the test does itself
        subprocess.run(["sh", "-c", cmd], check=True, capture_output=True, env=dict(os.environ))


@pytest.mark.parametrize("mark", ["assume-unchanged", "skip-worktree"])
def test_into_refuses_a_hidden_edit_of_a_patched_file_and_the_hint_keeps_it(demo, tmp_path, mark):
    target = _checkout(demo, tmp_path)
    f = _hide_edit(target, "megatron/core/alpha.py", mark)  # the 'clean' patch changes it
    res = _into(demo, target, check=1)
    assert "has uncommitted changes: megatron/core/alpha.py (marked " + mark in res.stderr, res.stderr
    assert f.read_text().endswith(EDIT) and git(target, "rev-parse", "HEAD") == demo["v0"]
    _paste(res.stderr)  # clear the mark, then stash
    _into(demo, target, check=0)
    assert git(target, "show", "stash@{0}:megatron/core/alpha.py").endswith(EDIT.strip())


def test_into_again_with_another_only_refuses_a_hidden_edit_of_an_unpatched_file(demo, tmp_path):
    target = _checkout(demo, tmp_path)
    _into(demo, target, check=0)
    head = git(target, "rev-parse", "HEAD")
    f = _hide_edit(target, "README.md")  # no patch touches it; the reset to the start would
    res = _into(demo, target, "--only", "clean", check=1)
    assert "uncommitted changes: README.md (marked assume-unchanged)" in res.stderr, res.stderr
    assert f.read_text().endswith(EDIT) and git(target, "rev-parse", "HEAD") == head


def test_a_failed_into_run_keeps_a_hidden_edit(demo, tmp_path):
    target = _checkout(demo, tmp_path)
    f = _hide_edit(target, "README.md")
    patch = demo["series"] / ML / "0001-clean.patch"
    patch.write_text(patch.read_text().replace("-value_5 = 5", "-value_5 = 555"))  # it fails: rolled back
    res = _into(demo, target, check=1)
    assert "uncommitted changes: README.md" in res.stderr, res.stderr
    assert f.read_text().endswith(EDIT) and git(target, "rev-parse", "HEAD") == demo["v0"]


def test_the_recovery_of_a_killed_into_run_keeps_a_hidden_edit(demo, tmp_path):
    target = _checkout(demo, tmp_path)
    kill_at("staged", "--series", demo["series"], "--workdir", demo["work"], "--cache", demo["cache"],
            "--into", f"{ML}={target}")
    journal = Git(target).git_dir() / "carry-into-journal.json"
    assert journal.exists()
    f = _hide_edit(target, "README.md", "skip-worktree")
    res = _into(demo, target, check=1)
    assert "uncommitted changes: README.md (marked skip-worktree)" in res.stderr and "killed" in res.stderr
    assert f.read_text().endswith(EDIT) and journal.exists()


def test_a_skip_worktree_file_a_sparse_checkout_left_out_is_no_edit(demo, tmp_path):
    target = _checkout(demo, tmp_path)
    git(target, "update-index", "--skip-worktree", "README.md")
    (target / "README.md").unlink()
    _into(demo, target, check=0)
    assert not (target / "README.md").exists()
    git(target, "update-index", "--assume-unchanged", "megatron/core/beta.py")  # marked, not edited
    _into(demo, target, "--only", "clean", check=0)


def test_an_absent_assume_unchanged_file_is_an_edit(demo, tmp_path):
    target = _checkout(demo, tmp_path)
    git(target, "update-index", "--assume-unchanged", "README.md")
    (target / "README.md").unlink()
    res = _into(demo, target, check=1)
    assert "uncommitted changes: README.md (marked assume-unchanged)" in res.stderr, res.stderr


def test_a_mode_change_hidden_by_a_mark_is_an_edit(demo, tmp_path):
    target = _checkout(demo, tmp_path)
    git(target, "update-index", "--assume-unchanged", "README.md")
    (target / "README.md").chmod(0o755)
    res = _into(demo, target, check=1)
    assert "uncommitted changes: README.md (marked assume-unchanged)" in res.stderr, res.stderr


def _apply(demo: dict, check: int | None = None) -> subprocess.CompletedProcess:
    return tool("apply", "--series", demo["series"], "--workdir", demo["work"], "--cache", demo["cache"],
                "--source", f"{ML}={demo['up']}", check=check)


def test_export_refuses_a_hidden_edit_and_the_hint_amends_it(demo, monkeypatch):
    for who in ("AUTHOR", "COMMITTER"):  # the person who pastes the amend has a git identity
        monkeypatch.setenv(f"GIT_{who}_NAME", "A Person")
        monkeypatch.setenv(f"GIT_{who}_EMAIL", "person@example.invalid")
    _apply(demo, check=0)
    ws = demo["work"] / ML
    _hide_edit(ws, "megatron/core/delta.py")  # the last patch's file
    res = tool("export", "--series", demo["series"], "--workdir", demo["work"], check=1)
    assert "uncommitted changes (megatron/core/delta.py (marked assume-unchanged)" in res.stderr, res.stderr
    _paste(res.stderr)  # clear the mark, then amend the last patch's commit
    tool("export", "--series", demo["series"], "--workdir", demo["work"], check=0)
    assert "+" + EDIT.strip() in (demo["series"] / ML / "0004-conflict.patch").read_text()


def test_the_recovery_of_a_swap_refuses_a_hidden_edit(demo):
    _apply(demo, check=0)
    demo["write_series"](demo["v0"], ids=("clean", "threeway"))
    rc, err = sigint_at("journalled", "--series", demo["series"], "--workdir", demo["work"], "--cache",
                        demo["cache"], "--source", f"{ML}={demo['up']}")
    assert rc == 130, err
    ws = demo["work"] / ML
    f = _hide_edit(ws, "README.md")
    res = _apply(demo, check=1)
    assert "uncommitted changes (README.md (marked assume-unchanged))" in res.stderr, res.stderr
    assert f.read_text().endswith(EDIT) and (demo["work"] / ".carry" / "journal.json").exists()


# A name git would read back otherwise were it given as a line (`hash-object --stdin-paths`
# C-unquotes one that starts with a double quote: '"notes"' was hashed as notes, and a missing
# notes stopped every check); each is given to git as an argument after --, read with -z.
@pytest.mark.parametrize("name, twin", [('"notes"', "notes"), ('"x".txt', None), ("-n", None),
                                        ("back\\slash", None), ("new\nline", None), (os.fsdecode(b"\xffbyte"), None)])
def test_a_hidden_edit_of_a_file_with_any_name_is_an_edit(demo, tmp_path, name, twin):
    target = _checkout(demo, tmp_path)
    for n in filter(None, (name, twin)):
        (target / n).write_text("orig\n")  # the twin: what the quoted name reads as once unquoted
    git(target, "add", "-A")
    git(target, "commit", "-q", "-m", "my notes")
    git(target, "update-index", "--assume-unchanged", "--", name)
    (target / name).write_text("orig\n" + EDIT)
    res = _into(demo, target, check=1)
    assert "uncommitted changes: " in res.stderr and "(marked assume-unchanged)" in res.stderr, res.stderr
    assert (target / name).read_text() == "orig\n" + EDIT


def test_an_unedited_marked_file_of_a_checkout_that_converts_line_endings_is_no_edit(demo, tmp_path):
    """A checkout whose own config converts line endings (core.autocrlf): an unedited marked file holds
    CRLF where its blob holds LF, as git add would make it. Hashed under the tool's byte-exact config, it
    read as an edit and refused a clean checkout; it is hashed as the user's git add would. An edit of it
    is still one."""
    target = _checkout(demo, tmp_path)
    mine = Git(target).as_user  # the user's own git, which converts as the checkout's config says
    git(target, "config", "core.autocrlf", "true")
    f = target / "notes.txt"
    f.write_bytes(b"one\r\ntwo\r\n")
    mine("add", "notes.txt")
    mine("-c", "user.name=u", "-c", "user.email=u@example.com", "commit", "-qm", "notes")
    assert git(target, "show", "HEAD:notes.txt") == "one\ntwo"  # LF in the blob
    mine("update-index", "--assume-unchanged", "notes.txt")
    f.write_bytes(b"one\r\ntwo\r\nthree\r\n")
    res = _into(demo, target, check=1)  # an edit: refused
    assert "uncommitted changes: notes.txt (marked assume-unchanged)" in res.stderr, res.stderr
    f.write_bytes(b"one\r\ntwo\r\n")  # as checked out: no edit
    _into(demo, target, check=0)


def test_a_clean_checkout_whose_git_writes_crlf_is_clean_and_an_edit_there_still_stops_the_run(demo, tmp_path):
    """A checkout cloned with core.autocrlf=true holds every text file with CRLF where its blobs hold LF: the user's
    git status is clean. Read under the tool's byte-exact config, every file was an edit, and the run refused a
    clean checkout with a hint that does nothing (`git stash push -u` has no local changes to save). The checkout's
    edits are what the user's own git status shows: the clean one is applied onto, and a real edit is still
    refused and kept."""
    target = tmp_path / "checkout"
    subprocess.run(["git", "clone", "-q", "-c", "core.autocrlf=true", str(demo["up"]), str(target)], check=True)
    mine = Git(target).as_user  # the user's own git: it converts as the checkout's config says
    mine("checkout", "-q", "-B", "main", demo["v0"])
    f = target / "megatron" / "core" / "alpha.py"
    assert b"\r\n" in f.read_bytes() and mine("status", "--porcelain").stdout == ""
    edited = f.read_bytes() + EDIT.replace("\n", "\r\n").encode()
    f.write_bytes(edited)
    res = _into(demo, target, check=1)
    assert re.search(r"uncommitted changes: megatron/core/alpha\.py$", res.stderr, re.M), res.stderr
    assert f.read_bytes() == edited
    _paste(res.stderr)   # the hint as printed: the stash takes the edit, and the run goes on
    assert b"my hidden edit" in mine("stash", "show", "-p", binary=True).stdout
    _into(demo, target, check=0)
    assert mine("status", "--porcelain").stdout == ""
    assert git(target, "rev-parse", "HEAD") != git(target, "rev-parse", demo["v0"])   # applied onto


def test_an_untracked_file_is_named_as_it_is_whatever_its_name(demo, tmp_path):
    """git status names a path with a quote, a backslash or a newline C-quoted on its line; read with -z,
    the refusal names the file the user has, byte for byte."""
    target = _checkout(demo, tmp_path)
    name = 'my "draft"\\notes.txt'
    (target / name).write_text("mine\n")
    res = _into(demo, target, check=1)
    assert f"uncommitted changes: {name}" in res.stderr, res.stderr
    assert (target / name).read_text() == "mine\n"
