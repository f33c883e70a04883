"""The interpreter a proof runs in.

Most proofs run in the interpreter that runs the command: the test extra
holds what they import. A proof folder with a ``requirements.txt``
(``proofs/nemo_rl/``: NeMo-RL's import dependencies, with a transformers the
test extra cannot hold) runs in a virtual environment built from that file,
once, and cached under ``CACHE/proof-envs/<key>``; the key covers the file's
bytes, the interpreter and its site folders, so a changed file or another Python
builds a new one.

The environment sees exactly what this interpreter sees, after its own pins: a
``.pth`` file adds this interpreter's site folders (``site.getsitepackages()``
and the user site where enabled: torch, pytest) behind the environment's own
site-packages. It does not take them from the base interpreter
(``--system-site-packages``): run from a virtual environment, that is the base
Python under it, which may have no torch at all, and every proof would fail to
import it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import site
import sys
import time
from pathlib import Path

from .. import progress, shell
from ..errors import SourceError
from ..files import read_input
from ..lock import building
from ..runner import run
from ..series.manifest import Series

COMPLETE = ".carry-complete"


def requirements_for(series: Series, proof: str) -> Path | None:
    req = (series.root / proof.split("::")[0]).parent / "requirements.txt"
    return req if req.exists() else None  # one that is not a regular file is refused when read, not skipped


def python_for(series: Series, proof: str, cache: Path) -> str | None:
    """The interpreter for ``proof``: None for this one, else its folder's environment (built if needed)."""
    req = requirements_for(series, proof)
    return None if req is None else str(ensure(req, cache))


def python_path(series: Series, proof: str, cache: Path) -> str | None:
    """Where ``python_for``'s interpreter is, built or not (nothing is built: --print-commands)."""
    req = requirements_for(series, proof)
    return None if req is None else str(_place(req, cache)[1])


def _place(req: Path, cache: Path) -> tuple[Path, Path]:
    """The folder of the environment built from ``req`` and its python."""
    base = Path(sys.executable).resolve()
    key = hashlib.sha256(read_input(req) + b"\0" + str(base).encode() + b"\0" + sys.version.encode()
                         + b"\0" + "\0".join(parent_sites()).encode()).hexdigest()[:16]
    dest = cache / "proof-envs" / key
    return dest, dest / "bin" / "python"


def ensure(req: Path, cache: Path) -> Path:
    """The python of the environment built from ``req``; built (under a lock) when absent."""
    parents = parent_sites()
    dest, python = _place(req, cache)
    if (dest / COMPLETE).exists():
        return python
    with building(dest.parent):
        if (dest / COMPLETE).exists():
            return python
        if dest.exists():
            shutil.rmtree(dest)  # a build a killed run left half done
        t0 = time.monotonic()
        progress.say(f"building the proof environment {dest.name} from {req.name} (once; later runs reuse it)")
        # A venv records its own path, so it is built where it stays; COMPLETE marks it usable.
        venv, pip = build_commands(dest, python)
        run(venv)
        _see_parent_sites(dest, python, parents)
        res = run([*pip, "install", "--disable-pip-version-check", "--no-input",
                   "--progress-bar", "off", "-r", str(req)], check=False, env={**os.environ, "PIP_REQUIRE_VIRTUALENV": "1"})
        if not res.ok:
            shutil.rmtree(dest, ignore_errors=True)
            raise _build_failed(req, res.stdout + "\n" + res.stderr)  # pip puts the conflict's causes on stdout
        (dest / COMPLETE).write_text(f"built from {req} in {time.monotonic() - t0:.0f}s\n")
    return python


# pip's --python (pip >= 22.3): this interpreter's pip installs into another interpreter's environment.
PIP_PYTHON_OPTION = (22, 3)


def _own_pip() -> tuple[int, int] | None:
    """The version of the pip this interpreter runs as ``python -m pip``, or None where it has none."""
    from importlib import metadata

    try:
        version = metadata.version("pip")
    except metadata.PackageNotFoundError:
        return None
    m = re.match(r"(\d+)(?:\.(\d+))?", version)   # "24.0", "23.3.1", "25.1.dev0"
    return (int(m[1]), int(m[2] or 0)) if m else None


def build_commands(dest: Path, python: Path) -> tuple[list[str], list[str]]:
    """How the environment at ``dest`` is made, and the pip command that installs into it.

    Where this interpreter has a pip that takes ``--python``, the environment gets no pip of its own
    (``--without-pip``) and this interpreter's pip installs into it: ``ensurepip`` installing a pip
    into every new environment was most of a build's time (measured on 2 cores, the environment of
    one small wheel: 7.1 s and 4.9 s of CPU with it, 1.9 s and 1.1 s of CPU without). pip
    runs inside the environment's interpreter either way, so it sees and resolves against what
    the environment sees (its own site, then the parent sites of ``_see_parent_sites``). Else
    (no pip here, or one too old), the environment gets its own pip, as it always did.
    """
    own = _own_pip()
    if own is not None and own >= PIP_PYTHON_OPTION:
        return ([sys.executable, "-m", "venv", "--without-pip", str(dest)],
                [sys.executable, "-m", "pip", "--python", str(python)])
    return [sys.executable, "-m", "venv", str(dest)], [str(python), "-m", "pip"]


def parent_sites() -> list[str]:
    """This interpreter's site folders, in its order (a venv's own first, then any it exposes)."""
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return [d for d in dict.fromkeys(dirs) if Path(d).is_dir()]


def _see_parent_sites(dest: Path, python: Path, parents: list[str]) -> None:
    """A .pth in the environment's site-packages that adds ``parents`` after it (their .pth files too)."""
    own = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    line = "import site; " + "; ".join(f"site.addsitedir({d!r})" for d in parents)
    (Path(own) / "carry-parent-site.pth").write_text(line + "\n")


def _build_failed(req: Path, pip_said: str) -> SourceError:
    """pip's reason, as a user can act on it: for a conflict, the lines that name who wants what
    (the tail alone says only "ResolutionImpossible")."""
    lines = [line.strip() for line in pip_said.strip().splitlines() if line.strip()]
    if any("ResolutionImpossible" in line for line in lines):
        causes = [line for line in lines if " depends on " in line or "requested" in line.lower()]
        first = next((line for line in lines if line.startswith("ERROR: Cannot install")), "")
        return SourceError(
            f"could not build the proof environment from {req}: pip found no versions that fit together: "
            + " | ".join([first, *causes] if causes else lines[-3:]),
            hint="the environment also sees this Python's own packages (a GPU host's image): where one of "
                 "them is at a version a pin cannot use, the index or PIP_FIND_LINKS' wheel folder must offer "
                 "one that fits (integration/proofs/megatron-bridge-py312-wheels.txt for the Bridge proof)")
    return SourceError(f"could not build the proof environment from {req}: " + " | ".join(lines[-3:]),
                       hint="check network access to the package index (pip is configured as for any "
                            "install), or PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR offline, then " + shell.run_again())
