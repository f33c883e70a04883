"""Where an upstream's own unit tests come from, and how its CI launches them (``[upstreams.NAME.tests]``).

The wheels carry no tests, so the tests are pinned on their own: a git commit of the upstream's
repository (the one closest to the pinned release) and the paths of that checkout the tests need
(the tests, the repository's pytest configuration, the packages the tests import besides the one
under test), each with its git hash at that commit (``git rev-parse COMMIT:PATH``, a tree or a blob):
what runs is checked against those hashes, whether it comes from a clone or an unpacked folder.
``replace`` is the folder of that checkout that the tree under test stands in for (``megatron/core``):
the tests then run in the upstream's own layout, against the pristine base on one side and the
patched tree on the other. An upstream whose pinned
tree is itself a git checkout with its tests (NeMo-RL) says ``source = "tree"``: each side runs the
tests of its own tree (a patch may add a test or edit a reference file the tests read).

How they run is the upstream's own launch: ``torchrun --nproc-per-node N -m pytest`` (Megatron-LM,
whose unit tests read WORLD_SIZE/LOCAL_RANK) or plain ``pytest`` (Megatron-Bridge, NeMo-RL), with
the marker expression and options its CI passes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

LAUNCHES = ("torchrun", "pytest")
SOURCES = ("tree", "git")  # the tests of the tree under test, or a pinned commit
_HEX40 = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class TestsPin:
    upstream: str
    root: str                       # the folder the selection reads (tests/unit_tests)
    launch: str                     # torchrun | pytest
    source: str = "git"             # git | tree
    url: str | None = None
    ref: str | None = None          # for people: the branch or tag the commit was read from
    commit: str | None = None
    paths: tuple[tuple[str, str], ...] = ()  # (path, its git hash at the commit): what the tests need
    replace: str | None = None      # the checkout's folder the tree under test replaces
    nproc: int = 1                  # torchrun --nproc-per-node: upstream CI's ranks per node
    markers: str = ""               # pytest -m, as upstream CI passes it
    args: tuple[str, ...] = ()      # other pytest options upstream CI passes
    cwd: str = "."                  # where upstream CI starts pytest (NeMo-RL: tests/)
    package: str = ""               # the top package's folder, whose sub-folders the test folders mirror
    why: str = ""                   # where the pin and the launch were read from

    @property
    def path_names(self) -> tuple[str, ...]:
        return tuple(p for p, _ in self.paths)

    def describe(self) -> str:
        if self.source == "tree":
            return "the tests of each side's own tree"
        return f"{self.url}@{self.commit[:12]} ({self.ref or 'commit'})"


def load_tests(t: Any, upstream: str) -> TestsPin:
    """The ``[upstreams.NAME.tests]`` table (a carry.series.manifest._Table) as a TestsPin."""
    t.check_keys(["source", "url", "ref", "commit", "paths", "replace", "root", "launch", "nproc",
                  "markers", "args", "cwd", "package", "why"])
    where = f"{t.path}: [{t.where}]"
    source = t.get("source", str, "git")
    if source not in SOURCES:
        raise ConfigError(f"{where} source must be \"git\" (a pinned commit) or \"tree\" (the tests of the tree "
                          f"under test), got {source!r}")
    launch = t.get("launch", str, required=True)
    if launch not in LAUNCHES:
        raise ConfigError(f"{where} launch must be one of {', '.join(LAUNCHES)}, got {launch!r}")
    nproc = t.get("nproc", int, 1)
    if isinstance(nproc, bool) or nproc < 1 or (launch == "pytest" and nproc != 1):
        raise ConfigError(f"{where} nproc must be a positive integer (1 for launch = \"pytest\"), got {nproc!r}")
    root = _relative(t.get("root", str, required=True), where, "root")
    cwd = _relative(t.get("cwd", str, "."), where, "cwd") if t.get("cwd", str, ".") != "." else "."
    if cwd != "." and not root.startswith(cwd + "/"):
        raise ConfigError(f"{where} root {root!r} is not inside cwd {cwd!r}: pytest is started in cwd")
    package = t.get("package", str, None)
    package = _relative(package, where, "package") if package is not None else None
    pin = TestsPin(upstream, root, launch, source, nproc=nproc, markers=t.get("markers", str, ""),
                   args=t.strings("args"), cwd=cwd, package=package or "", why=t.get("why", str, ""))
    if source == "tree":
        if not package:
            raise ConfigError(f"{where} source = \"tree\" needs package = \"...\": the folder of the top package, "
                              f"whose sub-folders the test folders mirror")
        extra = [k for k in ("url", "ref", "commit", "paths", "replace") if k in t.data]
        if extra:
            raise ConfigError(f"{where} source = \"tree\" takes the tests from the tree under test: "
                              f"{', '.join(extra)} would say otherwise", hint=f"drop {', '.join(extra)}")
        return pin
    commit = t.get("commit", str, required=True)
    if not _HEX40.match(commit):
        raise ConfigError(f"{where} commit must be 40 lowercase hex digits, got {commit[:50]!r}")
    raw = t.get("paths", dict, required=True)
    paths = []
    for path, digest in raw.items():
        if not isinstance(digest, str) or not _HEX40.match(digest):
            raise ConfigError(f"{where} paths: {path!r} needs its git hash (40 lowercase hex digits)",
                              hint=f"git rev-parse {commit}:{path}")
        paths.append((_relative(path, where, "paths"), digest))
    if not paths:
        raise ConfigError(f"{where} needs paths = {{ PATH = HASH, ... }}: what of the checkout the tests need")
    names = [p for p, _ in paths]
    if not any(root == p or root.startswith(p.rstrip("/") + "/") for p in names):
        raise ConfigError(f"{where} root {root!r} is not inside any of paths {names}")
    replace = _relative(t.get("replace", str, required=True), where, "replace")
    return TestsPin(upstream, root, launch, source, t.get("url", str, required=True), t.get("ref", str, None),
                    commit, tuple(paths), replace, nproc, pin.markers, pin.args, cwd, package or replace, pin.why)


def _relative(value: str, where: str, key: str) -> str:
    parts = value.strip("/").split("/")
    if not value.strip("/") or value.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ConfigError(f"{where} {key} {value!r} must be a relative path inside the checkout")
    return "/".join(parts)
