"""The dry-run's stand-in for the GPU host: a Python 3.12 venv with the host's packages and the
staged wheels, the image steps that run without a GPU, and the functional script run in record mode
(the command lines it would run); run.py drives them and reports."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from carry import progress
from carry.errors import OperationError, UsageError
from carry.runner import Result, run

from ..host import caserun, setup
from ..host import cases as casing
from ..staging import wheel_lock, wheels


def find_python312(given: str | None) -> str:
    for cand in ([given] if given else []) + ["python3.12"]:
        path = shutil.which(cand) if cand and "/" not in cand else cand
        if path and Path(path).exists():
            v = run([path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], check=False).stdout.strip()
            if v == "3.12":
                return path
    raise UsageError("the dry-run needs a Python 3.12 (the GPU host's version) to build its check venv",
                     hint="pass --python312 PATH")


def stand_in_venv(o, lk: wheel_lock.Lock, py: str) -> Path:
    """The venv (o.venv, else o.cache/dryrun-venv: run.Options) with the host's torch and packages."""
    venv = o.venv or o.cache / "dryrun-venv"
    stamp = venv / ".carry-stand-in"
    want = json.dumps({"torch": lk.host_torch, "packages": list(lk.host_packages)}, sort_keys=True)
    if stamp.exists() and stamp.read_text() == want:
        return venv
    if not (venv / "bin" / "python").exists():
        progress.say(f"building the GPU host stand-in venv {venv} (torch {lk.host_torch} and its CUDA wheels: "
                     "several GB, once)")
        shutil.rmtree(venv, ignore_errors=True)
        run([py, "-m", "venv", str(venv)])
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-input"]
    res = run([*pip, f"torch=={lk.host_torch}", *lk.host_packages], check=False, timeout=3600)
    if not res.ok:
        raise OperationError(f"could not build the stand-in venv: {res.stderr.strip()[-800:]}")
    stamp.write_text(want)
    return venv


def install_staged(vpy: str, built: list[Path], here: tuple[int, int] | None, python: str) -> tuple[Result, list[Path]]:
    """The staged wheels into the stand-in as the host installs them (--no-index --no-deps); the last
    pip's result, and the wheels installed for the host's platform.

    What this machine's glibc (HERE) cannot take, pip refuses here though the host takes it: those
    wheels go into the stand-in's site with --platform (their compiled parts may not load here).
    """
    foreign = [w for w in built if (v := wheels.wheel_glibc(w.name)) is not None and (here is None or v > here)]
    native = [w for w in built if w not in foreign]
    pip = [vpy, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--disable-pip-version-check"]
    res = run([*pip, "--force-reinstall", *map(str, native)], check=False, timeout=900)
    for w in foreign if res.ok else []:
        site = run([vpy, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
        tag = w.name[:-4].split("-")[-1].split(".")[0]
        res = run([*pip, "--upgrade", "--target", site, "--platform", tag, "--python-version", python,
                   "--implementation", "cp", "--only-binary=:all:", str(w)], check=False, timeout=900)
        if not res.ok:
            break
    return res, foreign


def staged_version_conflicts(vpy: str, wheel_files: list[str]) -> list[str]:
    """pip check's version conflicts of the staged wheels in the stand-in: a staged package that
    requires another version of something the host (or another staged wheel) holds. The host
    installs them --no-deps, so nothing else would notice before an import fails there. A
    requirement that is not installed at all is not counted: wheels.toml leaves some declared
    ones out on purpose (its ``why``). A pip check that could not run is an error, never "none"."""
    from packaging.utils import canonicalize_name

    staged = {canonicalize_name(f.split("-")[0]) for f in wheel_files}
    res = run([vpy, "-m", "pip", "check", "--disable-pip-version-check"], check=False)
    lines = [line.strip() for line in res.stdout.splitlines() if line.strip()]
    if res.returncode == 0:
        return []
    # pip check exits 1 for any problem and names each on a line of its own; anything else is its failure.
    problems = [line for line in lines if " has requirement " in line or " requires " in line]
    if res.returncode != 1 or not lines or len(problems) != len(lines):
        raise OperationError(f"pip check in the stand-in did not report as it should (exit {res.returncode}): "
                             f"{(res.stderr or res.stdout).strip()[-300:]}")
    return [line for line in problems if " has requirement " in line and canonicalize_name(line.split()[0]) in staged]


def env_for(venv: Path, pythonpath: list[Path], extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(PATH=f"{venv / 'bin'}:{setup.SHIMS}:{env.get('PATH', '')}",
               PYTHONPATH=":".join(str(p) for p in pythonpath), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", RAY_USAGE_STATS_ENABLED="0", NEMO_RL_PY_EXECUTABLES_SYSTEM="1",
               PYTHONDONTWRITEBYTECODE="1")
    env.update(extra or {})
    return env


def run_steps(lay: setup.Layout, venv: Path) -> list[tuple[str, bool, str]]:
    """Steps 10, 30, 40 of the image recipe, as run-local.sh would run them, on the stand-in venv."""
    ctx = lay.payload / "context"
    house = ctx / "wheelhouse"
    env = dict(os.environ)
    for line in (house / "image.env").read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip().removeprefix("export ").strip()] = value.strip().strip("'\"")
    env.update(GTP_WHEELHOUSE=str(house), GTP_VENVS=str(venv), GTP_TARGET_VENVS=str(venv), GTP_STAND_IN_VENVS="",
               GTP_NEMO_RL_DIR=str(lay.nemo_rl_patched), GTP_SECRETS="/nonexistent", GTP_FLAVOR="cuda")
    out = []
    for step in ("10-venvs", "30-megatron", "40-nemo-rl"):
        res = run(["bash", str(ctx / "steps" / f"{step}.sh")], env={**env, "GTP_STEP": step}, check=False, timeout=900)
        text = (res.stdout + res.stderr).strip()
        out.append((step, res.ok, text.splitlines()[-1] if text else ""))
        if not res.ok:
            break
    return out


def wheels_glibc_of(python: str) -> tuple[int, int] | None:
    res = run([python, "-c", "import platform; print(*platform.libc_ver())"], check=False)
    lib, _, version = res.stdout.strip().partition(" ")
    parts = version.split(".")
    return (int(parts[0]), int(parts[1])) if lib == "glibc" and len(parts) >= 2 and parts[1].isdigit() else None


def record_script(lay: setup.Layout, case: casing.Case, venv: Path, work: Path,
                  pythonpath: list[Path], src: Path) -> list[dict]:
    """The functional script, run for real with uv recording: the command lines it would run."""
    tree = caserun.copy_tree(src, work / f"nemo-rl-{case.name}", lay.nemo_rl_patched)
    record = work / f"{case.name}.uv.jsonl"
    record.unlink(missing_ok=True)
    doc = lay.stage_doc()
    data = lay.payload / doc["fixtures"]["data"]
    held_out = work / f"held-out-{case.name}"   # the held-out set, written as the host writes it
    held_out.mkdir(parents=True, exist_ok=True)
    args = casing.script_args(case, str(setup.model_for(lay, case)), str(data), str(lay.checkpoints),
                              caserun.validation_file(lay, case, held_out))
    env = env_for(venv, pythonpath + [tree, setup.STUBS],
                   {"CARRY_UV_RECORD": str(record), "GIT_CONFIG_GLOBAL": str(work / "gitconfig")})
    subprocess.run(["bash", casing.SCRIPT, *args], cwd=tree, env=env, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=300, check=False)
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines() if line.strip()]


def grpo_args(recorded: list[dict]) -> list[str] | None:
    for r in recorded:
        if "examples/run_grpo.py" in r["argv"]:
            return r["argv"][r["argv"].index("examples/run_grpo.py") + 1:]
    return None


