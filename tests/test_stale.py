"""Scratch that killed or interrupted runs left is removed by the next run, and only that
(issue 32, item 14): a half-built cache entry (.build-*) where the next run finds its
artifact cached already, and a half-written wheel (.wheel-*) in --wheels. A live run's
scratch, under its lock or of its live pid, stays."""

from __future__ import annotations

import os
import subprocess
import sys

from carry.lock import DirLock
from helpers import TOOLS, apply_demo, kill_at
from test_pins import pin_series  # noqa: F401  (the fixture)


def _args(d):
    return ["--series", d["series"], "--workdir", d["work"], "--cache", d["cache"], "--source", f"megatron-lm={d['up']}"]


def test_a_half_built_base_is_removed_when_the_next_base_is_a_cache_hit(demo):
    apply_demo(demo, check=0)  # the v0 base is cached
    demo["write_series"](demo["v1"], ids=("clean",))
    kill_at("base-built", *_args(demo))  # building the v1 base
    bases = demo["cache"] / "bases" / "megatron-lm"
    assert list(bases.glob(".build-*")), "the kill left the half-made base"
    demo["write_series"](demo["v0"], ids=("clean",))
    apply_demo(demo, check=0)  # v0: a cache hit, nothing is built in bases/megatron-lm
    assert not list(bases.glob(".build-*"))
    assert not (bases / ".lock").exists()


def test_a_live_build_is_not_removed(demo):
    apply_demo(demo, check=0)
    bases = demo["cache"] / "bases" / "megatron-lm"
    live = bases / ".build-live"
    live.mkdir()
    with DirLock(bases / ".lock", 0):  # a run building there holds this lock as long as its folder lives
        apply_demo(demo, "--only", "megatron-lm", check=0)
        assert live.is_dir()
    apply_demo(demo, check=0)
    assert not live.exists()


def test_a_half_written_wheel_is_removed_by_the_next_run(pin_series, tmp_path, pin_cache):  # noqa: F811
    wheels = tmp_path / "wheels"
    args = ["--series", pin_series, "--workdir", tmp_path / "w", "--cache", pin_cache, "--only", "megatron-lm",
            "--wheels", wheels]
    kill_at("wheel-writing", *args)
    left = list(wheels.glob(".wheel-*"))
    assert left, "the kill left the temporary wheel"
    # a wheel being written now by a live process (this one): not touched
    live = wheels / f".wheel-{os.getpid()}-live.whl"
    live.write_bytes(b"")
    res = subprocess.run([sys.executable, str(TOOLS / "apply.py"), *map(str, args)], capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, res.stderr
    assert sorted(wheels.glob(".wheel-*")) == [live]
    assert list(wheels.glob("*.whl"))
