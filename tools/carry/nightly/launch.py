"""Launching a test: on this machine, in a Docker image, or in a Slurm container.

A launcher turns (argv, env, mounts) into the command line that runs it where
it must run, and maps paths of this machine to the paths the command sees
there. The three command lines are plain data, so they can be printed
(``--print-commands``) and checked in tests without an engine:

- local:  argv as it is;
- docker: ``docker run --rm --gpus all --name NAME -v SRC:DST ... IMAGE argv``;
- slurm:  ``srun --container-image=SQSH --container-mounts=SRC:DST,... argv``
  (pyxis/enroot, inside an allocation made by integration/slurm/nightly.sbatch).

``run_logged`` is the streaming verb long runs need: output goes to a file
as it comes, a timeout kills the whole process group (and, for Docker, the
named container), and the caller gets the exit status and whether it timed out.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from ..errors import CommandError
from ..runner import killable, run, spawn, stop_group

LAUNCHERS = ("local", "docker", "slurm")
CONTAINER_ROOT = "/carry"  # mount points inside a container: /carry/repo, /carry/out, /carry/trees/NAME


@dataclass(frozen=True)
class Mount:
    source: Path
    target: str
    read_only: bool = True


@dataclass
class Plan:
    """What to run and where; ``argv`` is the final command line."""
    launcher: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    container: str | None = None  # docker container name, for killing it on a timeout
    unset: tuple[str, ...] = ()  # local: variables of this environment the run must not see

    def shell(self) -> str:
        """The command line as one could paste it into a shell."""
        local = self.launcher == "local"
        envs = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()) if local)
        if local and self.unset:
            envs = " ".join(["env", *(f"-u {shlex.quote(k)}" for k in self.unset), envs]).rstrip()
        cmd = " ".join(shlex.quote(a) for a in self.argv)
        cd = f"cd {shlex.quote(str(self.cwd))} && " if self.cwd and local else ""
        return f"{cd}{envs + ' ' if envs else ''}{cmd}"


def docker_plan(*, image: str, argv: Sequence[str], env: Mapping[str, str], mounts: Sequence[Mount],
                workdir: str | None, name: str, gpus: str = "all", pass_env: Sequence[str] = ()) -> Plan:
    """``pass_env``: variables handed through by name (``-e NAME``), their values never on the command line."""
    cmd = ["docker", "run", "--rm", "--name", name, "--ipc=host", "--ulimit", "memlock=-1",
           "--ulimit", "stack=67108864"]
    if gpus:
        cmd += ["--gpus", gpus]
    for m in mounts:
        cmd += ["-v", f"{m.source}:{m.target}{':ro' if m.read_only else ''}"]
    for key, value in sorted(env.items()):
        cmd += ["-e", f"{key}={value}"]
    for name_ in pass_env:
        cmd += ["-e", name_]
    if workdir:
        cmd += ["-w", workdir]
    cmd += [image, *argv]
    return Plan("docker", cmd, dict(env), None, name)


def slurm_plan(*, squashfs: str, argv: Sequence[str], env: Mapping[str, str], mounts: Sequence[Mount],
               workdir: str | None, gpus: int, time_limit_s: float | None) -> Plan:
    cmd = ["srun", "--nodes=1", "--ntasks=1", f"--gpus={gpus}" if gpus else "--gpus=0",
           f"--container-image={squashfs}", "--no-container-mount-home"]
    if mounts:
        cmd.append("--container-mounts=" + ",".join(
            f"{m.source}:{m.target}{':ro' if m.read_only else ''}" for m in mounts))
    if workdir:
        cmd.append(f"--container-workdir={workdir}")
    if env:
        cmd.append("--export=ALL," + ",".join(f"{k}={v}" for k, v in sorted(env.items())))
    if time_limit_s:
        cmd.append(f"--time={minutes(time_limit_s)}")
    cmd += [*argv]
    return Plan("slurm", cmd, dict(env))


def minutes(timeout: float) -> int:
    """srun's --time for a run bounded by ``timeout`` seconds: a whole minute past it (Slurm's
    backstop; the launcher's own timeout comes first)."""
    return max(1, int(timeout // 60) + 1)


def local_plan(*, argv: Sequence[str], env: Mapping[str, str], cwd: Path | None, unset: Sequence[str] = ()) -> Plan:
    return Plan("local", list(argv), dict(env), cwd, unset=tuple(unset))


# -- running ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Finished:
    returncode: int | None
    timed_out: bool
    seconds: float
    log: Path
    error: str | None = None  # could not start at all


def run_logged(plan: Plan, log: Path, *, timeout: float | None,
               on_timeout: Callable[[], None] | None = None) -> Finished:
    """Run a plan with its output streamed to ``log``; bounded by ``timeout``. ``on_timeout``
    stops what the process group does not hold (a container); it is called too when the night is
    stopped as this runs (carry.nightly.stop), and the run is then killed."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if plan.launcher == "local":
        for key in plan.unset:
            env.pop(key, None)
        env.update(plan.env)
    t0 = time.monotonic()
    with open(log, "wb") as out:
        out.write(("$ " + plan.shell() + "\n").encode())
        out.flush()
        try:
            # Its own session, so a timeout can take down everything the run started.
            proc = spawn(plan.argv, cwd=plan.cwd, env=env, stdin=subprocess.DEVNULL,
                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        except (CommandError, OSError) as exc:
            why = exc.message if isinstance(exc, CommandError) else (exc.strerror or str(exc))
            out.write(f"could not start: {why}\n".encode())
            return Finished(None, False, 0.0, log, f"{plan.argv[0]}: {why}")
        # A run in another thread (the proofs' pool) is stopped with the night by runner.kill_groups().
        with killable(proc):
            try:
                rc = proc.wait(timeout=timeout)
                return Finished(rc, False, time.monotonic() - t0, log)
            except subprocess.TimeoutExpired:
                if on_timeout is not None:
                    on_timeout()
                stop_group(proc)
                out.write(f"\n[carry] killed after {timeout:g}s\n".encode())
                return Finished(proc.returncode, True, time.monotonic() - t0, log)
            except BaseException:
                # Stopped (SIGTERM, Ctrl-C) as it ran: the run, in a session of its own, would live on.
                if on_timeout is not None:
                    on_timeout()
                stop_group(proc)
                raise


def docker_killer(name: str, docker: str = "docker") -> Callable[[], None]:
    """Stopping the docker client leaves the container running: kill it by its name."""
    def kill() -> None:
        try:
            run([docker, "kill", name], check=False, timeout=60)
        except CommandError:
            pass  # already gone, or the engine does not answer: the client is killed anyway
    return kill
