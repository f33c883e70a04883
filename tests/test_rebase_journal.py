"""rebase writes the series as one journalled step (issue 41, item 7).

Before, a rebase killed after its first refreshed patch file, or just before series.toml, left
new patch files under the old pin, and lint and apply both exited 0 on that mix. Now every new
file is staged, a journal records the step, and only then are the files moved in: a run killed
before the journal leaves the series as it was; killed after it, the next command that loads
the series (lint, apply, prove, export, rebase, retire) finishes it first and says so in one
line. Real kills (SIGKILL) at each stop point; real git.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from fakeup import edit, make_patch, make_upstream, patch_entry, series_toml
from helpers import git, kill_at, read_json, tool
from test_retire import history, merged_in_its_own_words  # noqa: F401  (the fixture: an upstream that merged patches in its own words)

from carry.git import Git

FINISHED = "[carry] finished the rebase of megatron-lm onto"


def _files(root) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A series of three patches on v0; v1 moves the context of alpha and beta (refreshed) and
    leaves gamma's alone (unchanged); ``reference``: the series an uninterrupted rebase writes."""
    root = tmp_path_factory.mktemp("rebase-journal")
    up = make_upstream(root)
    v0 = Git(up).head()
    sdir = root / "patches" / "demo"
    entries = []
    for i, pid in enumerate(("alpha", "beta", "gamma"), 1):
        rel = f"megatron-lm/{i:04d}-{pid}.patch"
        make_patch(up, v0, [(f"megatron/core/{pid}.py", 10, "value_10 = 'patched'\n")], f"demo: {pid}", sdir / rel)
        entries.append(patch_entry(pid, rel))
    (sdir / "series.toml").write_text(series_toml(v0, "https://example.invalid/up.git", entries))
    edit(up, "megatron/core/alpha.py", 8, "value_8 = 'upstream v1'\n")
    edit(up, "megatron/core/beta.py", 12, "value_12 = 'upstream v1'\n")
    v1 = Git(up).commit_all("upstream v1")
    w = {"up": up, "v0": v0, "v1": v1, "cache": root / "cache", "before": _files(sdir), "pristine": sdir}
    ref = root / "reference" / "demo"  # a series lives in a folder of its name
    shutil.copytree(sdir, ref)
    out = root / "rb.json"
    tool("rebase", *_rebase_args(w, ref, root / "rw"), "--json", out, check=0)
    outcomes = {p["id"]: p["outcome"] for p in read_json(out)["patches"]}
    assert outcomes == {"alpha": "refreshed", "beta": "refreshed", "gamma": "unchanged"}, outcomes
    w["reference"] = _files(ref)
    assert w["reference"] != w["before"]
    return w


@pytest.fixture
def s(world, tmp_path):
    """A fresh copy of the series at v0."""
    sdir = tmp_path / "patches" / "demo"
    shutil.copytree(world["pristine"], sdir)
    return sdir


def _rebase_args(w, sdir, work):
    return ["--series", sdir, "--onto", f"megatron-lm={w['v1']}", "--source", f"megatron-lm={w['up']}",
            "--cache", w["cache"], "--workdir", work]


def _finished_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(FINISHED)]


@pytest.mark.parametrize("stop", ["rebase-journalled", "rebase-file-1", "rebase-files", "rebase-manifest"])
def test_a_rebase_killed_after_its_journal_is_finished_by_lint(world, s, tmp_path, stop):
    kill_at(stop, *_rebase_args(world, s, tmp_path / "rw"), verb="rebase")
    toml = (s / "series.toml").read_text()
    if stop in ("rebase-file-1", "rebase-files"):
        # The mix the issue saw: a refreshed patch file in place, the pin still the old one.
        assert (s / "megatron-lm/0001-alpha.patch").read_bytes() == world["reference"]["megatron-lm/0001-alpha.patch"]
        assert world["v0"] in toml and world["v1"] not in toml
    res = tool("lint", "--series", s, check=0)
    (line,) = _finished_lines(res.stderr)
    assert world["v1"] in line and str(s) in line
    assert _files(s) == world["reference"]
    assert tool("lint", "--series", s, check=0).stderr.count("[carry]") == 0  # done once, nothing left


@pytest.mark.parametrize("verb", ["apply", "export", "prove", "rebase", "retire"])
def test_every_command_that_loads_the_series_finishes_the_rebase_first(world, s, tmp_path, verb):
    kill_at("rebase-file-1", *_rebase_args(world, s, tmp_path / "rw"), verb="rebase")
    work = tmp_path / "w"
    args = {
        "apply": ["--series", s, "--workdir", work, "--cache", world["cache"], "--source", f"megatron-lm={world['up']}"],
        "export": ["--series", s, "--workdir", work],
        "prove": ["--series", s, "--workdir", work, "--cache", world["cache"]],
        "rebase": _rebase_args(world, s, tmp_path / "rw"),
        "retire": ["--series", s, "--against", f"megatron-lm={world['v1']}", "--source", f"megatron-lm={world['up']}",
                   "--cache", world["cache"]],
    }[verb]
    res = tool(verb, *args)
    assert len(_finished_lines(res.stderr)) == 1, res.stderr
    assert "Traceback" not in res.stderr
    assert _files(s) == world["reference"]
    if verb in ("apply", "rebase", "retire"):
        assert res.returncode == 0, res.stdout + res.stderr
    elif verb == "export":  # no workspace yet: it says so, after the series was made whole
        assert res.returncode == 2 and "tools/apply.py" in res.stderr, res.stderr
    else:  # these demo patches have no proof: prove says so, after the series was made whole
        assert res.returncode == 2 and "no selected patch has a proof" in res.stderr, res.stderr
    if verb == "apply":
        assert git(work / "megatron-lm", "rev-parse", "carry-base") == world["v1"]


def test_a_rebase_killed_before_its_journal_leaves_the_series_as_it_was(world, s, tmp_path):
    kill_at("rebase-staged", *_rebase_args(world, s, tmp_path / "rw"), verb="rebase")
    assert list((s / "retired").glob(".staging-*/.write-1")), "the stop point is after the staging"
    res = tool("lint", "--series", s, check=0)
    assert _files(s) == world["before"]
    assert not (s / "retired").exists()
    assert sum("staged by an interrupted retire --write or rebase" in line for line in res.stderr.splitlines()) == 1


def _paste(stderr: str) -> list[str]:
    return stderr.split("next: ", 1)[1].split("`")[1::2]


def test_a_patch_file_edited_after_the_kill_is_not_overwritten(world, s, tmp_path):
    kill_at("rebase-journalled", *_rebase_args(world, s, tmp_path / "rw"), verb="rebase")
    beta = s / "megatron-lm/0002-beta.patch"
    beta.write_text(beta.read_text() + "-- \nmy edit\n")
    res = tool("lint", "--series", s, check=2)
    assert "0002-beta.patch changed after a rebase of megatron-lm onto" in res.stderr, res.stderr
    assert "would overwrite that edit; nothing was moved" in res.stderr
    assert beta.read_text().endswith("my edit\n") and world["v0"] in (s / "series.toml").read_text()
    (mv,) = _paste(res.stderr)
    subprocess.run(mv, shell=True, check=True)
    res = tool("lint", "--series", s, check=1)  # finished; lint names the version kept aside, as it names any stray file
    assert len(_finished_lines(res.stderr)) == 1
    assert "0002-beta.patch.mine: file in the series folder is not listed" in res.stderr
    files = _files(s)
    assert files.pop("megatron-lm/0002-beta.patch.mine").endswith(b"my edit\n")
    assert files == world["reference"]


def test_a_manifest_edited_after_the_kill_is_kept_beside_the_finished_one(world, s, tmp_path):
    """Dropping a rebase half written would leave the mix: its way out goes forward, the edit kept aside."""
    kill_at("rebase-file-1", *_rebase_args(world, s, tmp_path / "rw"), verb="rebase")
    toml = s / "series.toml"
    toml.write_text(toml.read_text() + "# my edit\n")
    res = tool("lint", "--series", s, check=2)
    assert "series.toml was edited after a rebase of megatron-lm onto" in res.stderr, res.stderr
    assert toml.read_text().endswith("# my edit\n")
    mv, again = _paste(res.stderr)
    assert mv.startswith("mv ") and "tools/lint.py" in again
    subprocess.run(mv, shell=True, check=True)
    res = subprocess.run(again, shell=True, capture_output=True, text=True)
    assert res.returncode == 0 and len(_finished_lines(res.stderr)) == 1, res.stderr
    files = _files(s)
    assert files.pop("series.toml.mine").endswith(b"# my edit\n")
    assert files == world["reference"]


def test_a_rebase_that_also_retires_is_one_step(history, tmp_path):  # noqa: F811
    """A patch upstream merged in its own words leaves the series in the same journalled step
    as the refreshed files and the new pin (test_retire's merged_in history)."""
    up, sdir, v3 = merged_in_its_own_words(history)
    toml = sdir / "series.toml"
    ref = tmp_path / "reference" / "demo"
    shutil.copytree(sdir, ref)
    args = ["--onto", f"megatron-lm={v3}", "--source", f"megatron-lm={up}", "--cache", history["cache"]]
    tool("rebase", "--series", ref, *args, "--workdir", tmp_path / "rw-ref", check=0)
    kill_at("rebase-files", "--series", sdir, *args, "--workdir", tmp_path / "rw", verb="rebase")
    assert 'id = "plain"' in toml.read_text() and (sdir / "megatron-lm/0004-plain.patch").exists()
    res = tool("lint", "--series", sdir, check=0)
    (line,) = _finished_lines(res.stderr)
    got, want = _files(sdir), _files(ref)
    assert got.keys() == want.keys() and "retired/plain/record.toml" in got
    assert {k: v for k, v in got.items() if not k.endswith("record.toml")} == \
        {k: v for k, v in want.items() if not k.endswith("record.toml")}


def test_rebase_continue_never_replaces_a_patch_file_edited_while_it_was_stopped(history, tmp_path):  # noqa: F811
    """A patch file edited by hand while the rebase waits on a conflict: --continue stops as export
    does, writing nothing (before: exit 0, the edit gone, no copy); --replace-edited keeps a copy."""
    sdir, up = history["series"], history["up"]
    edit(up, "megatron/core/delta.py", 13, "value_13 = 'context moved'\n")
    v3 = Git(up).commit_all("upstream: touch context near plain")
    args = ["--series", sdir, "--onto", f"megatron-lm={v3}", "--source", f"megatron-lm={up}", "--cache",
            history["cache"], "--workdir", tmp_path / "rw"]
    tool("rebase", *args, check=1)  # 'different' conflicts: drop it, finish the rest
    g = Git(tmp_path / "rw" / "megatron-lm")
    g("am", "--skip")
    g("am", "-q", "--3way", str(sdir / "megatron-lm/0003-reverted.patch"), str(sdir / "megatron-lm/0004-plain.patch"))
    from carry.series.edit import remove_patches
    (sdir / "series.toml").write_text(remove_patches((sdir / "series.toml").read_text(), {"different"}))
    (sdir / "megatron-lm/0002-different.patch").unlink()
    patch = sdir / "megatron-lm/0003-reverted.patch"
    head, sep, body = patch.read_bytes().partition(b"\n\n")
    mine = head + sep + b"MY EDIT WHILE IT WAS STOPPED\n\n" + body
    patch.write_bytes(mine)
    toml = (sdir / "series.toml").read_bytes()
    failed = tool("rebase", *args, "--continue", check=1)
    assert str(patch) in failed.stderr and "nothing was written" in failed.stderr, failed.stderr
    assert patch.read_bytes() == mine and (sdir / "series.toml").read_bytes() == toml
    replace = re.findall(r"`([^`]+)`", failed.stderr)[-1]
    assert "--continue --replace-edited" in replace
    done = tool("rebase", *args, "--continue", "--replace-edited", check=0)
    assert b"MY EDIT" not in patch.read_bytes() and v3 in (sdir / "series.toml").read_text()
    (copy,) = [p for p in (tmp_path / "rw" / ".carry" / "replaced").rglob("*") if p.is_file()]
    assert copy.read_bytes() == mine and str(copy) in done.stderr
