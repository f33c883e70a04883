"""What the GPU host would lack: each requirement that the staged wheels and the host leave unmet.

Two sets of requirements are checked, each against what the host will have and the waivers of its own
table in wheels.toml:
- each ``[[te]]`` file's own metadata (``te_uncovered``): step 20 installs the te ferry with --no-deps,
  so a requirement missing here is missing there; waived by ``[[te_without]]``;
- NeMo-RL's declared dependencies at the pin (``nrl_uncovered``, its pyproject.toml's
  ``[project].dependencies``): the run puts NeMo-RL's tree on the path and installs none of them, so a
  dependency neither staged nor on the host is missing on the GPU host (zstandard was, found by NeMo-RL's
  own tests on a GPU: h100/2026-12-05-upstream-tests); waived by ``[[nrl_without]]``.
A waiver that nothing asks for is named too: it waives nothing today and would hide a requirement added
later.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from carry.errors import ConfigError, IntegrityError

from .wheel_lock import Lock, Waiver


def marker_env(python: str) -> dict[str, str]:
    """The environment markers of the GPU host: CPython ``python`` on Linux x86_64, no extra."""
    return {"python_version": python, "python_full_version": f"{python}.0", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
            "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}


def unmet(who: str, lines: list[str], have: dict[str, str], waived: set[str], python: str, missing: str,
          gives: str) -> tuple[list[str], set[str]]:
    """(problems, names asked for) of WHO's requirement LINES: each that applies on the host (its marker)
    and that HAVE (canonical name -> version) does not meet, unless WAIVED. MISSING says where a name was
    not found, GIVES what gave a version that does not do."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name as canon

    env = marker_env(python)
    out, asked = [], set()
    for line in lines:
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            raise IntegrityError(f"{who}: a requirement it states cannot be read: {line!r} ({exc})") from None
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = canon(req.name)
        asked.add(name)
        if name in waived:
            continue
        version = have.get(name)
        if version is None:
            out.append(f"{who} requires {req}: {missing}")
        elif req.specifier and not req.specifier.contains(version, prereleases=True):
            out.append(f"{who} requires {req}: {name} {version} is what {gives} give")
    return out, asked


def _stale(table: str, waivers: tuple[Waiver, ...], asked: set[str], by: str) -> list[str]:
    from packaging.utils import canonicalize_name as canon
    return [f"[[{table}]] {w.name}: {by} requires it" for w in waivers if canon(w.name) not in asked]


def te_uncovered(lock: Lock, requirements: list[tuple[str, list[str]]]) -> list[str]:
    """Each runtime requirement of a [[te]] file ((pin, its Requires-Dist lines)) that neither [[te]] nor the
    host ([dryrun], its torch) meets, and no [[te_without]] waives."""
    from packaging.utils import canonicalize_name as canon

    have = {canon(a.name): a.version for a in lock.te}
    for name, version in dryrun_have(lock).items():
        have.setdefault(name, version)
    waived = {canon(w.name) for w in lock.te_without}
    out, asked = [], set()
    for who, lines in requirements:
        found, names = unmet(who, lines, have, waived, lock.python, "not in [[te]], not on the host ([dryrun])",
                             "the ferry and host")
        out += found
        asked |= names
    return out + _stale("te_without", lock.te_without, asked, "no [[te]] file")


def dryrun_have(lock: Lock) -> dict[str, str]:
    """What [dryrun] says the host has: its packages and its torch."""
    from packaging.utils import canonicalize_name as canon
    have = {canon(n): v for n, _, v in (p.partition("==") for p in lock.host_packages)}
    if lock.host_torch:
        have.setdefault("torch", lock.host_torch)
    return have


def measured_host(path: Path) -> dict[str, str]:
    """A measured package list of the GPU host (``name==version`` lines, ``#`` comments)."""
    from packaging.utils import canonicalize_name as canon
    have = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            if not sep:
                raise ConfigError(f"{path}: {line!r} is not name==version")
            have[canon(name)] = version.strip()
    return have


def declared_dependencies(pyproject: Path) -> list[str]:
    try:
        doc = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{pyproject}: cannot read NeMo-RL's declared dependencies ({exc})") from None
    deps = doc.get("project", {}).get("dependencies")
    if not isinstance(deps, list):
        raise ConfigError(f"{pyproject}: no [project].dependencies list")
    return [str(d) for d in deps]


def check_te_covered(lock: Lock, requirements: list[tuple[str, list[str]]]) -> None:
    problems = te_uncovered(lock, requirements)
    if problems:
        raise ConfigError(f"{lock.path}: the te ferry would leave TransformerEngine without what it requires "
                          f"(step 20 installs it with --no-deps):\n  " + "\n  ".join(problems),
                          hint="pin each in [[te]] (stage --relock writes its file and sha256), or name it in "
                               "[[te_without]] with why the GPU host does without it")


def nrl_uncovered(lock: Lock, pyproject: Path, host: Path) -> list[str]:
    """Each dependency NeMo-RL declares (PYPROJECT) that neither the staged wheels ([[wheel]], [[sdist]],
    [[te]]) nor the GPU host (HOST, its measured package list, and [dryrun]) meets, and no [[nrl_without]]
    waives; and each waiver no dependency asks for."""
    from packaging.utils import canonicalize_name as canon

    have = {canon(a.name): a.version for a in lock.wheels + lock.sdists + lock.te}
    for name, version in {**dryrun_have(lock), **measured_host(host)}.items():
        have.setdefault(name, version)
    waived = {canon(w.name) for w in lock.nrl_without}
    found, asked = unmet("nemo-rl", declared_dependencies(pyproject), have, waived, lock.python,
                         "not staged ([[wheel]], [[sdist]], [[te]]), not on the host (its measured list, [dryrun])",
                         "the stage and host")
    return found + _stale("nrl_without", lock.nrl_without, asked, "no dependency NeMo-RL declares")


def check_nrl_covered(lock: Lock, pyproject: Path, host: Path) -> None:
    problems = nrl_uncovered(lock, pyproject, host)
    if problems:
        raise ConfigError(f"{lock.path}: the GPU host would lack what NeMo-RL declares it depends on (the run "
                          f"installs none of it):\n  " + "\n  ".join(problems),
                          hint="stage each as a [[wheel]], or name it in [[nrl_without]] with why the GPU host "
                               "does without it")
