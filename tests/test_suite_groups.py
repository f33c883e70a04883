"""The suite's own scheduling: with -n, the tests conftest.py puts in a group (the Docker tests, the
slurm tests) run on one worker. Two workers running Docker tests each made the engine's shared cpu
base, and the second retagged it under the first one's build (a no-op rebuild then built again)."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import ROOT

CONFTEST = '''
import importlib.util, os, sys
sys.path.insert(0, {tests!r})
spec = importlib.util.spec_from_file_location("suite_conftest", os.path.join({tests!r}, "conftest.py"))
suite = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite)
pytest_collection_modifyitems = suite.pytest_collection_modifyitems   # the suite's own hook, as it is


def pytest_configure(config):
    for name in ("docker", "slurm", "slow"):
        config.addinivalue_line("markers", name + ": as in the suite")
'''

TESTS = '''
import os, pytest

def _say(kind):
    with open(os.environ["GROUPS_OUT"], "a") as f:
        f.write(kind + " " + os.environ.get("PYTEST_XDIST_WORKER", "none") + "\\n")

@pytest.mark.parametrize("i", range(6))
@pytest.mark.docker
def test_docker(i):
    _say("docker")

@pytest.mark.parametrize("i", range(6))
@pytest.mark.slurm
def test_slurm(i):
    _say("slurm")

@pytest.mark.parametrize("i", range(8))
def test_free(i):
    _say("free")
'''


def test_the_docker_and_slurm_tests_each_run_on_one_worker(tmp_path):
    """A small suite under the suite's own conftest hook and the installed pytest and pytest-xdist, with
    -n 2 and the suite's --dist loadgroup: every docker test on one worker, every slurm test on one, and
    the ungrouped tests anywhere (both workers ran; pytest 9.2 with pytest-xdist 3.8.0 put the grouped
    tests on both)."""
    (tmp_path / "conftest.py").write_text(CONFTEST.format(tests=str(ROOT / "tests")))
    (tmp_path / "test_grouped.py").write_text(TESTS)
    out = tmp_path / "workers.txt"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider",
                          "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path)],
                         cwd=tmp_path, env={**os.environ, "GROUPS_OUT": str(out)}, capture_output=True, text=True,
                         timeout=120, check=False)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    seen: dict[str, list[str]] = {}
    for line in out.read_text().splitlines():
        kind, worker = line.split()
        seen.setdefault(kind, []).append(worker)
    assert {k: len(v) for k, v in seen.items()} == {"docker": 6, "slurm": 6, "free": 8}, seen
    assert len(set(seen["docker"])) == 1 and len(set(seen["slurm"])) == 1, seen
    assert set().union(*seen.values()) == {"gw0", "gw1"}, seen
