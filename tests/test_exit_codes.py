"""Exit codes and clean errors for bad set-ups and bad input (issue 32 items 13 and 14).

Each is exit 2 (bad input, configuration or machine set-up) with a named error, never a traceback.
"""

from __future__ import annotations

import os
import sys

from helpers import ROOT, tool
from helpers import apply_demo as apply


def _pins_series(tmp, edit) -> tuple:
    """A series of the gtp pins alone (no patches), its series.toml passed through ``edit``."""
    sdir = tmp / "patches" / "pins"
    sdir.mkdir(parents=True)
    pins = (ROOT / "patches/gtp/series.toml").read_text().split("\n[[patches]]")[0]
    (sdir / "series.toml").write_text(edit(pins.replace('name = "gtp"', 'name = "pins"')))
    return sdir


def _clean_2(res, *named):
    out = res.stdout + res.stderr
    assert res.returncode == 2, out
    assert "Traceback" not in out, out
    for n in named:
        assert n in res.stderr, res.stderr


def test_git_missing_from_path_is_a_set_up_error(demo, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(sys.executable, bin_dir / "python3")
    res = tool("apply", "--series", demo["series"], "--workdir", demo["work"], "--cache", demo["cache"],
               "--source", f"megatron-lm={demo['up']}", env={"PATH": str(bin_dir)})
    _clean_2(res, "git is not installed or not on PATH", "next: install git")


def test_a_map_target_outside_the_tree_is_bad_configuration(tmp_path):
    sdir = _pins_series(tmp_path, lambda t: t.replace('map = { "megatron/" = "megatron/" }',
                                                      'map = { "megatron/" = "../megatron/" }'))
    for verb, extra in (("apply", ["--workdir", tmp_path / "w", "--cache", tmp_path / "c"]), ("lint", [])):
        _clean_2(tool(verb, "--series", sdir, *extra), "the target must be a folder inside", "'..' escapes")
    assert not (tmp_path / "megatron").exists()


def test_a_deeply_nested_series_toml_is_refused_cleanly(tmp_path):
    sdir = _pins_series(tmp_path, lambda t: t + "\n[extra]\nx = " + "[" * 20000 + "]" * 20000 + "\n")
    for verb in ("lint", "apply"):
        _clean_2(tool(verb, "--series", sdir, "--workdir", tmp_path / "w") if verb == "apply"
                 else tool(verb, "--series", sdir), "nested too deeply")


def test_a_huge_version_is_refused_cleanly(tmp_path):
    for value in ('"' + "1" * 100_000 + '"', "1" * 100_000):
        sdir = _pins_series(tmp_path / value[:2], lambda t: t.replace('version = "0.19.2"', f"version = {value}", 1))
        _clean_2(tool("lint", "--series", sdir))
        _clean_2(tool("apply", "--series", sdir, "--workdir", tmp_path / "w", "--cache", tmp_path / "c"))


def test_a_dangling_symlink_workdir_is_named_as_such(demo, tmp_path):
    link = tmp_path / "wd"
    os.symlink(tmp_path / "gone", link)
    res = apply(dict(demo, work=link))
    _clean_2(res, "is a symbolic link to", "which does not exist")
    assert "is a file" not in res.stderr
