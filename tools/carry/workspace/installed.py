"""A tree as its pinned wheel installs it, for code that runs from a tree.

apply lays an upstream's wheel out in the git layout and leaves out what the pin's ``exclude``
names (series.toml ``[upstreams.NAME.pypi]``): compiled files are no source to patch. An install
of that wheel has them, and its code uses them: megatron-core's ``compile_helpers()`` imports the
compiled dataset helpers (``megatron/core/datasets/helpers_cpp*.so``) on a wheel install, so a
test run from a tree without them fails on rank 0 where every user's install passes, on both
sides alike, and reads as upstream's own failure. :class:`Installed` puts those members back
into the trees a run extracts (never into a workspace): read from the pinned wheel for the
interpreter the code runs in, the same bytes on both sides (a series edits sources).
"""

from __future__ import annotations

from pathlib import Path

from .. import progress
from ..errors import UsageError
from ..runner import run
from ..series.manifest import Artifact, Series, Upstream
from .artifacts import fetch_artifact, left_out_members

_ASK = "import platform, sys; print(sys.implementation.name, sys.version_info[0], sys.version_info[1], platform.machine())"


def interpreter(python: str) -> tuple[str, int, int, str]:
    """(implementation, major, minor, machine) of ``python``."""
    res = run([python, "-c", _ASK], check=False)
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()] if res.ok else []
    parts = lines[-1].split() if lines else []   # the last line: a sitecustomize may print before it
    if len(parts) != 4:
        raise UsageError(f"cannot ask {python} which Python it is: {(res.stderr or res.stdout).strip()[-300:]}",
                         hint="pass --python an interpreter that runs")
    return parts[0], int(parts[1]), int(parts[2]), parts[3]


def wheel_for(art: Artifact, python: tuple[str, int, int, str]) -> bool:
    """Whether ``art``'s wheel tags take this interpreter (its Python tag, ABI and platform)."""
    if not art.file.endswith(".whl"):
        return False
    parts = art.file[:-4].split("-")
    if len(parts) < 5:
        return False
    impl, major, minor, machine = python
    pytags, abi, plats = parts[-3].split("."), parts[-2], parts[-1]
    short = {"cpython": "cp", "pypy": "pp"}.get(impl, impl)   # the wheel tags' abbreviations (PEP 425)
    exact = f"{short}{major}{minor}" in pytags
    generic = f"py{major}" in pytags or f"py{major}{minor}" in pytags
    # an abi3 wheel tagged cp3N serves CPython 3.N and later
    stable = abi == "abi3" and any(t.startswith(f"{short}{major}") and t[len(short) + 1:].isdigit()
                                    and int(t[len(short) + 1:]) <= minor for t in pytags)
    platform_ok = plats == "any" or any(p.endswith(machine) for p in plats.split("."))
    return (exact or generic or stable) and platform_ok


class Installed:
    """Completes the trees a run extracts: ``installed(upstream, tree)`` writes the members that
    upstream's install has and the git layout leaves out into ``tree`` (those it lacks). The wheel is
    found (in the cache, else downloaded once) on the first tree of each upstream that needs one."""

    def __init__(self, series: Series, python: str, cache: Path):
        self.series, self.python, self.cache = series, python, cache
        self._who: tuple[str, int, int, str] | None = None
        self._members: dict[str, dict[str, tuple[bytes, int]]] = {}
        self.added: dict[str, dict] = {}   # upstream -> {"wheel": file, "members": [...]}: for the report

    def members(self, upstream: Upstream) -> dict[str, tuple[bytes, int]]:
        pypi = upstream.pypi
        if pypi is None or not pypi.exclude:
            return {}
        if upstream.name not in self._members:
            if self._who is None:
                self._who = interpreter(self.python)
            fits = [a for a in pypi.artifacts if wheel_for(a, self._who)]
            if not fits:
                impl, major, minor, machine = self._who
                raise UsageError(
                    f"{upstream.name}: the code under test runs on {impl} {major}.{minor} ({machine}), and no pinned "
                    f"wheel of {pypi.name} is built for it ({', '.join(a.file for a in pypi.artifacts)}): its trees "
                    f"would lack what an install holds and the pin's exclude ({', '.join(pypi.exclude)}) leaves out of "
                    "the git layout",
                    hint="run on a Python a pinned wheel is built for (--python), or pin that Python's wheel in "
                         f"[upstreams.{upstream.name}.pypi]")
            art = next((a for a in fits if a.tree), fits[0])
            wheel = fetch_artifact(upstream.name, pypi, art, self.cache)
            self._members[upstream.name] = left_out_members(wheel, pypi)
            if self._members[upstream.name]:
                self.added[upstream.name] = {"wheel": art.file, "members": sorted(self._members[upstream.name])}
                progress.say(f"{upstream.name}: the trees under test get what {art.file} installs and the git layout "
                             f"leaves out: {', '.join(sorted(self._members[upstream.name]))}")
        return self._members[upstream.name]

    def __call__(self, upstream: str, tree: Path) -> None:
        for rel, (data, mode) in self.members(self.series.upstream(upstream)).items():
            target = tree / rel
            if target.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            target.chmod(mode)
