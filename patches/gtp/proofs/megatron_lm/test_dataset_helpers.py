"""Megatron-core installed from its wheel can set up its dataset helpers.

Bug (megatron-core 0.19.2): ``compile_helpers()`` (``datasets/utils.py``) always runs ``make``
in ``megatron/core/datasets``. The PyPI wheels ship ``helpers.cpp`` and the compiled
``helpers_cpp`` extension but no Makefile, so on every wheel install ``make`` finds nothing to
do ("No targets specified and no makefile found"), and compile_helpers logs "Failed to compile
the C++ dataset helper functions" and exits the process. Megatron-Bridge 0.6.2's
``initialize_megatron`` calls it on local rank 0: seen on two H200s, NeMo-RL's Megatron worker
rank 0 exited 1 before training. Megatron-LM main of 2026-08-22 is unchanged.

How: the tree under test copied into a fresh directory laid out as the wheel installs it (no
Makefile anywhere; the pinned base is the wheel), with ``helpers_cpp`` compiled from the tree's
own ``helpers.cpp`` for this Python, as the wheel build does. ``compile_helpers()`` must return
and ``megatron.core.datasets.helpers`` import, in a fresh interpreter. Without the compiled
extension it must stop with a message that says so; in a source checkout (a Makefile next to
``helpers.cpp``) it must still run ``make``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

CALL = ("from megatron.core.datasets.utils import compile_helpers; compile_helpers(); "
        "from megatron.core.datasets import helpers; print('helpers ok', helpers.__file__)")


def _tree_package() -> Path:
    spec = importlib.util.find_spec("megatron.core.datasets.utils")
    assert spec and spec.origin, "megatron.core is not importable"
    return Path(spec.origin).parents[3] / "megatron"


@pytest.fixture(scope="module")
def compiled_helper(tmp_path_factory) -> Path:
    """helpers_cpp for this Python, built from the tree's helpers.cpp like the wheel's."""
    import pybind11

    source = _tree_package() / "core" / "datasets" / "helpers.cpp"
    out = tmp_path_factory.mktemp("helper") / ("helpers_cpp" + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run(["g++", "-O1", "-shared", "-std=c++17", "-fPIC", f"-I{pybind11.get_include()}",
                    f"-I{sysconfig.get_paths()['include']}", str(source), "-o", str(out)], check=True)
    return out


def _installed(tmp_path: Path, helper: Path | None) -> Path:
    site = tmp_path / "site"
    shutil.copytree(_tree_package(), site / "megatron", ignore=shutil.ignore_patterns("__pycache__"))
    datasets = site / "megatron" / "core" / "datasets"
    assert not list(site.rglob("Makefile")), "the pinned base is the wheel: it has no Makefile"
    if helper is not None:
        shutil.copy2(helper, datasets / helper.name)
    return site


def _call(site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-c", CALL], cwd=site, env=env, capture_output=True,
                          text=True, timeout=300)


def test_wheel_install_with_compiled_helpers(tmp_path, compiled_helper):
    site = _installed(tmp_path, compiled_helper)
    run = _call(site)
    assert run.returncode == 0, f"compile_helpers() failed on a wheel install:\n{run.stdout}\n{run.stderr[-3000:]}"
    assert f"helpers ok {site}" in run.stdout


def test_wheel_install_without_compiled_helpers_says_so(tmp_path):
    run = _call(_installed(tmp_path, None))
    assert run.returncode == 1
    assert "has no Makefile to build them" in run.stderr, run.stderr[-3000:]


def test_source_checkout_still_runs_make(tmp_path, compiled_helper):
    site = _installed(tmp_path, compiled_helper)
    datasets = site / "megatron" / "core" / "datasets"
    (datasets / "Makefile").write_text("default:\n\ttouch made\n")
    run = _call(site)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (datasets / "made").exists(), "compile_helpers() did not run make in a source checkout"
