"""The apply transaction where its users run it: other file systems, Ctrl-C, copied and
tampered work directories and caches, interrupted exports and rebases, outputs checked first.

Each test reproduces a failure that was reported against the tool (issue: "the carry where its
users run it") with real git, real tmpfs mounts, real signals and real kills.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
from carry.lock import DirLock
from carry.git import Git
from helpers import SERIES, apply_demo, git, kill_at, read_json, sigint_at, tmpfs_mount, tool


def _demo_args(d, work=None):
    return ["--series", d["series"], "--workdir", work or d["work"], "--cache", d["cache"],
            "--source", f"megatron-lm={d['up']}"]


def _consistent(work: Path, name: str = "megatron-lm") -> str:
    """The workspace is whole and is what the record says; returns its HEAD."""
    ws = work / name
    state = read_json(work / ".carry" / "state.json")
    head = git(ws, "rev-parse", "HEAD")
    assert state["upstreams"][name]["head"] == head
    assert git(ws, "status", "--porcelain") == ""
    return head


@pytest.fixture
def tmpfs(tmp_path):
    """A fresh tmpfs: another file system than tmp_path's (hard links across it fail)."""
    with tmpfs_mount(tmp_path / "tmpfs", "256m", "carry-test") as mnt:
        yield mnt


# -- 1: a work directory or a checkout on another file system -----------------------------
def test_workdir_on_another_file_system(demo, tmpfs):
    work = tmpfs / "work"
    res = apply_demo(dict(demo, work=work), check=None)
    assert res.returncode == 0, res.stderr
    assert _consistent(work)
    assert git(work / "megatron-lm", "log", "-1", "--format=%s") == "demo: conflict change"


def test_source_checkout_on_another_file_system_cold_cache(demo, tmpfs):
    up = tmpfs / "upstream"
    shutil.copytree(demo["up"], up, symlinks=True)
    res = apply_demo(dict(demo, up=up), check=None)
    assert res.returncode == 0, res.stderr
    assert _consistent(demo["work"])


# -- 4: interrupted or failing after the swap journal was written ---------------------------
@pytest.mark.parametrize("stop", ["journalled", "swapping"])
def test_sigint_when_the_journal_appears_ends_old_or_new(demo, stop):
    apply_demo(demo, check=0)
    old = _consistent(demo["work"])
    demo["write_series"](demo["v0"], ids=("clean", "threeway"))
    journal = demo["work"] / ".carry" / "journal.json"
    # The run waits right after writing the journal, or after the first rename (GTP_CARRY_STOP_AT):
    # SIGINT lands exactly then, in the checkpoint's wait, with the journal there.
    def journal_there() -> None:
        assert journal.is_file(), stop

    rc, err = sigint_at(stop, *_demo_args(demo), at_stop=journal_there)
    assert rc == 130, err
    assert "interrupted" in err
    res = apply_demo(demo, "--json", demo["tmp"] / "r.json", check=None)
    assert res.returncode == 0, res.stderr
    head = _consistent(demo["work"])
    assert head in {old, read_json(demo["tmp"] / "r.json")["upstreams"][0]["head"]}
    assert len(git(demo["work"] / "megatron-lm", "log", "--format=%H").splitlines()) == 3
    assert sorted(p.name for p in (demo["work"] / ".carry").iterdir() if p.name != "kept") == ["state.json"]


def test_a_failing_swap_changes_nothing_and_the_next_run_recovers(demo):
    """chattr +i on the work directory: the renames of the swap fail after the journal was written."""
    apply_demo(demo, check=0)
    old = _consistent(demo["work"])
    demo["write_series"](demo["v0"], ids=("clean",))
    locked = subprocess.run(["chattr", "+i", str(demo["work"])], capture_output=True, text=True, check=False)
    if locked.returncode != 0:
        pytest.skip(f"chattr +i is not available here: {locked.stderr.strip()}")
    try:
        res = apply_demo(demo, check=None)
    finally:
        subprocess.run(["chattr", "-i", str(demo["work"])], check=True)
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr and "error: " in res.stderr and "nothing was changed" in res.stderr
    assert _consistent(demo["work"]) == old
    assert not (demo["work"] / ".carry" / "journal.json").exists()
    res = apply_demo(demo, check=None)
    assert res.returncode == 0, res.stderr
    assert _consistent(demo["work"]) != old


@pytest.mark.parametrize("where", ["tmpfs", "same file system"])
def test_a_workspace_that_is_a_mount_point(demo, where, request):
    apply_demo(demo, check=0)
    ws = demo["work"] / "megatron-lm"
    old = _consistent(demo["work"])
    src = (request.getfixturevalue("tmpfs") if where == "tmpfs" else demo["tmp"]) / "ws"
    shutil.copytree(ws, src, symlinks=True)
    bound = subprocess.run(["mount", "--bind", str(src), str(ws)], capture_output=True, text=True, check=False)
    if bound.returncode != 0:
        pytest.skip(f"cannot bind-mount here (needs root or CAP_SYS_ADMIN): {bound.stderr.strip()}")
    try:
        demo["write_series"](demo["v0"], ids=("clean",))
        res = apply_demo(demo, check=None)
        assert res.returncode == 2, res.stderr
        assert "mount point" in res.stderr and "next: " in res.stderr and "Traceback" not in res.stderr
        assert _consistent(demo["work"]) == old
        assert sorted(p.name for p in (demo["work"] / ".carry").iterdir() if p.name != "kept") == ["state.json"]
        again = apply_demo(demo, check=None)  # the same answer, not a broken work directory
        assert again.returncode == 2 and "mount point" in again.stderr
    finally:
        subprocess.run(["umount", "-l", str(ws)], check=False)
    assert apply_demo(demo, check=None).returncode == 0


def test_a_journal_left_by_an_older_run_over_deleted_staging_is_undone(demo):
    """What the old bug left: a journal whose staging trees were deleted. The next run goes back to the old state."""
    apply_demo(demo, check=0)
    old = _consistent(demo["work"])
    demo["write_series"](demo["v0"], ids=("clean",))
    kill_at("journalled", *_demo_args(demo))
    for staging in (demo["work"] / ".carry").glob("staging-*"):
        shutil.rmtree(staging)
    res = apply_demo(demo, check=None)  # undoes the half swap (the old state), then applies the series
    assert res.returncode == 0, res.stderr
    assert _consistent(demo["work"]) != old
    assert len(git(demo["work"] / "megatron-lm", "log", "--format=%H").splitlines()) == 2
    assert sorted(p.name for p in (demo["work"] / ".carry").iterdir() if p.name != "kept") == ["state.json"]


def test_a_record_naming_a_head_the_workspace_lacks_hints_what_works(demo):
    """What the old bug's next run left: state.json naming heads whose trees were deleted."""
    apply_demo(demo, check=0)
    ws = demo["work"] / "megatron-lm"
    with (ws / ".git/info/exclude").open("a") as f:
        f.write("/wt/\n")
    git(ws, "worktree", "add", "-q", "--detach", str(ws / "wt"))  # moved by the hint, it must keep working
    git(ws / "wt", "commit", "-q", "--allow-empty", "-m", "detached work")
    detached = git(ws / "wt", "rev-parse", "HEAD")
    state_file = demo["work"] / ".carry" / "state.json"
    state = read_json(state_file)
    state["upstreams"]["megatron-lm"]["head"] = "e" * 40
    state_file.write_text(json.dumps(state))
    res = apply_demo(demo, check=1)
    assert "does not have" in res.stderr and "reset" not in res.stderr, res.stderr
    hint = res.stderr.split("next: ", 1)[1]
    for cmd in hint.split("`")[1::2]:  # as pasted: the set-aside, then the apply
        done = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True)
        assert done.returncode == 0, (cmd, done.stderr)
    assert _consistent(demo["work"])
    [old] = (demo["work"] / ".carry" / "kept").iterdir()
    assert git(old / "wt", "rev-parse", "HEAD") == detached  # the worktree works where it went
    assert "prunable" not in git(old, "worktree", "list", "--porcelain")


# -- 5: an export killed between the patch files and the record -------------------------------
def test_killed_export_between_files_and_record(demo):
    apply_demo(demo, check=0)
    ws = demo["work"] / "megatron-lm"
    f = ws / "megatron/core/delta.py"
    f.write_text(f.read_text().replace("value_15 = 'ours'", "value_15 = 'ours, amended'"))
    git(ws, "commit", "-q", "-a", "--amend", "--no-edit")
    kill_at("exported-files", "--series", demo["series"], "--workdir", demo["work"], verb="export")
    assert "amended" in (demo["series"] / "megatron-lm/0004-conflict.patch").read_text()  # the files were written
    res = tool("export", "--series", demo["series"], "--workdir", demo["work"], check=0)
    res = apply_demo(demo, check=None)
    assert res.returncode == 0, res.stderr
    assert "already-applied" in res.stdout and _consistent(demo["work"]) == git(ws, "rev-parse", "HEAD")


# -- 6: commits the series does not know are kept under a named ref ---------------------------
def _saved_ref(stdout: str) -> str:
    refs = [w.strip("`'\",.;:()") for w in stdout.split() if "refs/carry/saved/" in w]
    assert refs, f"no saved ref named in:\n{stdout}"
    return refs[0]


def test_an_exported_then_discarded_fixup_is_kept(demo):
    apply_demo(demo, check=0)
    ws = demo["work"] / "megatron-lm"
    patch = demo["series"] / "megatron-lm/0004-conflict.patch"
    original = patch.read_text()
    f = ws / "megatron/core/delta.py"
    f.write_text(f.read_text().replace("value_15 = 'ours'", "value_15 = 'fixup'"))
    git(ws, "commit", "-q", "-a", "--amend", "--no-edit")
    fixup = git(ws, "rev-parse", "HEAD")
    tool("export", "--series", demo["series"], "--workdir", demo["work"], check=0)
    patch.write_text(original)  # the export is discarded (git checkout patches/)
    res = apply_demo(demo, check=0)
    ref = _saved_ref(res.stdout)
    assert git(ws, "rev-parse", ref) == fixup
    assert "fixup" not in f.read_text()  # the workspace is the series again
    assert f"git -C {ws}" in res.stdout  # and says how to get the commit back


def test_an_exported_amend_still_in_the_files_is_not_set_aside(demo):
    """The amended commit export recorded is the user's, but a rebuild whose tree holds the same
    change (from the exported file) loses nothing: no saved ref, no noise."""
    apply_demo(demo, check=0)
    ws = demo["work"] / "megatron-lm"
    f = ws / "megatron/core/delta.py"
    f.write_text(f.read_text().replace("value_15 = 'ours'", "value_15 = 'amended'"))
    git(ws, "commit", "-q", "-a", "--amend", "--no-edit")
    tool("export", "--series", demo["series"], "--workdir", demo["work"], check=0)
    demo["write_series"](demo["v0"], ids=("clean", "threeway", "conflict"))  # a rebuild for another reason
    res = apply_demo(demo, check=0)
    assert "refs/carry/saved/" not in res.stdout, res.stdout
    assert "value_15 = 'amended'" in f.read_text()


def test_a_commit_on_another_branch_is_kept(demo):
    apply_demo(demo, check=0)
    ws = demo["work"] / "megatron-lm"
    git(ws, "checkout", "-q", "-b", "idea")
    (ws / "idea.txt").write_text("an idea\n")
    git(ws, "add", "idea.txt")
    git(ws, "commit", "-q", "-m", "an idea")
    idea = git(ws, "rev-parse", "HEAD")
    git(ws, "checkout", "-q", "main")
    keep = demo["tmp"] / "patches-before"
    shutil.copytree(demo["series"], keep)
    demo["write_series"](demo["v0"], ids=("clean",))
    res = apply_demo(demo, check=0)
    assert git(ws, "rev-parse", _saved_ref(res.stdout)) == idea
    # A plain rebuild of the series' own commits keeps nothing (no noise), and the saved ref survives it.
    shutil.copytree(keep, demo["series"], dirs_exist_ok=True)
    res = apply_demo(demo, check=0)
    assert "refs/carry/saved/" not in res.stdout
    assert git(ws, "for-each-ref", "--format=%(objectname)", "refs/carry/saved/") == idea


# -- 7: the journal's staging path is trusted only inside the work directory ------------------
def test_a_copied_work_directory_does_not_take_the_original_trees(demo):
    apply_demo(demo, check=0)
    demo["write_series"](demo["v0"], ids=("clean",))
    kill_at("journalled", *_demo_args(demo))
    w, w2 = demo["work"], demo["tmp"] / "w2"
    subprocess.run(["cp", "-a", str(w), str(w2)], check=True)
    staged = sorted(p.name for p in (w / ".carry").glob("staging-*/*"))
    assert staged == ["megatron-lm"]
    res = apply_demo(dict(demo, work=w2), check=None)
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in (w / ".carry").glob("staging-*/*")) == staged, "w's staged tree was taken"
    assert _consistent(w2)
    res = apply_demo(demo, check=None)  # and w still finishes its own swap
    assert res.returncode == 0, res.stderr
    assert _consistent(w) == _consistent(w2)


def test_a_journal_naming_a_folder_outside_is_refused(demo):
    apply_demo(demo, check=0)
    old = _consistent(demo["work"])
    outside = demo["tmp"] / "outside"
    (outside / "megatron-lm").mkdir(parents=True)
    (outside / "megatron-lm" / "keep.txt").write_text("not the tool's\n")
    state = read_json(demo["work"] / ".carry" / "state.json")
    (demo["work"] / ".carry" / "journal.json").write_text(
        json.dumps({"staging": str(outside), "names": ["megatron-lm"], "state": state}))
    res = apply_demo(demo, check=None)
    assert (outside / "megatron-lm" / "keep.txt").exists(), "a folder outside the work directory was moved in"
    assert res.returncode == 1 and "outside" in res.stderr and "next: " in res.stderr, res.stderr
    assert _consistent(demo["work"]) == old


# -- 8: cached bases are checked before they are used --------------------------------------------
def _tamper(base: Path, tmp: Path) -> None:
    clone = tmp / "tamper"
    subprocess.run(["git", "clone", "-q", str(base), str(clone)], check=True)
    (clone / "README.md").write_text("# TAMPERED\n")
    Git(clone).commit_all("tampered")
    Git(clone)("push", "-q", "origin", "HEAD:main")
    shutil.rmtree(clone)


def test_a_commit_added_to_a_cached_base_is_not_used(demo):
    apply_demo(demo, check=0)
    (base,) = (demo["cache"] / "bases" / "megatron-lm").glob("*.git")
    _tamper(base, demo["tmp"])
    work = demo["tmp"] / "w2"
    res = apply_demo(dict(demo, work=work), check=None)
    assert "# TAMPERED" not in (work / "megatron-lm/README.md").read_text()
    assert res.returncode == 0, res.stderr
    assert git(work / "megatron-lm", "rev-parse", "carry-base") == demo["v0"]


def test_a_cached_tree_base_with_an_added_commit_is_not_used(demo):
    tree = demo["tmp"] / "tree"
    tree.mkdir()
    with tarfile.open(fileobj=io.BytesIO(Git(demo["up"]).archive(demo["v0"]))) as tf:
        tf.extractall(tree, filter="data")  # the pinned v0 as an unpacked tree
    d = dict(demo, up=tree)
    apply_demo(d, check=0)
    (base,) = (demo["cache"] / "bases" / "megatron-lm").glob("dir-*.git")
    _tamper(base, demo["tmp"])
    work = demo["tmp"] / "w2"
    res = apply_demo(dict(d, work=work), check=None)
    assert res.returncode == 0, res.stderr
    assert "# TAMPERED" not in (work / "megatron-lm/README.md").read_text()
    assert git(work / "megatron-lm", "rev-list", "--count", "carry-base") == "1"


def test_a_cached_base_whose_main_moved_is_not_used(demo):
    demo["write_series"](demo["v1"], ids=("clean",))
    apply_demo(demo, check=0)
    (base,) = (demo["cache"] / "bases" / "megatron-lm").glob("*.git")
    Git(base)("update-ref", "refs/heads/main", demo["v0"])  # the pin's parent, as in `7ea279abf~1`
    work = demo["tmp"] / "w2"
    res = apply_demo(dict(demo, work=work), "--json", demo["tmp"] / "r.json", check=None)
    assert res.returncode == 0, res.stderr
    assert git(work / "megatron-lm", "rev-parse", "carry-base") == demo["v1"]
    assert read_json(demo["tmp"] / "r.json")["upstreams"][0]["base_commit"] == demo["v1"]


# -- 11: a pin's version must be its file's ---------------------------------------------------------
def _bridge_pin_series(tmp_path: Path, version: str) -> Path:
    text = (SERIES / "series.toml").read_text().split("\n[[patches]]")[0].replace('name = "gtp"', 'name = "pins"')
    start = text.index("[upstreams.megatron-bridge.pypi]")
    block = text[start:].replace('version = "0.6.2"', f'version = "{version}"', 1)
    sdir = tmp_path / "patches" / "pins"
    sdir.mkdir(parents=True)
    (sdir / "series.toml").write_text(text[:start] + block)
    return sdir


@pytest.mark.network
def test_a_pin_version_that_is_not_its_files_is_refused_warm_and_cold(tmp_path, pin_cache):
    sdir = _bridge_pin_series(tmp_path, "0.6.1")
    for cache in (pin_cache, tmp_path / "cold"):
        res = tool("apply", "--series", sdir, "--workdir", tmp_path / "w", "--cache", cache,
                   "--only", "megatron-bridge", timeout=300)
        assert res.returncode == 2, (cache, res.stderr)
        assert "0.6.1" in res.stderr and "megatron_bridge-0.6.2-py3-none-any.whl" in res.stderr
        assert not (tmp_path / "w").exists()
    assert not (tmp_path / "cold" / "artifacts").exists()


# -- 13: outputs and --source paths are checked before any work ------------------------------------
def test_outputs_are_checked_before_any_work(demo):
    (demo["tmp"] / "a-dir").mkdir()
    res = apply_demo(demo, "--json", demo["tmp"] / "a-dir", check=2)
    assert "--json" in res.stderr and "Traceback" not in res.stderr
    assert not demo["work"].exists() and not demo["cache"].exists()
    (demo["tmp"] / "a-file").write_text("x")
    res = apply_demo(demo, "--wheels", demo["tmp"] / "a-file", check=2)
    assert "--wheels" in res.stderr and "Traceback" not in res.stderr
    assert not demo["work"].exists() and not demo["cache"].exists()


def test_the_readme_placeholder_source_fails_first_with_a_next(tmp_path):
    cache = tmp_path / "cache"
    t0 = time.monotonic()
    res = tool("apply", "--series", "gtp", "--workdir", tmp_path / "w", "--cache", cache,
               "--source", "nemo-rl=PATH/TO/NeMo-RL", check=2, timeout=120)
    assert "PATH/TO/NeMo-RL" in res.stderr and "no such file or directory" in res.stderr
    assert "next: " in res.stderr and "git clone" in res.stderr
    assert not cache.exists() and not (tmp_path / "w").exists()
    assert time.monotonic() - t0 < 30


# -- 14: locks ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["nan", "-1", "inf"])
def test_a_lock_timeout_that_is_no_time_is_bad_usage(demo, value):
    res = apply_demo(demo, "--lock-timeout", value, check=2)
    assert "--lock-timeout" in res.stderr and "Traceback" not in res.stderr


def test_the_cache_lock_obeys_lock_timeout(demo):
    bases = demo["cache"] / "bases" / "megatron-lm"
    with DirLock(bases / ".lock"):
        t0 = time.monotonic()
        try:
            res = tool("apply", *_demo_args(demo), "--lock-timeout", "1", timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("the cache lock ignored --lock-timeout 1 (still waiting after 30 s)")
        took = time.monotonic() - t0
    assert res.returncode == 1 and "locked by another run" in res.stderr, res.stderr
    assert took < 20
    assert not demo["work"].exists()


# -- 15: a rebase killed between its clone and its marker ----------------------------------------------
def test_a_rebase_killed_after_its_clone_starts_again(demo):
    demo["write_series"](demo["v0"], ids=("clean", "threeway"))
    rw = demo["tmp"] / "rw"
    args = ["--series", demo["series"], "--onto", f"megatron-lm={demo['v1']}", "--source",
            f"megatron-lm={demo['up']}", "--cache", demo["cache"], "--workdir", rw]
    kill_at("rebase-cloned", *args, verb="rebase")
    assert rw.exists()
    res = tool("rebase", *args)
    assert res.returncode == 0, res.stderr
    assert "not a rebase workspace" not in res.stderr
    assert sorted(p.name for p in rw.iterdir()) == ["megatron-lm"]  # the killed run's scratch clone is gone


def test_a_cached_tree_base_whose_root_commit_was_amended_is_not_used(demo):
    """Issue 32 item 10: the same message and no parent, another tree: the stored tree id tells."""
    tree = demo["tmp"] / "tree"
    tree.mkdir()
    with tarfile.open(fileobj=io.BytesIO(Git(demo["up"]).archive(demo["v0"]))) as tf:
        tf.extractall(tree, filter="data")
    d = dict(demo, up=tree)
    apply_demo(d, check=0)
    (base,) = (demo["cache"] / "bases" / "megatron-lm").glob("dir-*.git")
    clone = demo["tmp"] / "amend"
    subprocess.run(["git", "clone", "-q", str(base), str(clone)], check=True)
    (clone / "README.md").write_text("# TAMPERED\n")
    Git(clone)("add", "-A")
    Git(clone)("commit", "-q", "--amend", "--no-edit")  # the same message, still a root commit
    Git(clone)("push", "-q", "--force", "origin", "HEAD:main")
    assert git(base, "rev-list", "--count", "main") == "1"
    work = demo["tmp"] / "w2"
    res = apply_demo(dict(d, work=work), check=None)
    assert res.returncode == 0, res.stderr
    assert "# TAMPERED" not in (work / "megatron-lm/README.md").read_text()
    assert "is not the commit" in res.stderr and "building it again" in res.stderr, res.stderr
