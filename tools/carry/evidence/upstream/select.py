"""Which of an upstream's own test files meet what the series touches: derived, never a hand list.

A test file is selected, with each reason kept, when
- it imports a module a patch of the series changes (``import m``, ``from m import x``, ``from pkg
  import m``): the test calls the changed code by name;
- it is a test file a patch adds or changes;
- it names a non-Python file a patch changes (a config the test reads: by its file name, or by its
  folder's for a file among the tests);
- it lies in the test folder that mirrors a changed module's package (``megatron/core/transformer/
  moe/experts.py`` -> ``tests/unit_tests/transformer/moe/``), or is ``test_<module>.py`` for a
  module at the package's top: the owners' own tests of that code, reaching it through the models
  that use it rather than by import.
The order is the run's order: files that import changed code first (those importing a changed module
few tests import before those importing one nearly all do), the mirror folders last, so that a run
cut short by its time budget has run the closest tests.
"""

from __future__ import annotations

import ast
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from ...series.manifest import Series
from ...series.patchfile import parse_file

RANK = {"imports": 0, "changed": 1, "names": 2, "mirror": 3}


@dataclass
class Picked:
    path: str                       # relative to the suite's root folder (the checkout)
    reasons: list[str] = field(default_factory=list)
    reach: int = 0                  # how many selected files import its most specific changed module

    @property
    def rank(self) -> int:
        return min(RANK[r.split(" ", 1)[0]] for r in self.reasons)


def touched_files(series: Series, upstream: str) -> dict[str, list[str]]:
    """Repository path -> the ids of the patches of ``upstream`` that change it."""
    out: dict[str, list[str]] = {}
    for p in series.patches_for(upstream):
        for f in parse_file(series.patch_path(p)).files:
            for path in {f.old_path, f.new_path} - {None}:
                out.setdefault(path, []).append(p.id)
    return out


def module_of(path: str, python_path: str) -> str | None:
    """``megatron/core/utils.py`` -> ``megatron.core.utils`` (None for a file that is no module)."""
    if not path.endswith(".py"):
        return None
    prefix = "" if python_path in (".", "") else python_path.rstrip("/") + "/"
    if prefix and not path.startswith(prefix):
        return None
    parts = path[len(prefix):-3].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_test_file(name: str) -> bool:
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))


def imported_modules(source: str) -> set[str]:
    """Every module a file's imports can name, ``from pkg import m`` giving ``pkg.m`` too."""
    try:
        with warnings.catch_warnings():   # upstream's own "\\i" in a plain string is its business, not a line of ours
            warnings.simplefilter("ignore", SyntaxWarning)       # Python >= 3.12
            warnings.simplefilter("ignore", DeprecationWarning)  # the same before 3.12
            tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    mods: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mods.add(node.module)
            mods.update(f"{node.module}.{a.name}" for a in node.names)
    return mods


def select(series: Series, upstream: str, suite: Path, root: str, package: str) -> list[Picked]:
    """The selected test files under ``suite/root``, closest first, each with its reasons.

    ``package`` is the folder of the upstream's top package in the checkout (``megatron/core``,
    ``src/megatron/bridge``, ``nemo_rl``): the mirror rule maps its sub-folders onto ``root``'s.
    """
    u = series.upstream(upstream)
    touched = touched_files(series, upstream)
    modules = {m: path for path in touched if (m := module_of(path, u.python_path))}
    picked: dict[str, Picked] = {}

    def pick(rel: str, why: str) -> None:
        entry = picked.setdefault(rel, Picked(rel))
        if why not in entry.reasons:
            entry.reasons.append(why)

    base = suite / root
    files = sorted(p for p in base.rglob("*.py") if is_test_file(p.name) and "__pycache__" not in p.parts)
    for f in files:
        rel = f.relative_to(suite).as_posix()
        text = f.read_text(encoding="utf-8", errors="replace")
        for mod in sorted(imported_modules(text) & modules.keys()):
            pick(rel, f"imports {mod} ({', '.join(touched[modules[mod]])})")
        if rel in touched:
            pick(rel, f"changed by {', '.join(touched[rel])}")
        for path in sorted(p for p in touched if not p.endswith(".py")):
            for name in _names(path, root):
                if name in text:
                    pick(rel, f"names {name} ({', '.join(touched[path])})")
    for path in sorted(touched):
        for rel in _mirrored(path, package, root, suite):
            pick(rel, f"mirror of {path} ({', '.join(touched[path])})")
    # Within a rule, the most specific first: a file importing a changed module that few tests
    # import (generalized_tensor_parallelism) before one whose changed import nearly all share (utils).
    importers: dict[str, int] = {}
    for entry in picked.values():
        for mod in _imports_of(entry):
            importers[mod] = importers.get(mod, 0) + 1
    for entry in picked.values():
        entry.reach = min((importers[m] for m in _imports_of(entry)), default=len(picked))
    return sorted(picked.values(), key=lambda p: (p.rank, p.reach, p.path))


def _imports_of(entry: Picked) -> list[str]:
    return [r.split(" ", 2)[1] for r in entry.reasons if r.startswith("imports ")]


def _names(path: str, root: str) -> list[str]:
    """What a test would write to read a changed data file: its name, and for a file in a folder of
    the tests (``tests/unit/reference_configs/x.yaml``) that folder's name."""
    names = [Path(path).name]
    inner = path[len(root) + 1:].split("/") if path.startswith(root + "/") else []
    if len(inner) > 1:
        names.append(inner[0])
    return names


def _mirrored(path: str, package: str, root: str, suite: Path) -> list[str]:
    """The test files that mirror a changed module of the package (none for other files)."""
    prefix = package.rstrip("/") + "/"
    if not path.endswith(".py") or not path.startswith(prefix):
        return []
    inner = path[len(prefix):].split("/")
    if len(inner) == 1:  # a module at the package's top: its own test file only
        own = suite / root / f"test_{inner[0]}"
        return [own.relative_to(suite).as_posix()] if own.is_file() else []
    folder = suite / root / "/".join(inner[:-1])
    if not folder.is_dir():
        return []
    return sorted(p.relative_to(suite).as_posix() for p in folder.rglob("*.py")
                  if is_test_file(p.name) and "__pycache__" not in p.parts)
