"""wheels.toml: every artifact the GPU host lacks, pinned by file name and sha256.

Seven tables:
- ``[[wheel]]``: a wheel taken from the package index as it is, or with
  ``drop`` globs removed (ray's Java jars: the run has no Java workers);
- ``[[sdist]]``: a source distribution (antlr4 4.9.3 has no wheel), built
  into a wheel by the stage;
- ``[[te]]``: TransformerEngine for the GPU host, carried as the files the
  index serves (the image's step 20 installs them offline there): its wheels,
  the cuDNN frontend, pybind11 (to build with), and the torch extension's source
  distribution (``.tar.gz``), which only the host can build, against its own
  torch and CUDA;
- ``[[tests]]``: what the upstreams' own unit tests import that the host's stack lacks (upstream
  CI installs it: Megatron-LM's own lock's version), carried in the tests ferry and installed for those
  tests alone, on their path, never into the run's venv (tools/upstream_tests.py, issue 39);
- ``[[te_without]]``: a requirement of a ``[[te]]`` file that the ferry does
  not carry although the host list lacks it, each with why (the stage refuses
  any other: :func:`harness.staging.coverage.te_uncovered`);
- ``[[nrl_without]]``: a dependency NeMo-RL declares that neither the stage nor
  the host has, each with why the run does without it (the stage refuses any
  other: :func:`harness.staging.coverage.nrl_uncovered`);
- ``[dryrun]``: what the GPU host already has (its image's package list and
  the versions read there), for the CPU dry-run's stand-in of that host.

The file is written by :func:`render` (``stage --relock`` refreshes the hashes),
so it stays in one canonical form.
"""

from __future__ import annotations

import fnmatch
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

from carry.errors import ConfigError, IntegrityError
from carry.series.manifest import _suggest
from carry.workspace.artifacts import sha256_file


@dataclass(frozen=True)
class Artifact:
    name: str
    version: str
    file: str
    sha256: str
    why: str = ""
    drop: tuple[str, ...] = ()

    @property
    def pin(self) -> str:
        return f"{self.name}=={self.version}"

    def dropped(self, member: str) -> bool:
        return any(fnmatch.fnmatch(member, pat) for pat in self.drop)


@dataclass(frozen=True)
class Waiver:
    """A requirement (of a [[te]] file, or one NeMo-RL declares) the stage does not carry, and why that is right."""
    name: str
    why: str


@dataclass(frozen=True)
class Lock:
    path: Path
    python: str
    platforms: tuple[str, ...]
    wheels: tuple[Artifact, ...]
    sdists: tuple[Artifact, ...]
    te: tuple[Artifact, ...] = ()
    host_python: str = "3.12"
    host_torch: str = ""
    host_packages: tuple[str, ...] = field(default_factory=tuple)
    te_without: tuple[Waiver, ...] = ()
    nrl_without: tuple[Waiver, ...] = ()
    tests: tuple[Artifact, ...] = ()

    @property
    def artifacts(self) -> tuple[Artifact, ...]:
        return self.wheels + self.sdists

    def pip_requirements(self, which: tuple[Artifact, ...]) -> str:
        """pip's hash-checking form of some pins (``--require-hashes -r FILE``)."""
        return "".join(f"{a.pin} --hash=sha256:{a.sha256}\n" for a in which)


def is_sdist(a: Artifact) -> bool:
    return a.file.endswith((".tar.gz", ".zip"))


def _keys(table: dict, allowed: list[str], where: str, path: Path) -> None:
    for key in table:
        if key not in allowed:
            raise ConfigError(f"{path}: [{where}] has an unknown key {key!r}", hint=_suggest(key, allowed))


def _artifact(raw: dict, where: str, path: Path) -> Artifact:
    _keys(raw, ["name", "version", "file", "sha256", "why", "drop"], where, path)
    try:
        a = Artifact(str(raw["name"]), str(raw["version"]), str(raw["file"]), str(raw["sha256"]),
                     str(raw.get("why", "")), tuple(raw.get("drop", ())))
    except KeyError as exc:
        raise ConfigError(f"{path}: [{where}] needs {exc.args[0]!r}") from None
    if len(a.sha256) != 64 or any(c not in "0123456789abcdef" for c in a.sha256):
        raise ConfigError(f"{path}: [{where}] {a.pin}: sha256 must be 64 lowercase hex digits",
                          hint="run the stage with --relock to fill it in")
    return a


def load(path: Path) -> Lock:
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"no wheel lock at {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    _keys(raw, ["target", "wheel", "sdist", "te", "tests", "te_without", "nrl_without", "dryrun"], "<top>", path)
    target = raw.get("target", {})
    _keys(target, ["python", "platforms"], "target", path)
    dry = raw.get("dryrun", {})
    _keys(dry, ["python", "torch", "packages"], "dryrun", path)
    wheels = tuple(_artifact(w, f"wheel {i}", path) for i, w in enumerate(raw.get("wheel", [])))
    sdists = tuple(_artifact(s, f"sdist {i}", path) for i, s in enumerate(raw.get("sdist", [])))
    te = tuple(_artifact(t, f"te {i}", path) for i, t in enumerate(raw.get("te", [])))
    tests = tuple(_artifact(t, f"tests {i}", path) for i, t in enumerate(raw.get("tests", [])))
    waivers = {table: _waivers(raw, table, path) for table in ("te_without", "nrl_without")}
    names = [a.name.lower() for a in wheels + sdists + te + tests]   # one path gets them all: one version each
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"{path}: pinned more than once: {', '.join(dup)}")
    return Lock(path, str(target.get("python", "3.12")), tuple(target.get("platforms", ())), wheels, sdists, te,
                str(dry.get("python", "3.12")), str(dry.get("torch", "")), tuple(dry.get("packages", ())),
                waivers["te_without"], waivers["nrl_without"], tests)


def _waivers(raw: dict, table: str, path: Path) -> tuple[Waiver, ...]:
    out = []
    for i, w in enumerate(raw.get(table, [])):
        _keys(w, ["name", "why"], f"{table} {i}", path)
        if not w.get("name") or not w.get("why"):
            raise ConfigError(f"{path}: {table} {i} needs a name and why the GPU host does without it")
        out.append(Waiver(str(w["name"]), str(w["why"])))
    return tuple(out)


def check_file(path: Path, a: Artifact) -> None:
    """The file must be the pinned artifact: its name and its sha256."""
    if path.name != a.file:
        raise IntegrityError(f"{a.pin}: expected the file {a.file}, got {path.name}")
    got = sha256_file(path)
    if got != a.sha256:
        raise IntegrityError(f"{a.pin}: {path.name} has sha256 {got}, the lock says {a.sha256}",
                             hint="the index served other bytes than were pinned: find out why before relocking")


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render(lock: Lock) -> str:
    out = ["# Wheels the GPU host lacks for NeMo-RL's GRPO + Megatron path (integration/README.md).",
           "# Written by integration/nemo_rl_gtp/stage --relock; hand edits: names, versions, why, drop.",
           "", "[target]", f"python = {_q(lock.python)}",
           "platforms = [" + ", ".join(_q(p) for p in lock.platforms) + "]", ""]
    for kind, items in (("wheel", lock.wheels), ("sdist", lock.sdists), ("te", lock.te), ("tests", lock.tests)):
        for a in items:
            out += [f"[[{kind}]]", f"name = {_q(a.name)}", f"version = {_q(a.version)}", f"file = {_q(a.file)}",
                    f"sha256 = {_q(a.sha256)}"]
            if a.why:
                out.append(f"why = {_q(a.why)}")
            if a.drop:
                out.append("drop = [" + ", ".join(_q(d) for d in a.drop) + "]")
            out.append("")
    for table, waivers in (("te_without", lock.te_without), ("nrl_without", lock.nrl_without)):
        for w in waivers:
            out += [f"[[{table}]]", f"name = {_q(w.name)}", f"why = {_q(w.why)}", ""]
    out += ["[dryrun]", f"python = {_q(lock.host_python)}", f"torch = {_q(lock.host_torch)}", "packages = ["]
    out += [f"  {_q(p)}," for p in lock.host_packages]
    out += ["]", ""]
    return "\n".join(out)


def with_artifact(lock: Lock, new: Artifact) -> Lock:
    """The lock with one artifact's file and hash replaced (relocking)."""
    swap = lambda items: tuple(new if a.name == new.name else a for a in items)  # noqa: E731
    return replace(lock, wheels=swap(lock.wheels), sdists=swap(lock.sdists), te=swap(lock.te), tests=swap(lock.tests))
