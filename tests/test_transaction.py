"""The apply transaction where its users run it: other file systems, Ctrl-C, copied and
tampered work directories and caches, interrupted exports and rebases, outputs checked first.

Each test reproduces a failure that was reported against the tool (issue: "the carry where its
users run it") with real git, real tmpfs mounts, real signals and real kills.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import apply_demo, git, read_json


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
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    if not shutil.which("mount"):
        pytest.skip("no mount command here")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "carry-test", str(mnt)],
                         capture_output=True, text=True, check=False)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


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
