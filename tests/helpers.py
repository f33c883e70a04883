"""Helpers the tests share: the repository's paths, the tools run as subprocesses, git."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"
SERIES = ROOT / "patches" / "gtp"


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


def read_recorded(path: Path) -> str:
    """A committed evidence file's text, from PATH or, where the evidence keeps it gzipped (files over 20 KB
    are), from PATH.gz."""
    import gzip
    if path.exists():
        return path.read_text(errors="replace")
    return gzip.decompress(path.with_name(path.name + ".gz").read_bytes()).decode(errors="replace")


def git(repo: Path, *args: str, check: bool = True) -> str:
    from carry.git import Git
    return Git(repo)(*args, check=check).stdout.strip()


def apply_demo(d: dict, *extra, check: int | None = None) -> subprocess.CompletedProcess:
    """tools/apply.py on the demo series of fakeup.make_demo, its upstream given with --source."""
    return tool("apply", "--series", d["series"], "--workdir", d["work"], "--cache", d["cache"],
                "--source", f"megatron-lm={d['up']}", *extra, check=check)


def which(name: str) -> str | None:
    """A program as the tests' own Python environment has it: its bin/ first (a venv that is not
    activated is not on PATH, yet its programs, hadolint say, are the ones installed), then PATH."""
    return shutil.which(name, path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))


def python_env(bindir: Path, env: dict | None = None) -> dict:
    """``env`` (os.environ) for a shell that runs what a person types: ``python3`` and ``python``
    are the Python running the tests (wrappers in ``bindir``: a symlink would lose a venv), and
    its environment's bin/ is next on PATH."""
    bindir.mkdir(parents=True, exist_ok=True)
    for name in ("python3", "python"):
        wrapper = bindir / name
        wrapper.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} \"$@\"\n")
        wrapper.chmod(0o755)
    base = dict(os.environ if env is None else env)
    base["PATH"] = os.pathsep.join([str(bindir), str(Path(sys.executable).parent), base.get("PATH", "")])
    return base


def _python_version(cand: str) -> tuple[int, ...] | None:
    try:
        res = subprocess.run([cand, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    try:
        return tuple(map(int, res.stdout.split())) if res.returncode == 0 else None
    except ValueError:
        return None


def _python_candidates(major: int, minor: int):
    """Where a Python of at least major.minor may be, in order: $GTP_CARRY_TEST_PYTHON; PATH;
    pyenv's versions (a pyenv shim on PATH fails where the global version is another); `uv
    python find`."""
    import glob

    yield os.environ.get("GTP_CARRY_TEST_PYTHON")
    names = [f"python{major}.{m}" for m in range(minor + 8, minor - 1, -1)]
    yield from (which(n) for n in names)
    pyenv = which("pyenv")
    if pyenv:
        try:
            root = subprocess.run([pyenv, "root"], capture_output=True, text=True, timeout=60).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            root = ""
        for n in names:
            yield from sorted(glob.glob(os.path.join(root, "versions", f"{n[6:]}*", "bin", n)), reverse=True) if root else ()
    uv = which("uv")
    if uv:
        try:
            res = subprocess.run([uv, "python", "find", f">={major}.{minor}"], capture_output=True, text=True,
                                 timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            return
        yield res.stdout.strip() if res.returncode == 0 else None


def python_at_least(major: int, minor: int) -> str | None:
    """An interpreter of Python >= major.minor that really runs (_python_candidates' order), or None."""
    for cand in _python_candidates(major, minor):
        if cand and (v := _python_version(cand)) and v >= (major, minor):
            return cand
    return None


def need_python(major: int, minor: int, why: str) -> str:
    """python_at_least, or skip the test with the places searched and ``why`` it needs that Python."""
    import pytest

    python = python_at_least(major, minor)
    if python is None:
        pytest.skip(f"no Python >= {major}.{minor} here (searched GTP_CARRY_TEST_PYTHON, python{major}.{minor}+ on "
                    f"PATH, pyenv's versions, `uv python find`): {why}")
    return python


def stopped_at(proc: subprocess.Popen, checkpoint: str, timeout: float = 300) -> list[str]:
    """Read PROC's stderr (a pipe, text) until it says it waits at ``checkpoint`` (GTP_CARRY_STOP_AT); the
    lines read. Bounded: a run that neither says it nor ends within TIMEOUT is killed, so the read ends and
    the assertion names what it said (a silent hang would have held the whole suite)."""
    seen: list[str] = []
    watchdog = threading.Timer(timeout, proc.kill)
    watchdog.start()
    try:
        for line in proc.stderr:
            seen.append(line)
            if f"stopped at {checkpoint}" in line:
                break
    finally:
        watchdog.cancel()
    assert seen and f"stopped at {checkpoint}" in seen[-1], f"the run did not stop at {checkpoint}: {''.join(seen)}"
    return seen


def sigint_at(checkpoint: str, *args, verb: str = "apply", at_stop=None) -> tuple[int, str]:
    """Run tools/<verb>.py until it waits at ``checkpoint`` (GTP_CARRY_STOP_AT), call AT_STOP there (what
    must hold at that point), then send SIGINT as a terminal's Ctrl-C does; its exit code and stderr."""
    def default_sigint() -> None:
        # A suite started in the background (`cmd &`, nohup) hands its children SIGINT ignored, and Python
        # then never raises KeyboardInterrupt: the run would sit at its stop point.
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    env = dict(os.environ, GTP_CARRY_STOP_AT=checkpoint)
    proc = subprocess.Popen([sys.executable, str(TOOLS / f"{verb}.py"), *map(str, args)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    try:
        stopped_at(proc, checkpoint)
        if at_stop is not None:
            at_stop()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err


def kill_at(checkpoint: str, *args, timeout: float = 300, verb: str = "apply", env: dict | None = None) -> None:
    """Run tools/<verb>.py (apply) until it stops at ``checkpoint`` (GTP_CARRY_STOP_AT), then SIGKILL it."""
    env = dict(os.environ, **(env or {}), GTP_CARRY_STOP_AT=checkpoint)
    proc = subprocess.Popen([sys.executable, str(TOOLS / f"{verb}.py"), *map(str, args)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        stopped_at(proc, checkpoint, timeout)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stderr.close()


MINI = ROOT / "integration" / "gtp_refit_mini" / "run.py"


@contextlib.contextmanager
def mini_test_module(name: str):
    """integration/gtp_refit_mini/run.py imported as module NAME (with the sibling modules it
    imports: rank, model, ckpt, ...); on exit sys.path is restored and only those modules are
    forgotten. A C extension they pulled in (numpy under torch) cannot be loaded twice in one
    process, so later tests must find it still there."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, MINI)
    module = importlib.util.module_from_spec(spec)
    saved_path, saved_modules = list(sys.path), set(sys.modules)
    sys.modules[name] = module  # its dataclass looks its module up
    try:
        spec.loader.exec_module(module)  # puts its folder on sys.path, imports its siblings
        yield module
    finally:
        sys.path[:] = saved_path
        for mod in set(sys.modules) - saved_modules:
            where = getattr(sys.modules[mod], "__file__", None) or ""
            if mod == name or Path(where).resolve().parent == MINI.parent:
                del sys.modules[mod]


def tiny_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A real (empty) wheel file: enough for pip to resolve, install and check."""
    import zipfile

    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{info}/METADATA", meta)
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


HOST_PACKAGES = ROOT / "integration" / "proofs" / "h200-host-packages.txt"


def pins(path: Path) -> dict[str, str]:
    """A NAME==VERSION list (comments and blank lines skipped) by canonical package name."""
    from packaging.utils import canonicalize_name

    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.strip().split("==")
            out[canonicalize_name(name)] = version
    return out


def proofs_matrix(series: str, *, timeout_s: int | None = 300, patches: list[str] | None = None,
                  proof_timeout_s: int | None = None) -> str:
    """The head of a nightly.toml: one series, the local host image, and its proofs cell (the
    caller appends its own [[tests]])."""
    lines = ["[nightly]", f"series = [{json.dumps(series)}]"]
    lines += [f"timeout_s = {timeout_s}"] if timeout_s is not None else []
    lines += ["", "[images.host]", 'launcher = "local"', "", "[[tests]]", 'name = "proofs"', 'kind = "proof"',
              'images = ["host"]']
    lines += [f"patches = {json.dumps(patches)}"] if patches is not None else []
    lines += [f"timeout_s = {proof_timeout_s}"] if proof_timeout_s is not None else []
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def tmpfs_mount(where: Path, size: str, label: str):
    """A real tmpfs of ``size`` mounted at ``where`` for the test (skips where mounting is not allowed)."""
    import pytest

    where.mkdir()
    if not which("mount"):
        pytest.skip("no mount command here")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", label, str(where)], capture_output=True,
                         text=True, check=False)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {res.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def kept_lines(stderr: str) -> list[str]:
    """The lines in which a command says it kept a workspace whole (tools/kept.py's entries)."""
    return [line for line in stderr.splitlines() if "kept whole in" in line]


def paste_kept(line: str, which: int) -> subprocess.CompletedProcess:
    """Run the ``which``-th backticked command of a kept line as a user pastes it."""
    return subprocess.run(["sh", "-c", line.split("`")[2 * which + 1]], capture_output=True, text=True,
                          env=dict(os.environ))
