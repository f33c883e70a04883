"""Every ``next:`` hint that names a command is run, as written, and does what it says.

Each test makes a command fail one way, takes the commands out of its ``next:`` line (they
are in backticks), runs them in a shell from the directory the user was in, and checks the
result: usually that the first command now succeeds. Each is a whole command (never a bare
`--flag`): "run the command again with ..." is the command the user ran, with their own options.
Placeholders a person must fill in (PATH, FILES, VERSION) are filled in, quoted, the way the hint
describes.

Every path here holds what a shell would read: the demo lives under a folder with a space, a
quote, a `$`, an `&` and a leading `-` in its name (carry.shell quotes them), so a hint that
pastes a path unquoted fails or touches another path.

The demo series here pins its upstream by a file:// URL, so apply finds it without --source,
as the real series finds NeMo-RL on the network; the tools run from a scratch directory, so
the hints must name them by a path that works from there. The one hint not run is the Docker
engine's (it installs and starts dockerd as root).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time

import pytest

from carry.git import Git
from fakeup import edit, write
from helpers import TOOLS, git, read_json


# ($1, not $HOME: pytest expands $NAME in the proofs' --rootdir, a path bug of prove's own, not a hint's)
NASTY = "-x with space/it's $1 & more"


@pytest.fixture
def d(tmp_path, monkeypatch, demo_made):
    from fakeup import copy_demo

    root = tmp_path / NASTY
    root.mkdir(parents=True)
    demo = copy_demo(demo_made, root)
    # The person who runs the hints has a git identity (HOME is isolated here, without one).
    for who in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{who}_NAME", "A Person")
        monkeypatch.setenv(f"GIT_{who}_EMAIL", "person@example.invalid")
    url = f"file://{demo['up']}"

    def write_series(commit, ids=("clean", "threeway", "upstreamed", "conflict")):
        sdir = demo["write_series"](commit, ids)
        toml = sdir / "series.toml"
        toml.write_text(toml.read_text().replace("https://example.invalid/upstream.git", url))
        return sdir

    write_series(demo["v0"])
    cwd = root / "here"
    cwd.mkdir()
    return dict(demo, write_series=write_series, cwd=cwd, ws=demo["work"] / "megatron-lm")


def run(d, name, *args, check=None, env=None) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(TOOLS / f"{name}.py"), *map(str, args)], cwd=d["cwd"],
                          env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=900)
    if check is not None:
        assert proc.returncode == check, f"{name} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    proc.argv = [sys.executable, str(TOOLS / f"{name}.py"), *map(str, args)]
    return proc


def apply(d, *args, check=None):
    return run(d, "apply", "--series", d["series"], "--workdir", d["work"], *args, check=check)


def hints(proc) -> list[str]:
    lines = [line.strip() for line in proc.stderr.splitlines() if line.strip().startswith("next:")]
    assert lines, f"no next: line in\n{proc.stderr}"
    found = re.findall(r"`([^`]+)`", lines[-1])
    assert found, lines[-1]
    for cmd in found:  # a whole command, one line, that a shell parses
        assert not cmd.startswith("-") and "\n" not in cmd, cmd
        assert subprocess.run(["bash", "-n", "-c", cmd]).returncode == 0, cmd
    return found


def words(cmd: str) -> list[str]:
    """The words a shell makes of a simple command (bash: carry.shell may write $'...')."""
    out = subprocess.run(["bash", "-c", f"printf '%s\\0' {cmd}"], capture_output=True, text=True, check=True).stdout
    return out.split("\0")[:-1]


def sh(d, cmd: str, failed=None, check=0, **fill) -> subprocess.CompletedProcess:
    """Run one hint as written, its placeholders filled (each value quoted, as a person would)."""
    for key, value in fill.items():
        cmd = re.sub(rf"\b{key}\b", lambda _: shlex.quote(str(value)), cmd)
    proc = subprocess.run(["bash", "-c", cmd], cwd=d["cwd"], capture_output=True, text=True, timeout=900)
    if check is not None:
        assert proc.returncode == check, f"`{cmd}` exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def statuses(d, *args):
    out = d["tmp"] / "s.json"
    apply(d, *args, "--json", out, check=0)
    return {p["id"]: p["status"] for u in read_json(out)["upstreams"] for p in u["patches"]}


# -- apply ----------------------------------------------------------------------------------
def test_amended_patch_commit_export_then_apply(d):
    apply(d, check=0)
    write(d["ws"], "megatron/core/delta.py", (d["ws"] / "megatron/core/delta.py").read_text() + "extra = 1\n")
    git(d["ws"], "commit", "-q", "-a", "--amend", "--no-edit")
    failed = apply(d, check=1)
    assert "commits the series does not know" in failed.stderr
    export, aside, rebuild = hints(failed)
    assert "tools/export.py --series" in export and "--set-aside megatron-lm" in aside and "tools/apply.py" in rebuild
    sh(d, export)
    assert "+extra = 1" in (d["series"] / "megatron-lm/0004-conflict.patch").read_text()
    assert set(statuses(d).values()) == {"already-applied"}
    # The record names the commits export wrote from, not the ones before the amend: prove and
    # bisect extract a patch's tree from its recorded commit (before: the pre-amend commit, so
    # prove would have tested the code as it was before the fix).
    (rec,) = read_json(d["work"] / ".carry" / "state.json")["upstreams"].values()
    base = rec["base_commit"]
    in_workspace = Git(d["ws"]).rev_list(f"{base}..HEAD")
    assert [p["commit"] for p in rec["patches"]] == in_workspace, (rec["patches"], in_workspace)


def test_unknown_commit_set_aside_then_rebuilt(d):
    apply(d, check=0)
    git(d["ws"], "commit", "-q", "--allow-empty", "-m", "mine")
    mine = git(d["ws"], "rev-parse", "HEAD")
    _, aside, rebuild = hints(apply(d, check=1))
    sh(d, aside)
    sh(d, rebuild)
    assert set(statuses(d).values()) == {"already-applied"}
    (kept,) = (d["work"] / ".carry" / "kept").iterdir()  # dropped from the workspace, never lost
    assert git(kept, "log", "-1", "--format=%H") == mine


def test_the_discard_hint_after_apply_ran_inside_a_workspace_does_not_loop(d):
    """apply run from inside a workspace with a relative --workdir leaves a work directory (git
    repositories) nested in it: the discard hints set the workspace aside whole, nested
    repository and all, and rebuild it; the next apply succeeds, not the same hint again."""
    apply(d, check=0)
    inside = subprocess.run([sys.executable, str(TOOLS / "apply.py"), "--series", str(d["series"]),
                             "--workdir", "work"], cwd=d["ws"], capture_output=True, text=True, timeout=900)
    assert inside.returncode == 0, inside.stderr
    assert (d["ws"] / "work" / "megatron-lm" / ".git").exists()
    failed = apply(d, check=1)
    *_, aside, rebuild = hints(failed)
    sh(d, aside)
    sh(d, rebuild)
    assert not (d["ws"] / "work").exists()
    assert list((d["work"] / ".carry" / "kept").glob("megatron-lm-*/work/megatron-lm/.git"))
    apply(d, check=0)


def test_uncommitted_changes_amend_export_or_discard(d):
    apply(d, check=0)
    alpha = d["ws"] / "megatron/core/alpha.py"
    alpha.write_text(alpha.read_text() + "more = 2\n")
    amend, export, aside, rebuild = hints(apply(d, check=1))
    assert "--amend --no-edit" in amend and "tools/export.py" in export
    assert "--set-aside megatron-lm" in aside and "tools/apply.py" in rebuild
    sh(d, amend)
    sh(d, export)
    assert "+more = 2" in (d["series"] / "megatron-lm/0004-conflict.patch").read_text()
    assert set(statuses(d).values()) == {"already-applied"}
    alpha.write_text("scribbled\n")
    (d["ws"] / "new.txt").write_text("new\n")
    *_, aside, rebuild = hints(apply(d, check=1))
    sh(d, aside)
    sh(d, rebuild)
    assert "scribbled" not in alpha.read_text() and not (d["ws"] / "new.txt").exists()
    assert set(statuses(d).values()) == {"already-applied"}
    (kept,) = (d["work"] / ".carry" / "kept").iterdir()  # discarded from the workspace, kept whole
    assert (kept / "megatron/core/alpha.py").read_text() == "scribbled\n" and (kept / "new.txt").exists()


@pytest.mark.parametrize("verb", ["apply", "export"])
def test_an_untracked_file_is_amended_in_as_the_hint_says(d, verb):
    """A new file in the workspace: the hint that commits it into the last patch adds it (before,
    `git commit -a --amend` left it untracked, and export refused again with the same hint)."""
    apply(d, check=0)
    (d["ws"] / "megatron/core/brand_new.py").write_text("brand_new = 1\n")
    if verb == "apply":
        amend, *_ = hints(apply(d, check=1))
    else:
        (amend,) = hints(run(d, "export", "--series", d["series"], "--workdir", d["work"], check=1))
    sh(d, amend)
    assert git(d["ws"], "status", "--porcelain") == ""
    run(d, "export", "--series", d["series"], "--workdir", d["work"], check=0)
    assert "+brand_new = 1" in (d["series"] / "megatron-lm/0004-conflict.patch").read_text()
    assert set(statuses(d).values()) == {"already-applied"}


def test_the_rebuild_hint_keeps_the_users_only(d):
    """The set-aside hint's apply rebuilds what the user selected, not the whole series (offline, the
    whole series may need an upstream this machine cannot fetch)."""
    apply(d, "--only", "clean", check=0)
    (d["ws"] / "mine.txt").write_text("mine\n")
    failed = apply(d, "--only", "clean", check=1)
    *_, aside, rebuild = hints(failed)
    assert words(rebuild)[-2:] == ["--only", "clean"], rebuild
    sh(d, aside)
    sh(d, rebuild)
    (rec,) = read_json(d["work"] / ".carry" / "state.json")["upstreams"].values()
    assert rec["selected"] == ["clean"]


def test_what_a_rebuild_kept_gets_a_hint_that_fits_it(d):
    """Only a branch's history is reset to: a notes ref, a stash, a tag the rebuild kept as
    refs/carry/saved/* each get their own way back, and pasting every hint leaves the branch as it is."""
    apply(d, check=0)
    ws = d["ws"]
    git(ws, "notes", "add", "-m", "review note", "HEAD")
    old_head = git(ws, "rev-parse", "HEAD")
    alpha = ws / "megatron/core/alpha.py"
    alpha.write_text(alpha.read_text() + "stashed = 1\n")
    git(ws, "stash", "push", "-q", "-m", "mine")
    git(ws, "checkout", "-q", "--detach")
    git(ws, "commit", "-q", "--allow-empty", "-m", "tagged")
    git(ws, "tag", "mine")
    git(ws, "checkout", "-q", "main")
    res = apply(d, "--only", "clean", check=0)  # another selection: a rebuild
    lines = {re.search(r"\(the old (\S+)\)", x)[1]: x for x in res.stdout.splitlines() if "refs/carry/saved/" in x}
    assert set(lines) == {"refs/notes/commits", "refs/stash", "refs/tags/mine"}, res.stdout
    head, files = git(ws, "rev-parse", "HEAD"), git(ws, "ls-files")
    for line in lines.values():
        assert "reset" not in line, line
        for cmd in re.findall(r"`([^`]+)`", line):
            sh(d, cmd)
    assert git(ws, "rev-parse", "HEAD") == head and git(ws, "ls-files") == files
    assert git(ws, "notes", "show", old_head) == "review note"
    assert "stashed = 1" in git(ws, "show", "stash@{0}:megatron/core/alpha.py")
    assert git(ws, "log", "-1", "--format=%s", "mine") == "tagged"


def test_missing_patch_file_names_lint(d):
    (d["series"] / "megatron-lm/0002-threeway.patch").unlink()
    (lint,) = hints(apply(d, check=2))
    res = sh(d, lint, check=1)
    assert "patch file megatron-lm/0002-threeway.patch does not exist" in res.stderr


def test_conflict_hint_starts_the_rebase(d):
    apply(d, check=0)
    d["write_series"](d["v1"])
    failed = apply(d, check=1)
    assert "at " in failed.stdout and "(unchanged)" in failed.stdout
    (rebase,) = hints(failed)
    assert f"--onto megatron-lm={d['v1']}" in rebase
    res = sh(d, rebase, check=1)  # it stops at the conflict, for a person, as the hint says
    ws = d["cwd"] / "rebase-work" / "megatron-lm"
    assert (Git(ws).git_dir() / "rebase-apply").exists()
    assert "delta.py" in git(ws, "diff", "--name-only", "--diff-filter=U")
    assert ["git", "-C", str(ws), "am", "--continue"] in [words(c) for c in re.findall(r"`([^`]+)`", res.stderr)]


def test_dirty_into_target_stash(d, tmp_path):
    target = tmp_path / "checkout"
    git(tmp_path, "clone", "-q", str(d["up"]), str(target))
    git(target, "checkout", "-q", d["v0"])
    (target / "README.md").write_text("mine\n")
    failed = apply(d, "--into", f"megatron-lm={target}", check=1)
    (stash,) = hints(failed)
    sh(d, stash)
    apply(d, "--into", f"megatron-lm={target}", check=0)
    assert git(target, "stash", "list")


def test_unreadable_into_record_removed(d, tmp_path):
    target = tmp_path / "checkout"
    git(tmp_path, "clone", "-q", str(d["up"]), str(target))
    git(target, "checkout", "-q", d["v0"])
    apply(d, "--into", f"megatron-lm={target}", check=0)
    (Git(target).git_dir() / "carry-state.json").write_text("{")
    rm, log = hints(apply(d, "--into", f"megatron-lm={target}", check=1))
    assert "demo: conflict change" in sh(d, log).stdout
    sh(d, rm)
    apply(d, "--into", f"megatron-lm={target}", check=0)


def test_unreachable_source_then_again_with_source(d):
    toml = d["series"] / "series.toml"
    toml.write_text(toml.read_text().replace(f"file://{d['up']}", f"file://{d['tmp']}/nowhere"))
    failed = apply(d, "--cache", d["cache"], check=1)
    (again,) = hints(failed)
    assert "tools/apply.py" in again and again.endswith("--source megatron-lm=PATH")
    assert words(again)[2:] == ["--series", str(d["series"]), "--workdir", str(d["work"]),
                                      "--cache", str(d["cache"]), "--source", "megatron-lm=PATH"]
    sh(d, again, failed, PATH=d["up"])
    assert (d["ws"] / "megatron/core/alpha.py").exists()


def test_checkout_without_the_pinned_commit_fetches_it(d, tmp_path):
    checkout = tmp_path / "old-checkout"
    git(tmp_path, "clone", "-q", str(d["up"]), str(checkout))
    git(checkout, "reset", "-q", "--hard", d["v0"])
    edit(d["up"], "megatron/core/alpha.py", 30, "value_30 = 'v2'\n")
    v2 = Git(d["up"]).commit_all("upstream v2")
    d["write_series"](v2, ids=("clean",))
    git(checkout, "update-ref", "-d", "refs/remotes/origin/main")
    git(checkout, "reflog", "expire", "--expire=now", "--all")
    git(checkout, "gc", "-q", "--prune=now")
    failed = apply(d, "--source", f"megatron-lm={checkout}", check=2)  # bad input: not a checkout of the pin
    fetch, again = hints(failed)
    assert words(fetch) == ["git", "-C", str(checkout), "fetch", f"file://{d['up']}", v2]
    sh(d, fetch)
    sh(d, again)
    assert git(d["ws"], "log", "-1", "--format=%s", "carry-base") == "upstream v2"


def test_missing_source_checkout_is_cloned_where_it_was_named(d):
    checkout = d["tmp"] / "my checkout's $1"
    clone, again = hints(apply(d, "--source", f"megatron-lm={checkout}", check=2))
    sh(d, clone)
    sh(d, again)
    assert (d["ws"] / "megatron/core/alpha.py").exists() and (checkout / ".git").is_dir()


def test_checkout_of_another_user_trusted_as_the_hint_says(d, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("needs root to give the checkout to another user")
    import shutil

    theirs = d["tmp"] / "their checkout's $1"
    shutil.copytree(d["up"], theirs)
    for top, dirs, files in os.walk(theirs):
        for name in dirs + files:
            os.lchown(os.path.join(top, name), 65534, 65534)
    os.chown(theirs, 65534, 65534)
    cfg = d["tmp"] / "gitconfig"
    cfg.write_text("")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(cfg))  # the person's own git config, where the hint writes
    (trust,) = hints(apply(d, "--source", f"megatron-lm={theirs}", check=2))
    sh(d, trust)
    apply(d, "--source", f"megatron-lm={theirs}", check=0)


def test_checkout_whose_origin_lacks_the_pin_fetches_from_the_pins_url(d, tmp_path):
    """`git fetch origin PIN` fails where origin does not have the pin (a clone of an old clone):
    the hint fetches from the URL the series pins."""
    old = tmp_path / "old-clone"
    git(tmp_path, "clone", "-q", str(d["up"]), str(old))
    checkout = tmp_path / "clone of the old clone"
    git(tmp_path, "clone", "-q", str(old), str(checkout))
    edit(d["up"], "megatron/core/alpha.py", 30, "value_30 = 'v2'\n")
    v2 = Git(d["up"]).commit_all("upstream v2")
    d["write_series"](v2, ids=("clean",))
    assert sh(d, shlex.join(["git", "-C", str(checkout), "fetch", "origin", v2]), check=None).returncode != 0
    fetch, again = hints(apply(d, "--source", f"megatron-lm={checkout}", check=2))
    sh(d, fetch)
    sh(d, again)


def test_locked_then_again_with_more_time(d):
    from carry.lock import DirLock

    lock = DirLock(d["work"] / ".carry" / "lock")
    lock.__enter__()
    try:
        failed = apply(d, "--lock-timeout", "0.2", check=1)
    finally:
        threading.Timer(2.0, lock.__exit__).start()
    (again,) = hints(failed)
    assert words(again)[2:] == ["--series", str(d["series"]), "--workdir", str(d["work"]),
                                      "--lock-timeout", "600"]
    t0 = time.monotonic()
    sh(d, again)
    assert time.monotonic() - t0 >= 1.0  # it waited for the lock, then ran


@pytest.mark.parametrize("broken", ["state.json", "journal.json"])
def test_unreadable_record_set_aside_and_applied_again(d, broken):
    apply(d, check=0)
    (d["work"] / ".carry" / broken).write_text("{")
    (aside, again) = hints(apply(d, "--cache", d["cache"], check=1))
    assert words(aside)[1].endswith("tools/kept.py") and words(aside)[2:] == ["--workdir", str(d["work"]), "--set-aside"]
    sh(d, aside)
    assert d["up"].exists() and d["series"].exists()
    assert list((d["work"] / ".carry" / "kept").glob("megatron-lm-*/megatron/core/alpha.py"))
    sh(d, again)
    assert "--cache" in again and set(statuses(d).values()) == {"already-applied"}


@pytest.mark.parametrize("only, fixed", [("claen", "clean"), ("threeway,zzz-nothing-like-it", "threeway")])
def test_unknown_only_lists_the_ids_and_names_the_fixed_command(d, only, fixed):
    failed = apply(d, "--cache", d["cache"], "--only", only, check=2)
    assert "its patches: clean, threeway, upstreamed, conflict; its upstreams: megatron-lm" in failed.stderr
    (again,) = hints(failed)
    assert words(again)[-4:] == ["--only", fixed, "--cache", str(d["cache"])] or \
        words(again)[-2:] == ["--only", fixed], again
    assert "--cache" in again
    sh(d, again)
    assert statuses(d, "--only", fixed)[fixed] == "already-applied"


def test_a_folder_where_a_file_must_be_is_moved_aside(d):
    """EISDIR (carry.errors.from_os_error): the hint's `mv` takes the odd path as one word."""
    import errno

    from carry.errors import from_os_error

    where = d["tmp"] / "report it's $HOME.json"
    where.mkdir()
    (d["tmp"] / "report").mkdir()  # what an unquoted `mv` would move
    (mv,) = re.findall(r"`([^`]+)`", from_os_error(IsADirectoryError(errno.EISDIR, "Is a directory", str(where))).hint)
    sh(d, mv)
    assert not where.exists() and (d["tmp"] / "report it's $HOME.json.moved").is_dir()
    assert (d["tmp"] / "report").is_dir()


@pytest.mark.parametrize("name", ["work\nwith a newline", "work `with` backticks", "work \\ back'slash"])
def test_set_aside_hint_of_an_odd_work_directory_keeps_that_directory(d, name):
    """A newline, a backtick, a backslash: the hint stays one line and sets aside what it names."""
    work = d["tmp"] / name
    sibling = d["tmp"] / "work"  # what an unquoted --workdir of the first word would name
    sibling.mkdir(exist_ok=True)
    (sibling / "keep").write_text("mine\n")
    run(d, "apply", "--series", d["series"], "--workdir", work, check=0)
    (work / ".carry" / "state.json").write_text("{")
    aside, again = hints(run(d, "apply", "--series", d["series"], "--workdir", work, check=1))
    sh(d, aside)
    assert not (work / "megatron-lm").exists() and list((work / ".carry" / "kept").glob("megatron-lm-*/.git"))
    assert sorted(p.name for p in sibling.iterdir()) == ["keep"] and (sibling / "keep").read_text() == "mine\n"
    sh(d, again)
    assert (work / "megatron-lm" / "megatron/core/alpha.py").exists()


def test_broken_requires_names_lint(d):
    toml = d["series"] / "series.toml"
    toml.write_text(toml.read_text().replace('id = "clean"', 'id = "clean"\nrequires = ["claen"]'))
    failed = apply(d, check=2)
    assert "requires unknown patch 'claen' (did you mean 'clean'?)" in failed.stderr
    (lint,) = hints(failed)
    res = sh(d, lint, check=2)  # broken requires: bad configuration (README, "Exit codes")
    assert "requires unknown patch 'claen'" in res.stderr


# -- export ---------------------------------------------------------------------------------
def test_export_without_a_workspace_applies_first(d):
    failed = run(d, "export", "--series", d["series"], "--workdir", d["work"], check=2)
    (apply_cmd,) = hints(failed)
    sh(d, apply_cmd)
    run(d, "export", "--series", d["series"], "--workdir", d["work"], "--check", check=0)


def test_export_of_a_dirty_workspace_amends(d):
    apply(d, check=0)
    delta = d["ws"] / "megatron/core/delta.py"
    delta.write_text(delta.read_text() + "tail = 3\n")
    (amend,) = hints(run(d, "export", "--series", d["series"], "--workdir", d["work"], check=1))
    sh(d, amend)
    run(d, "export", "--series", d["series"], "--workdir", d["work"], check=0)
    assert "+tail = 3" in (d["series"] / "megatron-lm/0004-conflict.patch").read_text()


def test_export_with_a_fixup_commit_autosquashes(d):
    apply(d, check=0)
    beta = d["ws"] / "megatron/core/beta.py"
    beta.write_text(beta.read_text() + "fixed_up = 4\n")
    target = git(d["ws"], "log", "--format=%H", "-1", "--grep=threeway")
    git(d["ws"], "commit", "-q", "-a", f"--fixup={target}")
    (squash,) = hints(run(d, "export", "--series", d["series"], "--workdir", d["work"], check=2))
    assert squash.startswith("GIT_SEQUENCE_EDITOR=: git -C")
    sh(d, squash)
    run(d, "export", "--series", d["series"], "--workdir", d["work"], check=0)
    assert "+fixed_up = 4" in (d["series"] / "megatron-lm/0002-threeway.patch").read_text()
    assert set(statuses(d).values()) == {"already-applied"}


def _hand_edit(patch) -> bytes:
    """A patch file improved by hand (a line of explanation in its message), not applied yet."""
    data = patch.read_bytes()
    head, sep, body = data.partition(b"\n\n")
    patch.write_bytes(head + sep + b"MY HAND-WRITTEN EXPLANATION\n\n" + body)
    return patch.read_bytes()


@pytest.mark.parametrize("keep", ["mine", "the workspace's"])
def test_export_never_replaces_a_patch_file_edited_by_hand(d, keep):
    """A patch file edited since apply read it: export stops, writes nothing, and names both ways on,
    each of which works pasted as printed (before: "1 written", the edit gone, no copy anywhere)."""
    apply(d, check=0)
    patch, last = d["series"] / "megatron-lm/0001-clean.patch", d["series"] / "megatron-lm/0004-conflict.patch"
    others = {p: p.read_bytes() for p in (d["series"] / "megatron-lm").iterdir() if p != patch}
    if keep != "mine":  # the last patch's commit amended too: that file, not edited, is not written either
        _amend_delta(d, "from the workspace")
    mine = _hand_edit(patch)
    state = (d["work"] / ".carry" / "state.json").read_bytes()
    failed = run(d, "export", "--series", d["series"], "--workdir", d["work"], check=1)
    assert str(patch) in failed.stderr and "nothing was written" in failed.stderr
    assert patch.read_bytes() == mine and {p: p.read_bytes() for p in others} == others
    assert (d["work"] / ".carry" / "state.json").read_bytes() == state
    rebuild, replace = hints(failed)
    if keep == "mine":
        sh(d, rebuild)
        run(d, "export", "--series", d["series"], "--workdir", d["work"], check=0)
        assert b"MY HAND-WRITTEN EXPLANATION" in patch.read_bytes()
    else:
        done = sh(d, replace)
        assert b"MY HAND-WRITTEN" not in patch.read_bytes() and "from the workspace" in last.read_text()
        (copy,) = [p for p in (d["work"] / ".carry" / "replaced").rglob("*") if p.is_file()]
        assert copy.read_bytes() == mine and str(copy) in done.stderr
    run(d, "export", "--series", d["series"], "--workdir", d["work"], "--check", check=0)


def _amend_delta(d, text: str) -> None:
    edit(d["ws"], "megatron/core/delta.py", 30, f"value_30 = {text!r}\n")
    git(d["ws"], "commit", "-q", "-a", "--amend", "--no-edit")


def test_export_replaces_any_version_it_wrote_itself(d):
    """A file back at an earlier export's bytes (a discarded export, `git checkout patches/`) holds
    nothing the workspace did not make: export replaces it without a word, as the file apply read."""
    apply(d, check=0)
    patch = d["series"] / "megatron-lm/0004-conflict.patch"
    applied = patch.read_bytes()
    _amend_delta(d, "first")
    run(d, "export", "--series", d["series"], "--workdir", d["work"], check=0)
    first = patch.read_bytes()
    _amend_delta(d, "second")
    run(d, "export", "--series", d["series"], "--workdir", d["work"], check=0)
    patch.write_bytes(first)  # the second export discarded
    _amend_delta(d, "third")
    run(d, "export", "--series", d["series"], "--workdir", d["work"], check=0)
    assert "value_30 = 'third'" in patch.read_text()
    patch.write_bytes(applied)  # every export discarded: the file apply read
    _amend_delta(d, "fourth")
    run(d, "export", "--series", d["series"], "--workdir", d["work"], check=0)
    assert "value_30 = 'fourth'" in patch.read_text() and not (d["work"] / ".carry" / "replaced").exists()


def test_export_never_replaces_a_file_a_new_entry_names_that_it_did_not_write(d):
    """A [[patches]] entry added for a new commit, its file drafted by hand first: export read it
    never, wrote it never (before: the other files as recorded "vouched" for it, and the draft was
    written over with no copy). It stops like any edited file, and its way past keeps a copy."""
    apply(d, check=0)
    edit(d["ws"], "megatron/core/delta.py", 30, "value_30 = 'my new patch'\n")
    git(d["ws"], "commit", "-q", "-a", "-m", "my new patch")
    toml = d["series"] / "series.toml"
    toml.write_text(toml.read_text() + '\n[[patches]]\nid = "mine"\nupstream = "megatron-lm"\ntitle = "my new patch"\n'
                    'file = "megatron-lm/0005-mine.patch"\nstatus = "pending"\nowner = "me"\nwhy = "a draft"\n'
                    'retire_when = "never"\nproof = "none: a draft"\n')
    draft = d["series"] / "megatron-lm/0005-mine.patch"
    draft.write_bytes(b"MY HAND-DRAFTED PATCH\n")
    failed = run(d, "export", "--series", d["series"], "--workdir", d["work"], check=1)
    assert str(draft) in failed.stderr and "nothing was written" in failed.stderr
    assert draft.read_bytes() == b"MY HAND-DRAFTED PATCH\n"
    (_, replace) = hints(failed)
    done = sh(d, replace)
    assert "my new patch" in draft.read_text()
    (copy,) = [p for p in (d["work"] / ".carry" / "replaced").rglob("*") if p.is_file()]
    assert copy.read_bytes() == b"MY HAND-DRAFTED PATCH\n" and str(copy) in done.stderr


@pytest.mark.parametrize("hand_edit", [False, True])
def test_a_record_without_file_hashes_is_vouched_for_by_its_digest(d, hand_edit):
    """A workspace applied before each file's hash was recorded: its digest (of all the files) says
    whether they are as apply left them; an amend exports as before, a hand edit stops it."""
    apply(d, check=0)
    state = d["work"] / ".carry" / "state.json"
    doc = read_json(state)
    for rec in doc["upstreams"].values():
        for p in rec["patches"]:
            del p["hashes"]
    state.write_text(json.dumps(doc))
    patch = d["series"] / "megatron-lm/0004-conflict.patch"
    _amend_delta(d, "amended")
    if hand_edit:
        mine = _hand_edit(patch)
        run(d, "export", "--series", d["series"], "--workdir", d["work"], check=1)
        assert patch.read_bytes() == mine
    else:
        run(d, "export", "--series", d["series"], "--workdir", d["work"], check=0)
        assert "value_30 = 'amended'" in patch.read_text()


def test_export_check_drift_exports(d):
    apply(d, check=0)
    git(d["ws"], "commit", "-q", "--amend", "-m", "demo: conflict change, reworded")
    failed = run(d, "export", "--series", d["series"], "--workdir", d["work"], "--check", check=1)
    export, _ = hints(failed)
    sh(d, export)
    run(d, "export", "--series", d["series"], "--workdir", d["work"], "--check", check=0)


def test_a_discarded_export_is_dropped_from_the_workspace_too(d):
    """Exported, then the written file thrown away (`git checkout patches/`): export --check's
    hint names how to drop the workspace's change as well, not only how to write it back."""
    apply(d, check=0)
    patch = d["series"] / "megatron-lm/0004-conflict.patch"
    before = patch.read_bytes()
    edit(d["ws"], "megatron/core/delta.py", 30, "value_30 = 'an edit to throw away'\n")
    git(d["ws"], "commit", "-q", "-a", "--amend", "--no-edit")
    run(d, "export", "--series", d["series"], "--workdir", d["work"], check=0)
    patch.write_bytes(before)  # the export discarded
    failed = run(d, "export", "--series", d["series"], "--workdir", d["work"], "--check", check=1)
    assert "to drop it and go back to the patch files" in failed.stderr
    _, drop = hints(failed)
    assert "tools/apply.py" in drop
    sh(d, drop)
    run(d, "export", "--series", d["series"], "--workdir", d["work"], "--check", check=0)
    assert "throw away" not in (d["ws"] / "megatron/core/delta.py").read_text()
    assert patch.read_bytes() == before


def test_the_drift_hint_rebuilds_only_what_drifted_offline(d):
    """Two upstreams, the second given by --source (its URL unreachable, as github.com is offline);
    only the first drifts: the hint names that one alone, and works pasted as printed (before it
    named both, and rebuilding the second went to its URL)."""
    toml = d["series"] / "series.toml"
    commit = re.search(r'commit = "([0-9a-f]+)"', toml.read_text()).group(1)
    toml.write_text(toml.read_text() + '\n[upstreams.nemo-rl]\npython_path = "."\nsources = ["git"]\n'
                    f'[upstreams.nemo-rl.git]\nurl = "file:///nonexistent/offline.git"\ncommit = "{commit}"\n')
    apply(d, "--source", f"nemo-rl={d['up']}", check=0)
    patch = d["series"] / "megatron-lm/0004-conflict.patch"
    before = patch.read_bytes()
    edit(d["ws"], "megatron/core/delta.py", 30, "value_30 = 'an edit to throw away'\n")
    git(d["ws"], "commit", "-q", "-a", "--amend", "--no-edit")
    run(d, "export", "--series", d["series"], "--workdir", d["work"], check=0)
    patch.write_bytes(before)  # the export discarded
    failed = run(d, "export", "--series", d["series"], "--workdir", d["work"], "--check", check=1)
    _, drop = hints(failed)
    assert "--only megatron-lm" in drop and "nemo-rl" not in drop, drop
    sh(d, drop)
    run(d, "export", "--series", d["series"], "--workdir", d["work"], "--check", check=0)
    assert patch.read_bytes() == before and (d["work"] / "nemo-rl").is_dir()


def test_export_hints_apply_with_the_cache_and_source_apply_was_given(d, tmp_path):
    """export takes no --cache nor --source; the apply its hints print carries those apply was run with
    (the record keeps them), so it works pasted as printed on a host that cannot reach the upstream's URL
    and whose default cache is empty (before, it fetched from the URL and failed)."""
    toml = d["series"] / "series.toml"
    toml.write_text(re.sub(r'url = "[^"]*"', 'url = "file:///nonexistent/offline.git"', toml.read_text(), count=1))
    cache = tmp_path / "my cache"
    apply(d, "--source", f"megatron-lm={d['up']}", "--cache", cache, check=0)
    failed, drop = _export_discarded(d)
    assert words(drop)[-4:] == ["--cache", str(cache), "--source", f"megatron-lm={d['up']}"], drop
    assert "options you applied with" not in failed.stderr
    sh(d, drop)
    run(d, "export", "--series", d["series"], "--workdir", d["work"], "--check", check=0)
    assert "throw away" not in (d["ws"] / "megatron/core/delta.py").read_text()


def test_the_hint_names_the_inputs_of_the_last_apply_even_where_it_rebuilt_nothing(d, tmp_path):
    """The clone given with --source moved, and apply run again naming it where it is now: the workspace is
    up to date (the pin is a commit), so nothing is rebuilt, but the record takes the new place; export's
    hint, pasted, works (before, it named the old place, gone)."""
    toml = d["series"] / "series.toml"
    toml.write_text(re.sub(r'url = "[^"]*"', 'url = "file:///nonexistent/offline.git"', toml.read_text(), count=1))
    cache = tmp_path / "cache"
    apply(d, "--source", f"megatron-lm={d['up']}", "--cache", cache, check=0)
    moved = tmp_path / "moved clone"
    shutil.move(d["up"], moved)
    again = apply(d, "--source", f"megatron-lm={moved}", "--cache", cache, check=0)
    assert "already-applied" in again.stdout, again.stdout
    failed, drop = _export_discarded(d)
    assert words(drop)[-2:] == ["--source", f"megatron-lm={moved}"], drop
    shutil.rmtree(cache)  # the rebuild reads the moved clone, not what the cache kept of the old one
    sh(d, drop)
    run(d, "export", "--series", d["series"], "--workdir", d["work"], "--check", check=0)
    assert "throw away" not in (d["ws"] / "megatron/core/delta.py").read_text()


def _export_discarded(d) -> tuple[subprocess.CompletedProcess, str]:
    """An amend in the workspace exported, then the written patch file discarded (`git checkout` would): the
    failed `export --check` and the hint of it that drops the workspace's change (an apply)."""
    patch = d["series"] / "megatron-lm/0004-conflict.patch"
    before = patch.read_bytes()
    _amend_delta(d, "an edit to throw away")
    run(d, "export", "--series", d["series"], "--workdir", d["work"], check=0)
    patch.write_bytes(before)
    failed = run(d, "export", "--series", d["series"], "--workdir", d["work"], "--check", check=1)
    return failed, hints(failed)[1]


def test_a_record_from_before_the_inputs_were_kept_says_to_add_them(d):
    """A workspace record written before apply kept its --cache and --source (no "inputs"): the hint's apply
    cannot carry them, and says to add the ones apply was given; one that kept them (none given) says nothing."""
    apply(d, check=0)
    state_file = d["work"] / ".carry" / "state.json"
    _amend_delta(d, "drifted")
    failed = run(d, "export", "--series", d["series"], "--workdir", d["work"], "--check", check=1)
    assert "options you applied with" not in failed.stderr, failed.stderr
    doc = json.loads(state_file.read_text())
    for rec in doc["upstreams"].values():
        assert rec.pop("inputs") == []
    state_file.write_text(json.dumps(doc))
    failed = run(d, "export", "--series", d["series"], "--workdir", d["work"], "--check", check=1)
    assert "(with the --cache and --source options you applied with)" in failed.stderr, failed.stderr


def test_an_entry_taken_out_of_the_series_by_hand_is_named_and_the_hint_works(d):
    """A [[patches]] entry removed from series.toml while its commit is in the workspace: export names that
    patch and writes nothing (before: "unknown patch id ...; did you mean" another one, exit 2); the hint's
    set-aside and rebuild, pasted, leave a workspace export agrees with, the old one kept whole."""
    apply(d, check=0)
    d["write_series"](d["v0"], ids=("clean", "threeway", "conflict"))
    files = {p: p.read_bytes() for p in (d["series"] / "megatron-lm").iterdir()}
    failed = run(d, "export", "--series", d["series"], "--workdir", d["work"], check=2)
    assert "holds the commit(s) of upstreamed, which series.toml no longer names" in failed.stderr, failed.stderr
    assert "did you mean" not in failed.stderr
    assert {p: p.read_bytes() for p in (d["series"] / "megatron-lm").iterdir()} == files
    aside, rebuild = hints(failed)[-2:]
    sh(d, aside)
    sh(d, rebuild)
    run(d, "export", "--series", d["series"], "--workdir", d["work"], "--check", check=0)
    assert len(list((d["work"] / ".carry" / "kept").iterdir())) == 1


def test_retire_write_on_the_pin_says_it_kept_the_pin(d):
    """The README: --write against the current pin "retires nothing and keeps the pin"."""
    res = run(d, "retire", "--series", d["series"], "--against", f"megatron-lm={d['v0']}", "--write",
              "--source", f"megatron-lm={d['up']}", "--cache", d["cache"], check=0)
    assert f"retired: none; pin kept at {d['v0']}" in res.stdout, res.stdout
    assert "pin moved" not in res.stdout
    d["write_series"](d["v0"], ids=("clean", "upstreamed"))
    res = run(d, "retire", "--series", d["series"], "--against", f"megatron-lm={d['v1']}", "--write",
              "--source", f"megatron-lm={d['up']}", "--cache", d["cache"], check=0)
    assert f"retired: upstreamed; pin moved from file://{d['up']}@{d['v0']} to file://{d['up']}@{d['v1']}" \
        in res.stdout, res.stdout


# -- prove, bisect ----------------------------------------------------------------------------
def test_prove_without_workspace_or_patch_applies(d):
    from fakeup import GOOD, add_proofs
    from helpers import SERIES

    add_proofs(d["series"], {"good": GOOD}, {"clean": "good"}, SERIES / "proofs" / "pytest.ini")
    (apply_cmd,) = hints(run(d, "prove", "--series", d["series"], "--workdir", d["work"], "--cache", d["cache"],
                             "--lock-timeout", "30", check=2))
    # prove's own --cache and --lock-timeout mean the same to apply: the hint carries them
    assert words(apply_cmd)[2:] == ["--series", str(d["series"]), "--workdir", str(d["work"]),
                                    "--cache", str(d["cache"]), "--lock-timeout", "30"]
    sh(d, apply_cmd)
    run(d, "prove", "--series", d["series"], "--workdir", d["work"], check=0)
    apply(d, "--only", "threeway", check=0)
    (apply_only,) = hints(run(d, "prove", "--series", d["series"], "--workdir", d["work"], check=2))
    assert apply_only.endswith("--only clean")
    sh(d, apply_only)
    run(d, "prove", "--series", d["series"], "--workdir", d["work"], check=0)


def test_prove_only_hints_apply_with_that_only(d):
    """prove --only: the apply its hints name selects the same patches (apply's --only means the same),
    the first time and when the workspace holds another selection."""
    from fakeup import GOOD, add_proofs
    from helpers import SERIES

    add_proofs(d["series"], {"good": GOOD}, {"clean": "good"}, SERIES / "proofs" / "pytest.ini")
    prove = ["--series", d["series"], "--workdir", d["work"], "--only", "clean,threeway"]
    (apply_cmd,) = hints(run(d, "prove", *prove, check=2))
    assert words(apply_cmd)[-2:] == ["--only", "clean,threeway"], apply_cmd
    sh(d, apply_cmd)
    run(d, "prove", *prove, check=0)
    apply(d, "--only", "threeway", check=0)
    (apply_only,) = hints(run(d, "prove", *prove, check=2))
    assert words(apply_only)[-2:] == ["--only", "clean,threeway"], apply_only
    sh(d, apply_only)
    run(d, "prove", *prove, check=0)


def test_bisect_without_workspaces_applies(d, monkeypatch):
    from carry.evidence.bisect import PrefixTrees
    from carry.errors import UsageError
    from carry.series.manifest import load

    monkeypatch.chdir(d["cwd"])  # the hint names the tools as reachable from where the user is
    series = load(d["series"])
    with pytest.raises(UsageError) as info:
        PrefixTrees(series, d["work"], d["tmp"] / "scratch")
    (apply_cmd,) = re.findall(r"`([^`]+)`", info.value.hint)
    sh(d, apply_cmd)
    assert PrefixTrees(series, d["work"], d["tmp"] / "scratch").trees(0)


# -- rebase ---------------------------------------------------------------------------------
def rebase(d, *args, check=None):
    return run(d, "rebase", "--series", d["series"], "--onto", f"megatron-lm={d['v1']}", *args, check=check)


def test_rebase_conflict_resolved_as_the_hint_says(d):
    status, add, cont, *rest, again = hints(rebase(d, check=1))
    ws = d["cwd"] / "rebase-work" / "megatron-lm"
    assert "delta.py" in sh(d, status).stdout
    (ws / "megatron/core/delta.py").write_text(_resolve(ws / "megatron/core/delta.py"))
    sh(d, add, FILES="megatron/core/delta.py")
    sh(d, cont)
    for cmd in rest:  # the patches after the conflicting one, when there are any
        sh(d, cmd)
    sh(d, again)
    assert d["v1"] in (d["series"] / "series.toml").read_text()
    assert "value_15 = 'ours'" in (d["series"] / "megatron-lm/0004-conflict.patch").read_text()


def _resolve(path) -> str:
    """Resolve a conflicted file for the patch: keep the side after ``=======`` (git am's markers)."""
    out, keep = [], True
    for line in path.read_text().splitlines(keepends=True):
        if line.startswith(("<<<<<<<", "|||||||")):
            keep = False
        elif line.startswith("======="):
            keep = True
        elif line.startswith(">>>>>>>"):
            keep = True
        elif keep:
            out.append(line)
    return "".join(out)


def test_a_rebase_started_again_keeps_the_old_work_whole(d):
    """The same rebase again, without --continue: the rebase workspace a person was resolving in
    (a resolution added, notes, a branch) is set aside whole, one line says where, and its restore
    command, pasted, puts it back (before: deleted, without a word)."""
    rebase(d, check=1)
    ws = d["cwd"] / "rebase-work" / "megatron-lm"
    delta = ws / "megatron/core/delta.py"
    delta.write_text(_resolve(delta) + "# my resolution, half done\n")
    git(ws, "add", "megatron/core/delta.py")
    (ws / "NOTES.txt").write_text("my notes\n")
    git(ws, "branch", "my-attempt")
    again = rebase(d, check=1)  # a fresh start: stopped at the same conflict
    (line,) = [x for x in again.stderr.splitlines() if "kept whole in" in x]
    restore, delete = re.findall(r"`([^`]+)`", line)
    assert "--restore" in restore and "--delete" in delete
    assert not (ws / "NOTES.txt").exists() and "<<<<<<<" in delta.read_text()
    sh(d, restore)
    assert (ws / "NOTES.txt").read_text() == "my notes\n"
    assert "# my resolution, half done" in delta.read_text()
    assert git(ws, "rev-parse", "--verify", "-q", "my-attempt")
    assert (Git(ws).git_dir() / "rebase-apply").exists()  # the am in progress, as it was


def test_rebase_continue_without_a_rebase_starts_one(d):
    (start,) = hints(rebase(d, "--continue", check=2))
    res = sh(d, start, check=None)
    assert res.returncode == 1 and "am --continue" in res.stderr  # it started, and stopped at the conflict


def test_rebase_continue_with_am_in_progress_aborts(d):
    rebase(d, check=1)
    cont, abort = hints(rebase(d, "--continue", check=1))
    sh(d, abort)
    ws = d["cwd"] / "rebase-work" / "megatron-lm"
    assert not (Git(ws).git_dir() / "rebase-apply").exists()


def test_rebase_with_a_patch_left_out_names_retire(d):
    rebase(d, check=1)
    ws = d["cwd"] / "rebase-work" / "megatron-lm"
    git(ws, "am", "--skip")  # drop the conflicting patch: upstream's fix is kept
    (retire,) = hints(rebase(d, "--continue", check=2))
    res = sh(d, retire, check=0)
    assert "conflict" in res.stdout and "upstreamed" in res.stdout


@pytest.mark.parametrize("what", ["megatron/core/alpha.py", "megatron/core/untracked_new.py"])
def test_rebase_dirty_workspace_amends(d, what):
    rebase(d, check=1)
    ws = d["cwd"] / "rebase-work" / "megatron-lm"
    git(ws, "am", "--skip")
    d["write_series"](d["v0"], ids=("clean", "threeway", "upstreamed"))
    (ws / what).write_text(((ws / what).read_text() if (ws / what).exists() else "") + "late = 5\n")
    (amend,) = hints(rebase(d, "--continue", check=1))
    sh(d, amend)
    rebase(d, "--continue", check=0)


def test_rebase_hidden_edit_shown_then_amended(d):
    """An edit to a file marked assume-unchanged (git status does not show it) is uncommitted too:
    the hint clears the mark, then amends."""
    rebase(d, check=1)
    ws = d["cwd"] / "rebase-work" / "megatron-lm"
    git(ws, "am", "--skip")
    d["write_series"](d["v0"], ids=("clean", "threeway", "upstreamed"))
    git(ws, "update-index", "--assume-unchanged", "megatron/core/alpha.py")
    (ws / "megatron/core/alpha.py").write_text((ws / "megatron/core/alpha.py").read_text() + "hidden = 6\n")
    failed = rebase(d, "--continue", check=1)
    assert "megatron/core/alpha.py (marked assume-unchanged)" in failed.stderr, failed.stderr
    clear, amend = hints(failed)
    sh(d, clear)
    sh(d, amend)
    rebase(d, "--continue", check=0)
    assert "+hidden = 6" in git(ws, "show", "HEAD")


def test_rebase_unreadable_marker_starts_again(d):
    rebase(d, check=1)
    ws = d["cwd"] / "rebase-work" / "megatron-lm"
    git(ws, "am", "--abort")
    (Git(ws).git_dir() / "carry-rebase.json").write_text("[")
    (start,) = hints(rebase(d, "--continue", check=1))
    assert sh(d, start, check=None).returncode == 1  # started over, stopped at the conflict again
    assert (Git(ws).git_dir() / "rebase-apply").exists()


def test_rebase_continue_onto_another_base_names_it(d):
    rebase(d, check=1)
    ws = d["cwd"] / "rebase-work" / "megatron-lm"
    git(ws, "am", "--abort")
    failed = run(d, "rebase", "--series", d["series"], "--onto", f"megatron-lm={d['v0']}", "--continue", check=2)
    (same,) = hints(failed)
    assert f"--onto megatron-lm={d['v1']}" in same and same.endswith("--continue")
    res = sh(d, same, check=None)
    assert "expected" in res.stderr  # it picked up the workspace of that base


@pytest.mark.parametrize("verb, flag", [("retire", "--against"), ("rebase", "--onto")])
def test_retire_and_rebase_take_the_source_hint_as_written(d, verb, flag):
    """--source NAME=PATH means the same in every command: the hint apply gives works for these too."""
    toml = d["series"] / "series.toml"
    toml.write_text(toml.read_text().replace(f"file://{d['up']}", f"file://{d['tmp']}/nowhere"))
    failed = run(d, verb, "--series", d["series"], flag, f"megatron-lm={d['v1']}", check=1)
    (again,) = hints(failed)
    assert f"tools/{verb}.py" in again and again.endswith("--source megatron-lm=PATH")
    res = sh(d, again, failed, PATH=d["up"], check=None)
    if verb == "retire":
        assert res.returncode == 0 and "upstreamed" in res.stdout, res.stdout + res.stderr
    else:  # it ran, and stopped at the conflict v1 has with one patch, as a rebase does
        assert res.returncode == 1 and "am --continue" in res.stderr, res.stdout + res.stderr


# -- every hint the code can print -------------------------------------------------------------
ODD = ["/x/with space/my work", "it's", 'say "hi"', "$HOME", "${HOME}", "$(touch pwned)", "a`touch pwned`b",
       "new\nline", "tab\there", "back\\slash", "~user", "*", "a;b&&c|d>e<f", "(x){y}#z", "!last", "é ü",
       "bad \udcff byte", "", "-rf", "plain/x-1.2_3"]


@pytest.mark.parametrize("text", ODD)
def test_quote_is_one_word_that_means_the_text(text, tmp_path):
    from carry import shell

    word = shell.quote(text)
    assert "\n" not in word and "`" not in word
    out = subprocess.run(["bash", "-c", f"printf '%s\\0' {word}"], cwd=tmp_path, capture_output=True,
                         check=True).stdout
    assert out == os.fsencode(text) + b"\0"
    assert not (tmp_path / "pwned").exists()


def test_a_path_with_a_leading_dash_is_no_option():
    from pathlib import Path

    from carry import shell

    assert shell.line("rm", "-rf", Path("-rf")) == "rm -rf ./-rf"
    assert shell.line("git", "-C", Path("/abs/-x y")) == "git -C '/abs/-x y'"



def _backticked_values(path):
    """(line, expression) for each value an f-string interpolates between backticks."""
    import ast

    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.JoinedStr):
            continue
        inside = False
        for part in node.values:
            if isinstance(part, ast.Constant):
                inside ^= str(part.value).count("`") % 2 == 1
            elif inside:
                out.append((node.lineno, part.value))
    return out


def test_every_command_in_a_hint_is_built_by_the_quoting_helper():
    """A value between backticks (a path, a commit, a URL) comes from carry.shell (code/line) or
    repo.command, which quote every word; a backticked command is never a bare `--flag`."""
    import ast

    from helpers import TOOLS

    offenders, fragments = [], []
    for path in sorted((TOOLS / "carry").rglob("*.py")):
        if path.relative_to(TOOLS).as_posix() == "carry/nightly/report.py":
            continue  # summary.md: Markdown code spans of cell names and logs, no command
        for lineno, value in _backticked_values(path):
            func = value.func if isinstance(value, ast.Call) else None
            name = getattr(func, "id", None) or getattr(func, "attr", None)
            if name not in ("command", "line"):
                offenders.append(f"{path.relative_to(TOOLS)}:{lineno}: {ast.unparse(value)}")
        fragments += [f"{path.relative_to(TOOLS)}: {m}" for m in re.findall(r"(?<!`)`--[^`]*`", path.read_text())]
    assert not offenders, "interpolated into a command without carry.shell:\n" + "\n".join(offenders)
    assert not fragments, "a flag is not a command:\n" + "\n".join(fragments)
