"""The committed gtp series itself: lint-clean, applies on the real pins,
and its patch files are exactly what export produces (no drift)."""

from __future__ import annotations

import pytest

from conftest import read_json, tool

pytestmark = pytest.mark.network


def test_lint_is_clean():
    res = tool("lint", "--series", "gtp", check=0)
    assert "0 problem(s)" in res.stdout


def test_apply_then_export_check(tmp_path, pin_cache):
    """CI's 'patches are up to date' check on the PyPI-pinned upstreams (NeMo-RL needs --source)."""
    out = tmp_path / "apply.json"
    tool("apply", "--series", "gtp", "--workdir", tmp_path / "w", "--cache", pin_cache,
         "--only", "megatron-lm,megatron-bridge", "--json", out, check=0)
    doc = read_json(out)
    for u in doc["upstreams"]:
        for p in u["patches"]:
            if p["status"] != "not-attempted":
                assert p["status"] == "applied", p
    tool("export", "--series", "gtp", "--workdir", tmp_path / "w", "--check", check=0)
    tool("apply", "--series", "gtp", "--workdir", tmp_path / "w", "--cache", pin_cache,
         "--only", "megatron-lm,megatron-bridge", "--check", check=0)
