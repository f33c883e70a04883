"""docker verbs on the one runner (``carry.runner.run``), plus a streamed build.

The engine's own CLI is used (``/usr/bin/docker`` from the Debian package has
BuildKit built in; a newer client earlier on PATH may lack buildx), unless
``GTP_CARRY_DOCKER`` names another. Builds use BuildKit with plain progress,
so the log can be streamed and read back (which steps were CACHED).
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import shutil
import subprocess
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping

from ..errors import CommandError, ConfigError, OperationError
from ..runner import Result, run, spawn, stream

# Changes the machine (installs and starts dockerd as root): the one hint the tests do not run.
ENGINE_HINT = "as root, `bash .ci/docker-engine.sh` in the repository installs an engine and starts it"


class DockerUnavailable(ConfigError):
    """No Docker engine answers (exit 2: the machine is not set up for images)."""


def docker_binary() -> str:
    env = os.environ.get("GTP_CARRY_DOCKER")
    if env:
        return env
    if os.access("/usr/bin/docker", os.X_OK):
        return "/usr/bin/docker"
    return shutil.which("docker") or "docker"


@dataclass
class BuildStep:
    vertex: str           # BuildKit's "#N"
    name: str             # "[4/9] RUN /opt/gtp/steps/20-te.sh"
    cached: bool = False
    seconds: float | None = None
    error: bool = False

    def to_dict(self) -> dict:
        return {"vertex": self.vertex, "name": self.name, "cached": self.cached,
                "seconds": self.seconds, "error": self.error}


@dataclass
class BuildLog:
    steps: dict[str, BuildStep] = field(default_factory=dict)
    tail: list[str] = field(default_factory=list)

    _HEAD = re.compile(r"^(#\d+) (\[.*?\] .+)$")
    _DONE = re.compile(r"^(#\d+) DONE (\d+(?:\.\d+)?)s$")
    _CACHED = re.compile(r"^(#\d+) CACHED$")
    _ERROR = re.compile(r"^(#\d+) ERROR")

    def feed(self, line: str) -> BuildStep | None:
        """Record one plain-progress line; returns the step when a new one starts."""
        self.tail = (self.tail + [line])[-40:]
        m = self._HEAD.match(line)
        if m and m.group(1) not in self.steps:
            step = BuildStep(m.group(1), m.group(2))
            self.steps[m.group(1)] = step
            return step
        for rx, kind in ((self._DONE, "done"), (self._CACHED, "cached"), (self._ERROR, "error")):
            m = rx.match(line)
            if m and m.group(1) in self.steps:
                s = self.steps[m.group(1)]
                if kind == "done":
                    s.seconds = float(m.group(2))
                elif kind == "cached":
                    s.cached = True
                else:
                    s.error = True
        return None

    def dockerfile_steps(self) -> list[BuildStep]:
        """Only the Dockerfile's own instructions ("[n/m] ..."), in order."""
        own = [(int(m.group(1)), s) for s in self.steps.values() if (m := re.match(r"^\[\s*(\d+)/\d+\]", s.name))]
        return [s for _, s in sorted(own, key=lambda x: x[0])]


class Docker:
    def __init__(self, binary: str | None = None):
        self.binary = binary or docker_binary()

    def __call__(self, *args: str, check: bool = True, timeout: float | None = None,
                 env: Mapping[str, str] | None = None, binary: bool = False) -> Result:
        return run([self.binary, *args], check=check, timeout=timeout, env=env, binary=binary)

    # -- small named verbs ---------------------------------------------------------
    def require(self) -> str:
        """The server version; DockerUnavailable when no engine answers."""
        try:
            res = self("version", "--format", "{{.Server.Version}}", check=False, timeout=30)
        except CommandError as exc:
            raise DockerUnavailable(f"no Docker engine: {exc.message}",
                                    hint=ENGINE_HINT) from None
        if not res.ok or not res.stdout.strip():
            raise DockerUnavailable(f"no Docker engine answers {self.binary} ({(res.stderr or '').strip()[:200]})",
                                    hint=ENGINE_HINT)
        return res.stdout.strip()

    def inspect(self, ref: str) -> dict | None:
        res = self("image", "inspect", ref, check=False)
        if not res.ok:
            return None
        return json.loads(res.stdout)[0]

    def image_id(self, ref: str) -> str | None:
        doc = self.inspect(ref)
        return doc["Id"] if doc else None

    def tag(self, src: str, dst: str) -> None:
        self("tag", src, dst)

    def rmi(self, refs: Iterable[str]) -> None:
        refs = list(refs)
        if refs:
            self("rmi", "--force", *refs, check=False)

    def images(self, reference: str) -> list[str]:
        """Tags (repo:tag) matching a reference filter, e.g. 'gtp-te219'."""
        out = self("images", "--format", "{{.Repository}}:{{.Tag}}", "--filter", f"reference={reference}").stdout
        return [x for x in out.split() if x and "<none>" not in x]

    def run_rm(self, image: str, *cmd: str, network: str = "none", timeout: float | None = 900) -> Result:
        return self("run", "--rm", "--network", network, image, *cmd, check=False, timeout=timeout)

    def create(self, image: str) -> str:
        return self("create", image).stdout.strip()

    def rm(self, container: str) -> None:
        self("rm", "--force", container, check=False)

    def export_cmd(self, container: str) -> list[str]:
        return [self.binary, "export", container]

    # -- a build whose log streams --------------------------------------------------
    def build(self, context: Path, *, tag: str, build_args: Mapping[str, str], labels: Mapping[str, str],
              secrets: Mapping[str, Path], log_file: Path,
              on_step: Callable[[BuildStep], None] | None = None,
              on_line: Callable[[str], None] | None = None) -> tuple[int, BuildLog]:
        argv = [self.binary, "build", "--progress=plain", "--tag", tag, "--file", str(context / "Dockerfile")]
        for k, v in build_args.items():
            argv += ["--build-arg", f"{k}={v}"]
        for k, v in labels.items():
            argv += ["--label", f"{k}={v}"]
        for k, path in secrets.items():
            argv += ["--secret", f"id={k},src={path}"]
        argv.append(str(context))
        env = dict(os.environ, DOCKER_BUILDKIT="1", BUILDKIT_PROGRESS="plain")
        log = BuildLog()
        log_file.parent.mkdir(parents=True, exist_ok=True)
        # A build runs for minutes and its log is the progress: this is the one
        # place a command's output is read while it runs rather than captured.
        with open(log_file, "w", encoding="utf-8") as out:
            out.write("$ " + " ".join(argv) + "\n")
            t0 = time.monotonic()

            def feed(line: str) -> None:
                out.write(line + "\n")
                step = log.feed(line)
                if step and on_step:
                    on_step(step)
                if on_line:
                    on_line(line)

            try:
                rc = stream(argv, feed, env=env)
            except CommandError as exc:
                if exc.returncode != 127:
                    raise
                raise DockerUnavailable(f"{self.binary}: not found",
                                        hint=ENGINE_HINT) from None
            out.write(f"# exit {rc} after {time.monotonic() - t0:.1f}s\n")
        return rc, log


# -- squashfs for enroot/pyxis --------------------------------------------------------------
def _enroot_files(config: dict) -> dict[str, bytes]:
    """enroot reads the environment from /etc/environment and runs /etc/rc with
    the command as arguments; `docker export` loses both, so write them."""
    env = config.get("Env") or []
    cmd = (config.get("Entrypoint") or []) + (config.get("Cmd") or [])
    workdir = config.get("WorkingDir") or "/"
    environment = "".join(f"{e}\n" for e in env)
    rc = ("#!/bin/sh\n# Written by tools/build_image.py from the image's WORKDIR and CMD.\n"
          f"cd {shlex.quote(workdir)} || exit 1\n"
          'if [ $# -gt 0 ]; then exec "$@"; fi\n'
          f"exec {' '.join(shlex.quote(c) for c in cmd) if cmd else '/bin/sh'}\n")
    return {"etc/environment": environment.encode(), "etc/rc": rc.encode()}


def export_squashfs(docker: Docker, image: str, out: Path) -> dict:
    if not shutil.which("mksquashfs"):
        raise DockerUnavailable("mksquashfs is not installed", hint="as root, `apt-get install -y squashfs-tools`")
    config = (docker.inspect(image) or {}).get("Config") or {}
    extra = _enroot_files(config)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    tmp.unlink(missing_ok=True)
    t0 = time.monotonic()
    cid = docker.create(image)
    try:
        exp = spawn(docker.export_cmd(cid), stdout=subprocess.PIPE)
        sq = spawn(["mksquashfs", "-", str(tmp), "-tar", "-noappend", "-quiet", "-no-progress"],
                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert exp.stdout is not None and sq.stdin is not None
        # Rewrite the stream: drop the image's own copies of enroot's files, add ours.
        with tarfile.open(fileobj=exp.stdout, mode="r|") as src, tarfile.open(fileobj=sq.stdin, mode="w|",
                                                                                format=tarfile.GNU_FORMAT) as dst:
            for member in src:
                if member.name.lstrip("./") in extra:
                    continue
                dst.addfile(member, src.extractfile(member) if member.isreg() else None)
            for name, data in extra.items():
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = len(data), 0o755 if name == "etc/rc" else 0o644, 0
                dst.addfile(info, io.BytesIO(data))
        sq.stdin.close()
        exp_rc, sq_out, sq_rc = exp.wait(), sq.stdout.read().decode(errors="replace"), sq.wait()
        if exp_rc or sq_rc:
            raise OperationError(f"squashfs export of {image} failed (docker export {exp_rc}, mksquashfs {sq_rc}): "
                                 f"{sq_out.strip()[-500:]}")
        os.replace(tmp, out)
    finally:
        docker.rm(cid)
        tmp.unlink(missing_ok=True)
    return {"path": str(out), "bytes": out.stat().st_size, "seconds": round(time.monotonic() - t0, 1)}
