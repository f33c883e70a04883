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
and ``megatron.core.datasets.helpers`` import, in a process that has not imported megatron-core
(``_call``: as ``python -c`` with only that directory on its path). Without the compiled
extension it must stop with a message that says so; in a source checkout (a Makefile next to
``helpers.cpp``) it must still run ``make``.

The extension is a function of its inputs (the source's bytes, the compiler, its flags, pybind11
and this Python's headers and ABI): with ``CARRY_PROOF_CACHE`` (prove sets it) it is built once
per set of inputs and kept there, so the pristine and the patched run, whose ``helpers.cpp`` is
the same, and later proves, share one build.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

# What this proof fails with on the pristine base (tools' prove checks it): the wheel ships no Makefile for compile_helpers.
PRISTINE_FAILS = {
    "test_wheel_install_with_compiled_helpers": r"^AssertionError: compile_helpers\(\) failed on a wheel install",
    # The message the patch adds when a wheel install has no compiled helper: no proof of the bug (its
    # failure there is that message's absence, whatever make printed first).
    "test_wheel_install_without_compiled_helpers_says_so": None,
}

CALL = ("from megatron.core.datasets.utils import compile_helpers; compile_helpers(); "
        "from megatron.core.datasets import helpers; import megatron.core; "
        "print('helpers ok', helpers.__file__, megatron.core.__file__)")


def _tree_package() -> Path:
    """The tree's ``megatron`` folder, found without importing it (this process forks children
    that must import megatron-core for the first time)."""
    spec = importlib.machinery.PathFinder.find_spec("megatron")
    assert spec and spec.submodule_search_locations, "megatron is not on the path"
    for folder in spec.submodule_search_locations:
        if (Path(folder) / "core" / "datasets" / "utils.py").is_file():
            return Path(folder)
    raise AssertionError(f"no megatron/core/datasets/utils.py under {list(spec.submodule_search_locations)}")


def _build_inputs(source: Path) -> tuple[list[str], str]:
    import pybind11

    compiler = subprocess.run(["g++", "--version"], capture_output=True, text=True, check=True).stdout
    flags = ["-O1", "-shared", "-std=c++17", "-fPIC", f"-I{pybind11.get_include()}",
             f"-I{sysconfig.get_paths()['include']}"]
    key = hashlib.sha256()
    for part in (source.read_bytes(), compiler.encode(), " ".join(flags).encode(), pybind11.__version__.encode(),
                 sysconfig.get_config_var("EXT_SUFFIX").encode(), sys.version.encode()):
        key.update(hashlib.sha256(part).digest())
    return flags, key.hexdigest()[:20]


@pytest.fixture(scope="module")
def compiled_helper(tmp_path_factory) -> Path:
    """helpers_cpp for this Python, built from the tree's helpers.cpp like the wheel's."""
    source = _tree_package() / "core" / "datasets" / "helpers.cpp"
    name = "helpers_cpp" + sysconfig.get_config_var("EXT_SUFFIX")
    flags, key = _build_inputs(source)
    cache = os.environ.get("CARRY_PROOF_CACHE")
    if cache:
        kept = Path(cache) / f"helpers_cpp-{key}" / name
        if kept.is_file():
            return kept
    out = tmp_path_factory.mktemp("helper") / name
    subprocess.run(["g++", *flags, str(source), "-o", str(out)], check=True)
    if not cache:
        return out
    kept.parent.mkdir(parents=True, exist_ok=True)
    staged = kept.with_name(f".{name}.{os.getpid()}")
    shutil.copy2(out, staged)
    os.replace(staged, kept)  # whole or absent: a run beside this one reads it only once it is complete
    return kept


def _link_or_copy(src: str, dst: str) -> None:
    """A hard link where the file system allows one (the copy is only read; the tests add files
    beside it, never write into one), else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _installed(tmp_path: Path, helper: Path | None) -> Path:
    site = tmp_path / "site"
    shutil.copytree(_tree_package(), site / "megatron", ignore=shutil.ignore_patterns("__pycache__"),
                    copy_function=_link_or_copy)
    datasets = site / "megatron" / "core" / "datasets"
    assert not list(site.rglob("Makefile")), "the pinned base is the wheel: it has no Makefile"
    if helper is not None:
        shutil.copy2(helper, datasets / helper.name)
    return site


def _call(site: Path) -> subprocess.CompletedProcess:
    """``python -c CALL`` with ``PYTHONPATH=site``, run in ``site``: a forked child of this
    process where that is safe (no CUDA here, megatron not imported, not prove --fresh), else a
    fresh interpreter. The child starts as the interpreter would: ``site`` first on its path and
    none of the path's other additions, standard streams of its own, logging unconfigured."""
    fresh = (os.environ.get("CARRY_PROOF_FRESH") == "1" or not hasattr(os, "fork")
             or any(m.split(".")[0] == "megatron" for m in sys.modules) or _cuda_initialised())
    if fresh:
        env = {**os.environ, "PYTHONPATH": str(site)}
        return subprocess.run([sys.executable, "-c", CALL], cwd=site, env=env, capture_output=True,
                              text=True, timeout=300)
    return _forked(CALL, site)


def _cuda_initialised() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def _base_path() -> list[str]:
    """What a fresh interpreter puts after its PYTHONPATH: this one's path without what the
    PYTHONPATH, pytest (the proofs' root folders) and the script's folder added."""
    added = {os.path.realpath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    stdlib = {os.path.realpath(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    out = []
    for p in sys.path:
        real = os.path.realpath(p) if p else ""
        if not p or real in added:
            continue
        if real in stdlib or real.startswith(sys.base_prefix) or real.startswith(sys.prefix) or ".zip" in p:
            out.append(p)
    return out


def _forked(code: str, site: Path) -> subprocess.CompletedProcess:
    import io
    import logging
    import tempfile

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            status = 1
            try:
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
                sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
                os.environ["PYTHONPATH"] = str(site)
                os.chdir(site)
                sys.path[:] = ["", str(site), *_base_path()]
                sys.path_importer_cache.clear()
                importlib.invalidate_caches()
                logging.root.handlers.clear()
                logging.root.setLevel(logging.WARNING)
                logging.disable(logging.NOTSET)
                sys.argv = ["-c"]
                try:
                    exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
                    status = 0
                except SystemExit as exc:  # as the interpreter turns it into an exit status
                    status = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
                    if status == 1 and not isinstance(exc.code, int):
                        print(exc.code, file=sys.stderr)
                except BaseException:  # noqa: BLE001 - as the interpreter reports it
                    import traceback

                    traceback.print_exc()
                    status = 1
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(status)
        _, wait = os.waitpid(pid, 0)
        rc = os.waitstatus_to_exitcode(wait)
        texts = []
        for f in (out, err):
            f.seek(0)
            texts.append(f.read().decode(errors="replace"))
    return subprocess.CompletedProcess(["python", "-c", code], rc, texts[0], texts[1])


def test_wheel_install_with_compiled_helpers(tmp_path, compiled_helper):
    site = _installed(tmp_path, compiled_helper)
    run = _call(site)
    assert run.returncode == 0, f"compile_helpers() failed on a wheel install:\n{run.stdout}\n{run.stderr[-3000:]}"
    assert f"helpers ok {site}" in run.stdout
    assert f"{site}/megatron/core/__init__.py" in run.stdout, run.stdout  # the copy's megatron-core, not the tree's


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
