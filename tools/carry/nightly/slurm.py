"""The nightly on Slurm (``--launcher slurm``, integration/slurm/nightly.sbatch).

A cell that needs no container (a command or functional test on a local image, each run of a
proof, an upstream-tests cell) runs as a job step: ``srun`` with the cell's command line, folder
and environment (``--export=ALL``: the launcher puts the cell's variables in srun's own, and
takes out those it must not see), inside the night's allocation (else srun makes one of its own).
A wrapper prints the step's id as the run's first line (``[carry] slurm step JOB.STEP on NODE``),
read back for the cell's record (``slurm_step``). ``launch`` is where every run of a cell goes:
the same plan, as it is on this machine or wrapped as a step, and what the run left is judged the
same way. Past its timeout srun is stopped as any run is (SIGTERM to its process group,
carry.nightly.launch): srun then cancels its step, whatever the step's processes do with SIGTERM,
and what they printed stays in the log with srun's ``Job step aborted`` (and, most times,
slurmstepd's ``*** STEP JOB.STEP ... CANCELLED ***``, which can be lost as srun closes the step).
The step's own ``--time``, a minute past the cell's timeout, is Slurm's backstop should the night
itself die.

Before the night (``preflight``): srun must be there for any cell that uses it, and a container
cell needs pyxis (srun's ``--container-image``), which Slurm alone lacks: said once, before
anything runs, rather than in srun's own message on every image cell.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterable

from ..errors import CommandError, ConfigError
from ..runner import run
from .config import expand_env
from .gpus import needs_gpus
from .launch import Finished, Plan, docker_killer, minutes, run_logged

STEP_LINE = "[carry] slurm step "
# The step's id, then the command itself (exec: its exit status is the step's).
_WRAPPER = 'echo "[carry] slurm step ${SLURM_JOB_ID}.${SLURM_STEP_ID} on ${SLURMD_NODENAME:-?}"; exec "$@"'
STEP_KINDS = ("command", "functional", "proof", "upstream-tests")
PYXIS = ("srun has no --container-image here: pyxis is not installed; install enroot and NVIDIA's pyxis "
         "(its SPANK plugin) on the nodes, or run the cells that need no container (--images host)")


def as_step(cell, launcher: str | None) -> bool:
    """Whether a cell runs as a job step: ``--launcher slurm`` and a cell that needs no container."""
    return launcher == "slurm" and cell.launcher == "local" and cell.spec.kind in STEP_KINDS


def launch(cell, p: Plan, out: Path, launcher: str | None, timeout: float,
           name: str | None = None) -> tuple[Finished, dict]:
    """Run one of a cell's plans (its run, a proof's pristine run, a bisection's probe), its output
    streamed to ``out/console.log``: as it is, or as a job step named ``name`` (default: the cell's
    id) under ``--launcher slurm``. What it left, for the record: seconds, command, log, exit
    status, whether it timed out, and the step's id."""
    log = out / "console.log"
    step = as_step(cell, launcher)
    if step:
        p = step_plan(p, name or cell.id, timeout, needs_gpus(cell))
    killer = docker_killer(p.container) if p.container else None
    fin = run_logged(p, log, timeout=timeout, on_timeout=killer)
    info = {"seconds": round(fin.seconds, 1), "command": p.shell(), "log": str(log), "returncode": fin.returncode,
            "timed_out": fin.timed_out}
    if step:
        info["slurm_step"] = step_id(log)
    return fin, info


def run_output(text: str) -> str:
    """A log's text without the lines the launch wrote: run_logged's ``$ command`` first line, the
    step's id, srun's own ``srun: ...`` lines (a task's exit status, say). What is left is what the
    run printed, the same on this machine and in a step."""
    lines = text.splitlines(keepends=True)
    if lines and lines[0].startswith("$ "):
        lines = lines[1:]
    return "".join(ln for ln in lines if not ln.startswith((STEP_LINE, "srun: ")))


def step_plan(p: Plan, name: str, timeout: float, gpus: int = 0) -> Plan:
    """A local plan as a job step; ``gpus``: the GPUs the cell's ranks take (0: none asked)."""
    cmd = ["srun", "--nodes=1", "--ntasks=1", f"--job-name={name}", "--export=ALL", f"--time={minutes(timeout)}"]
    if gpus:
        cmd.append(f"--gpus={gpus}")
    if p.cwd:
        cmd.append(f"--chdir={p.cwd}")
    cmd += ["sh", "-c", _WRAPPER, "carry-step", *p.argv]
    return Plan(p.launcher, cmd, dict(p.env), p.cwd, unset=p.unset)


def step_id(log: Path) -> str | None:
    """The job step a run went to, from its log's first lines (``JOB.STEP``), or None."""
    try:
        with open(log, "rb") as f:
            head = f.read(64 * 1024).decode("utf-8", "replace")
    except OSError:
        return None
    for line in head.splitlines():
        if line.startswith(STEP_LINE):
            words = line[len(STEP_LINE):].split()
            sid = words[0] if words else ""
            return sid if sid.replace(".", "", 1).isdigit() else None
    return None


def has_pyxis() -> bool:
    try:
        res = run(["srun", "--help"], check=False, timeout=60)
    except CommandError:
        return False
    return "--container-image" in res.stdout + res.stderr


def preflight(cells: Iterable, launcher: str | None) -> None:
    """What a night on Slurm needs, checked before it starts (ConfigError: exit 2)."""
    cells = list(cells)
    steps = [c for c in cells if as_step(c, launcher)]
    containers = [c for c in cells if c.launcher == "slurm"]
    if not steps and not containers:
        return
    if shutil.which("srun") is None:
        raise ConfigError("srun is not on PATH: --launcher slurm runs cells with srun, on a Slurm cluster",
                          hint="submit the night with sbatch integration/slurm/nightly.sbatch, or leave out "
                               "--launcher slurm")
    if containers and not has_pyxis():
        raise ConfigError(PYXIS)
    for c in containers:  # each image's squashfs named (a variable that is not set stops here, once)
        if not expand_env(c.image.squashfs or "", f"image {c.image.name!r}: squashfs"):
            raise ConfigError(f"image {c.image.name!r} has no squashfs for --launcher slurm",
                              hint="point it at the image exported with mksquashfs (integration/README.md)")
