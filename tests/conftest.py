"""Shared fixtures: isolated git/HOME, the real pinned artifacts, the demo upstream and series."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fakeup import copy_demo, make_demo
from helpers import ROOT, tool


def pytest_configure(config):
    """The tool's own bytecode (tools/**/__pycache__, which git ignores), compiled once before the
    tests start, where an installed package has it. The tests start the tool some 900
    times (tools/<verb>.py, each importing some 30 of carry's modules); where the environment sets
    PYTHONDONTWRITEBYTECODE, no run writes the bytecode it compiled, so every run compiled those
    modules again from source (measured: 31% of the user CPU time of tests/test_hints.py,
    test_failures.py and test_apply_git.py, which run little but the tool). Only the tool's own
    modules: the proofs' trees and patches/ keep none (carry.evidence.prove's PROOF_ENV), and the
    README's walkthrough runs a clone of the tracked files, without it, as a fresh clone is.
    compileall rewrites what is stale (a changed source); the controller does it, before any
    worker starts."""
    if hasattr(config, "workerinput"):
        return
    import compileall

    compileall.compile_dir(ROOT / "tools", quiet=2)
    # The committed GPU runs' records, kept as run.tar.xz, unpacked beside them (run/, which git ignores) for the
    # tests that judge them again: once, here, before any worker starts (one unpacked from the same archive is left).
    from carry.evidence.records import unpack_all

    unpack_all(ROOT / "integration")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """-n auto: one worker per core (pytest-xdist's own count), and one more. About a tenth of the
    suite's time a worker holds no core: it waits on the Slurm daemons, on the Docker engine's
    build, on a timeout the test sets off or on ranks meeting, and with one worker per core that
    core idles (measured on 2 cores: 86 of 1036 core-seconds idle with two workers, 19 of 951 with
    three, the same tests passing, the suite 523 s against 477 s). PYTEST_XDIST_AUTO_NUM_WORKERS
    and a number given to -n decide as before."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") or config.option.numprocesses != "auto":
        return None
    from xdist.plugin import pytest_xdist_auto_num_workers as per_core

    return per_core(config) + 1


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The slow tests first (with -n, the longest, the zygote/fresh comparison, then runs beside
    all the rest instead of after it), the Docker tests in one group (one worker builds the
    images they share, never two at once), and the slurm tests in another (one worker's cluster
    runs their jobs: two at once would wait on each other's node)."""
    for item in items:
        for group in ("docker", "slurm"):
            if item.get_closest_marker(group):
                item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


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
def gtp_work(pin_cache, tmp_path_factory) -> Path:
    """A work directory with the gtp series applied to megatron-core and Megatron-Bridge from the
    real pins, once per session: the tests that read it (import from it, prove on it) change
    nothing in it (prove only reads the workspaces, under the directory's lock)."""
    work = tmp_path_factory.mktemp("gtp") / "w"
    tool("apply", "--series", "gtp", "--workdir", work, "--cache", pin_cache,
         "--only", "megatron-lm,megatron-bridge", check=0)
    return work


@pytest.fixture(scope="session")
def mcore_tree(gtp_work) -> Path:
    """A real megatron-core 0.19.2 tree (the gtp series applied), for tests that import it."""
    return gtp_work / "megatron-lm"


@pytest.fixture(scope="session")
def demo_made(tmp_path_factory) -> dict:
    """fakeup.make_demo, once per session (per xdist worker), in an environment like _isolated_env's:
    each test's demo is a copy of it (fakeup.copy_demo), never it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(tmp_path_factory.mktemp("home")))
        mp.setenv("GIT_CONFIG_GLOBAL", os.devnull)
        mp.setenv("GIT_CONFIG_NOSYSTEM", "1")
        return make_demo(tmp_path_factory.mktemp("demo-made"))


@pytest.fixture
def demo(tmp_path, demo_made):
    """Upstream v0 and v1, four patches written against v0, a series pinned at v0 (fakeup.make_demo),
    in the test's tmp_path: a copy of the session's (about 0.2 s of git a test, made once instead)."""
    return copy_demo(demo_made, tmp_path)



@pytest.fixture
def with_world(demo):
    """The demo series with the real proofs' rank launcher (patches/gtp/proofs/_world.py) beside its proofs."""
    import shutil

    from helpers import SERIES

    proofs = demo["series"] / "proofs"
    proofs.mkdir(parents=True, exist_ok=True)
    shutil.copy(SERIES / "proofs" / "_world.py", proofs / "_world.py")
    return demo
