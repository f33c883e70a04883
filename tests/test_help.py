"""--help tells the truth: an option the command requires shows as required in its usage line
(argparse brackets only the optional ones)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import ROOT


@pytest.mark.parametrize("verb, option", [("apply", "--workdir"), ("export", "--workdir"), ("prove", "--workdir"),
                                          ("nightly", "--out"), ("upstream_tests", "--out")])
def test_required_options_show_as_required(verb, option):
    res = subprocess.run([sys.executable, f"tools/{verb}.py", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    usage = res.stdout.split("\n\n")[0]
    assert f" {option} " in usage and f"[{option}" not in usage, usage


def test_an_unknown_flag_is_still_named_before_a_missing_required_one():
    res = subprocess.run([sys.executable, "tools/apply.py", "--bogus"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 2 and "unrecognized arguments: --bogus" in res.stderr, res.stderr
