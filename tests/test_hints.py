"""Every ``next:`` hint that names a command is run, as written, and does what it says.

Each test makes a command fail one way, takes the commands out of its ``next:`` line (they
are in backticks), runs them in a shell from the directory the user was in, and checks the
result: usually that the first command now succeeds. Placeholders a person must fill in
(PATH, SECONDS, FILES) are filled in the way the hint describes. A hint that says "run the
command again with `--flag`" is run as the original command plus that flag.

The demo series here pins its upstream by a file:// URL, so apply finds it without --source,
as the real series finds NeMo-RL on the network; the tools run from a scratch directory, so
the hints must name them by a path that works from there. The one hint not run is the Docker
engine's (it installs and starts dockerd as root).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import threading
import time

import pytest

from carry.runner import Git
from fakeup import edit, write
from helpers import TOOLS, git, read_json


@pytest.fixture
def d(demo, tmp_path, monkeypatch):
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
    cwd = tmp_path / "here"
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
    return found


def sh(d, cmd: str, failed=None, check=0, **fill) -> subprocess.CompletedProcess:
    """Run one hint as written (placeholders filled); '--flag ...' hints re-run ``failed`` with it."""
    for key, value in fill.items():
        cmd = cmd.replace(key, str(value))
    if cmd.startswith("--"):
        argv = [*failed.argv, *shlex.split(cmd)]
        proc = subprocess.run(argv, cwd=d["cwd"], capture_output=True, text=True, timeout=900)
    else:
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
    export, reset = hints(failed)
    assert "tools/export.py --series" in export and "reset -q --hard" in reset
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


def test_unknown_commit_dropped_with_the_reset_hint(d):
    apply(d, check=0)
    git(d["ws"], "commit", "-q", "--allow-empty", "-m", "mine")
    _, reset = hints(apply(d, check=1))
    sh(d, reset)
    assert set(statuses(d).values()) == {"already-applied"}


def test_uncommitted_changes_amend_export_or_discard(d):
    apply(d, check=0)
    alpha = d["ws"] / "megatron/core/alpha.py"
    alpha.write_text(alpha.read_text() + "more = 2\n")
    amend, export, discard = hints(apply(d, check=1))
    assert "commit -a --amend --no-edit" in amend and "tools/export.py" in export and "clean -fdq" in discard
    sh(d, amend)
    sh(d, export)
    assert "+more = 2" in (d["series"] / "megatron-lm/0004-conflict.patch").read_text()
    assert set(statuses(d).values()) == {"already-applied"}
    alpha.write_text("scribbled\n")
    (d["ws"] / "new.txt").write_text("new\n")
    *_, discard = hints(apply(d, check=1))
    sh(d, discard)
    assert "scribbled" not in alpha.read_text() and not (d["ws"] / "new.txt").exists()
    assert set(statuses(d).values()) == {"already-applied"}


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
    assert f"git -C {ws} am --continue" in res.stderr


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
    failed = apply(d, check=1)
    (again,) = hints(failed)
    assert again == "--source megatron-lm=PATH"
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
    failed = apply(d, "--source", f"megatron-lm={checkout}", check=1)
    fetch = hints(failed)[0]
    assert fetch == f"git -C {checkout} fetch origin {v2}"
    sh(d, fetch)
    apply(d, "--source", f"megatron-lm={checkout}", check=0)


def test_locked_then_again_with_more_time(d):
    from carry.lock import DirLock

    lock = DirLock(d["work"] / ".carry" / "lock")
    lock.__enter__()
    try:
        failed = apply(d, "--lock-timeout", "0.2", check=1)
    finally:
        threading.Timer(2.0, lock.__exit__).start()
    (again,) = hints(failed)
    assert again == "--lock-timeout SECONDS"
    t0 = time.monotonic()
    sh(d, again, failed, SECONDS=120)
    assert time.monotonic() - t0 >= 1.0  # it waited for the lock, then ran


@pytest.mark.parametrize("broken", ["state.json", "journal.json"])
def test_unreadable_record_removed_and_applied_again(d, broken):
    apply(d, check=0)
    (d["work"] / ".carry" / broken).write_text("{")
    (rm,) = hints(apply(d, check=1))
    assert rm == f"rm -rf {d['work']}"
    sh(d, rm)
    apply(d, check=0)


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
    (apply_cmd,) = hints(run(d, "prove", "--series", d["series"], "--workdir", d["work"], check=2))
    sh(d, apply_cmd)
    run(d, "prove", "--series", d["series"], "--workdir", d["work"], check=0)
    apply(d, "--only", "threeway", check=0)
    (apply_only,) = hints(run(d, "prove", "--series", d["series"], "--workdir", d["work"], check=2))
    assert apply_only.endswith("--only clean")
    sh(d, apply_only)
    run(d, "prove", "--series", d["series"], "--workdir", d["work"], check=0)


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


def test_rebase_dirty_workspace_amends(d):
    rebase(d, check=1)
    ws = d["cwd"] / "rebase-work" / "megatron-lm"
    git(ws, "am", "--skip")
    d["write_series"](d["v0"], ids=("clean", "threeway", "upstreamed"))
    (ws / "megatron/core/alpha.py").write_text((ws / "megatron/core/alpha.py").read_text() + "late = 5\n")
    (amend,) = hints(rebase(d, "--continue", check=1))
    sh(d, amend)
    rebase(d, "--continue", check=0)


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
    assert again == "--source megatron-lm=PATH"
    res = sh(d, again, failed, PATH=d["up"], check=None)
    if verb == "retire":
        assert res.returncode == 0 and "upstreamed" in res.stdout, res.stdout + res.stderr
    else:  # it ran, and stopped at the conflict v1 has with one patch, as a rebase does
        assert res.returncode == 1 and "am --continue" in res.stderr, res.stdout + res.stderr
