"""What a failed or killed run leaves, and that the next run clears it.

Each kill is placed in one phase for certain: with GTP_CARRY_STOP_AT=<checkpoint> the run
announces that it reached the checkpoint and waits there; it is then SIGKILLed (no cleanup
runs), the leftovers of that phase are checked to be really there, and the next run must
both succeed and remove them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import apply_demo, git, kill_at, read_json, tool


def _demo_args(d, work=None):
    return ["--series", d["series"], "--workdir", work or d["work"], "--cache", d["cache"],
            "--source", f"megatron-lm={d['up']}"]


def test_a_failed_first_run_leaves_no_work_directory(demo):
    """Nothing was changed, so nothing is left: not DIR/.carry/lock, not DIR."""
    res = tool("apply", "--series", demo["series"], "--workdir", demo["work"], "--cache", demo["cache"], check=1)
    assert "--source megatron-lm=PATH" in res.stderr  # the pinned URL cannot be reached
    assert not demo["work"].exists()
    demo["write_series"](demo["v1"])  # a conflict this time
    apply_demo(demo, check=1)
    assert not demo["work"].exists()
    apply_demo(demo, "--check", check=1)
    assert not demo["work"].exists()


def test_a_run_leaves_no_lock_behind(demo):
    apply_demo(demo, check=0)
    assert not (demo["work"] / ".carry" / "lock").exists()
    assert sorted(p.name for p in (demo["work"] / ".carry").iterdir() if p.name != "kept") == ["state.json"]


def test_killed_holding_the_lock(demo):
    kill_at("locked", *_demo_args(demo))
    assert (demo["work"] / ".carry" / "lock").exists()  # the kill left it (the kernel dropped the flock)
    apply_demo(demo, check=0)  # not blocked by it
    assert not (demo["work"] / ".carry" / "lock").exists()


def test_killed_while_building_a_base(demo):
    kill_at("base-built", *_demo_args(demo))
    bases = demo["cache"] / "bases" / "megatron-lm"
    assert list(bases.glob(".build-*")), "the kill left the half-made base"
    assert not list(bases.glob("*.git"))
    # Even a run for another work directory clears it: the cache is shared.
    apply_demo(dict(demo, work=demo["tmp"] / "other"), check=0)
    assert not list(bases.glob(".build-*")) and not (bases / ".lock").exists()
    assert len(list(bases.glob("*.git"))) == 1


@pytest.mark.network
def test_killed_during_a_cold_download(tmp_path):
    """The real megatron-bridge wheel, downloaded into an empty cache and killed before it is kept."""
    cache = tmp_path / "cache"
    args = ["--series", "gtp", "--workdir", tmp_path / "w", "--cache", cache, "--only", "megatron-bridge"]
    kill_at("downloaded", *args)
    (art,) = (cache / "artifacts").iterdir()
    assert [p.name for p in art.glob(".build-*/*.whl")], "the kill left the downloaded wheel in scratch"
    assert not list(art.glob("*.whl"))
    tool("apply", *args, check=0)
    assert [p.name for p in art.iterdir()] == ["megatron_bridge-0.6.2-py3-none-any.whl"]
    assert not list((cache / "bases" / "megatron-bridge").glob(".*"))


def test_killed_with_the_new_trees_staged(demo):
    apply_demo(demo, check=0)
    old = git(demo["work"] / "megatron-lm", "rev-parse", "HEAD")
    demo["write_series"](demo["v0"], ids=("clean", "threeway"))
    kill_at("staged", *_demo_args(demo))
    meta = demo["work"] / ".carry"
    assert list(meta.glob("staging-*")), "the kill left the staged trees"
    assert git(demo["work"] / "megatron-lm", "rev-parse", "HEAD") == old  # untouched until the swap
    out = demo["tmp"] / "r.json"
    apply_demo(demo, "--json", out, check=0)
    assert sorted(p.name for p in meta.iterdir() if p.name != "kept") == ["state.json"]
    assert git(demo["work"] / "megatron-lm", "rev-parse", "HEAD") == read_json(out)["upstreams"][0]["head"] != old


@pytest.mark.parametrize("checkpoint", ["journalled", "swapping"])
def test_killed_in_the_swap_is_rolled_forward(demo, checkpoint):
    apply_demo(demo, check=0)
    demo["write_series"](demo["v0"], ids=("clean",))
    kill_at(checkpoint, *_demo_args(demo))
    meta = demo["work"] / ".carry"
    journal = json.loads((meta / "journal.json").read_text())
    new_head = journal["state"]["upstreams"]["megatron-lm"]["head"]
    out = demo["tmp"] / "r.json"
    apply_demo(demo, "--json", out, check=0)
    (u,) = read_json(out)["upstreams"]
    assert [p["status"] for p in u["patches"] if p["id"] == "clean"] == ["already-applied"]  # the swap was finished
    assert u["head"] == new_head == git(demo["work"] / "megatron-lm", "rev-parse", "HEAD")
    assert sorted(p.name for p in meta.iterdir() if p.name != "kept") == ["state.json"]
    assert git(demo["work"] / "megatron-lm", "status", "--porcelain") == ""


def test_an_unreadable_journal_is_a_named_failure(demo):
    apply_demo(demo, check=0)
    journal = demo["work"] / ".carry" / "journal.json"
    journal.write_text('{"staging": ')
    res = apply_demo(demo, check=1)
    assert f"{journal} is unreadable" in res.stderr and f"--workdir {demo['work']} --set-aside" in res.stderr
    assert journal.read_text() == '{"staging": '  # left for a person to look at


def test_stale_staging_from_an_older_run_is_cleared(demo):
    """A staging folder of a run from before this one (its pid long gone) does not survive the next run."""
    apply_demo(demo, check=0)
    stale = demo["work"] / ".carry" / "staging-old"
    (stale / "megatron-lm").mkdir(parents=True)
    apply_demo(demo, check=0)
    assert not stale.exists()
    assert Path(demo["work"] / ".carry" / "state.json").exists()
