"""--source NAME=FOLDER that is not a git checkout is an unpacked tree of NAME only where it looks
like one: a folder without the upstream's top package is named for what it is, before any work
(before: taken for an unpacked tree, then a `next:` rebase onto a release NeMo-RL does not have)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers import TOOLS


def _apply(tmp_path: Path, folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOLS / "apply.py"), "--series", "gtp", "--workdir",
                           str(tmp_path / "work"), "--source", f"nemo-rl={folder}", "--check"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env={
                              **os.environ, "GTP_CARRY_CACHE": str(tmp_path / "cache")})


def test_a_folder_that_is_not_a_nemo_rl_checkout_says_so(tmp_path):
    folder = tmp_path / "some folder"
    folder.mkdir()
    (folder / "notes.txt").write_text("not NeMo-RL\n")
    res = _apply(tmp_path, folder)
    assert res.returncode == 2, res.stderr
    assert f"--source nemo-rl={folder} is not a nemo-rl checkout" in res.stderr, res.stderr
    assert "git clone https://github.com/NVIDIA-NeMo/RL.git CHECKOUT" in res.stderr
    assert "applying" not in res.stderr and not (tmp_path / "cache").exists()


def test_an_unpacked_tree_with_the_top_package_passes_the_check(tmp_path):
    from carry.series.repo import load_series
    from carry.workspace.sourcepath import check_override

    (tmp_path / "nemo_rl").mkdir()
    check_override(load_series("gtp").upstream("nemo-rl"), tmp_path)
