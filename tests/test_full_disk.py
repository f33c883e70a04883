"""A full disk is named as one, wherever it strikes (issue 32, items 9 and 14).

A real, small tmpfs filled to the brim: git's checkout, status and am, the swap's record, the
series files export writes and a --json report all hit ENOSPC for real. Each run exits 2 and
names the place, its mount point and a next step; none reads git's raw text as a failure of
its own (exit 1) or a patch conflict.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from helpers import apply_demo, git, kill_at, tmpfs_mount, tool


@pytest.fixture
def small(tmp_path):
    with tmpfs_mount(tmp_path / "small", "2m", "carry-full") as mnt:
        yield mnt


def _fill(mnt: Path, leave_kib: int = 0) -> Path:
    """Fill ``mnt`` but about ``leave_kib``: one file of zeros, written until the disk is full."""
    fill = mnt / "fill"
    fill.unlink(missing_ok=True)
    want = max(shutil.disk_usage(mnt).free - leave_kib * 1024, 0)
    fd = os.open(fill, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while want > 0 or leave_kib == 0:
            chunk = min(want, 65536) if want > 0 else 4096
            try:
                os.write(fd, b"\0" * chunk)
            except OSError:
                break
            want -= chunk
    finally:
        os.close(fd)
    return fill


def _named(res, mnt: Path) -> None:
    assert res.returncode == 2, res.stdout + res.stderr
    assert "no space left on the device holding" in res.stderr and f"mounted at {mnt}" in res.stderr, res.stderr
    assert f"df -h {mnt}" in res.stderr.split("next: ", 1)[1]
    assert "Traceback" not in res.stderr and "None" not in res.stderr and "does not apply" not in res.stderr


def test_a_fresh_apply_on_a_full_disk_is_named_in_every_phase(demo, small):
    """Sweep the space left, so that the disk fills in the clone, the checkout, the am, the record."""
    work = small / "work"
    seen = []
    for leave in range(0, 1200, 24):
        shutil.rmtree(work, ignore_errors=True)
        _fill(small, leave)
        res = apply_demo(dict(demo, work=work), check=None)
        if res.returncode == 0:
            break
        _named(res, small)
        seen.append(res.stderr)
    text = "\n".join(seen)
    assert "unable to write file" in text or "unable to checkout working tree" in text, text  # the checkout
    assert "rebase-apply" in text, text  # git am


def test_git_status_on_a_full_disk_is_named(demo, small):
    work = small / "work"
    apply_demo(dict(demo, work=work), check=0)
    for f in (work / "megatron-lm/megatron/core").iterdir():
        f.touch()  # status refreshes the index: it writes index.lock
    _fill(small, 4)
    res = tool("export", "--series", demo["series"], "--workdir", work)
    _named(res, small)
    assert "index.lock" in res.stderr


def test_recovering_a_swap_on_a_full_disk_names_it_and_a_next_step(demo, small):
    work = small / "work"
    d = dict(demo, work=work)
    apply_demo(d, check=0)
    demo["write_series"](demo["v0"], ids=("clean", "threeway"))
    kill_at("journalled", "--series", demo["series"], "--workdir", work, "--cache", demo["cache"],
            "--source", f"megatron-lm={demo['up']}")
    fill = _fill(small)
    res = apply_demo(d, check=None)
    _named(res, small)
    assert "fix the cause above" not in res.stderr
    fill.unlink()
    apply_demo(d, check=0)
    assert len(git(work / "megatron-lm", "log", "--format=%H").splitlines()) == 3


def test_a_full_disk_under_the_series_names_the_patch_file(demo, small):
    series = small / "demo"
    shutil.copytree(demo["series"], series)
    d = dict(demo, series=series)
    apply_demo(d, check=0)
    ws = demo["work"] / "megatron-lm"
    f = ws / "megatron/core/delta.py"
    f.write_text(f.read_text().replace("value_15 = 'ours'", "value_15 = 'amended'"))
    git(ws, "commit", "-q", "-a", "--amend", "--no-edit")
    _fill(small)
    res = tool("export", "--series", series, "--workdir", demo["work"])
    _named(res, small)
    assert str(series / "megatron-lm") in res.stderr


def test_a_full_disk_under_the_json_report_names_it(demo, small):
    _fill(small)
    out = small / "report.json"
    res = apply_demo(demo, "--json", out, check=None)
    _named(res, small)
    assert str(out) in res.stderr
