"""Shared fixtures: isolated git/HOME, the tools as subprocesses, real pinned artifacts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"
SERIES = ROOT / "patches" / "gtp"


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


def tool(name: str, *args: str, timeout: float = 900, env: dict | None = None, check: int | None = None,
         cwd: Path = ROOT) -> subprocess.CompletedProcess:
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    proc = subprocess.run([sys.executable, str(TOOLS / f"{name}.py"), *map(str, args)], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
    if check is not None and proc.returncode != check:
        raise AssertionError(f"tools/{name}.py exited {proc.returncode}, wanted {check}\n"
                             f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def git(repo: Path, *args: str, check: bool = True) -> str:
    from carry.runner import Git
    return Git(repo)(*args, check=check).stdout.strip()
