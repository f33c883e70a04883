"""stage without the test extra: one clear error naming what to install (before: a download of
61 wheels, then a traceback, ModuleNotFoundError: tokenizers)."""

from __future__ import annotations

import subprocess
import sys

from helpers import ROOT


def test_stage_without_the_test_extra_names_what_to_install(tmp_path):
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    res = subprocess.run([str(py), "integration/nemo_rl_gtp/stage", "--no-pack", "--cache", str(tmp_path / "cache")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and "downloading" not in res.stderr, res.stderr
    assert "stage needs pip, tokenizers, transformers" in res.stderr, res.stderr
    assert f"{py} -m pip install -e" in res.stderr and "[test]" in res.stderr, res.stderr
    assert not (tmp_path / "cache").exists()
