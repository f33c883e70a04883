"""Shared fixtures: isolated git/HOME, the real pinned artifacts, the demo upstream and series."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fakeup import make_demo
from helpers import ROOT, tool


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch, tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GTP_CARRY_QUIET", "1")
    monkeypatch.delenv("GTP_CARRY_CACHE", raising=False)
    monkeypatch.delenv("GTP_CARRY_VERBOSE", raising=False)


@pytest.fixture(scope="session")
def pin_cache() -> Path:
    """Cache of the real pinned PyPI artifacts, kept between runs (downloaded once, hash-checked)."""
    path = Path(os.environ.get("GTP_CARRY_TEST_CACHE", ROOT / ".cache" / "test-pins"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def mcore_tree(pin_cache, tmp_path_factory) -> Path:
    """A real megatron-core 0.19.2 tree (the gtp series applied), for tests that import it."""
    work = tmp_path_factory.mktemp("mcore")
    tool("apply", "--series", "gtp", "--workdir", work, "--cache", pin_cache, "--only", "megatron-lm", check=0)
    return work / "megatron-lm"


@pytest.fixture
def demo(tmp_path):
    """Upstream v0 and v1, four patches written against v0, a series pinned at v0 (fakeup.make_demo)."""
    return make_demo(tmp_path)

