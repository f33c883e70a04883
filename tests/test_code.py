"""Static checks of the project's own Python: no unused imports or names, no undefined names."""

from __future__ import annotations

import subprocess
import sys

from helpers import ROOT


def test_pyflakes_rules_are_clean():
    """ruff's F rules (pyflakes) over the tools, tests, proofs, images' and integration's scripts."""
    paths = ["tools", "tests", "integration", "images", "patches/gtp/proofs"]
    res = subprocess.run([sys.executable, "-m", "ruff", "check", "--select", "F", "--no-cache", *paths],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
