"""This repository: where its series live, and how to spell one of its commands for a person.

Every ``next:`` hint that names one of our commands is spelled here, in full
(``--series`` included, and the user's own shared options) and runnable as
written from the directory the user is in, quoted by carry.shell, so that the
hints and the README agree with the real command line.
"""

from __future__ import annotations

import re
from pathlib import Path

from .. import shell
from ..errors import UsageError
from . import manifest, retirement

REPO_ROOT = Path(__file__).resolve().parents[3]
PATCHES = REPO_ROOT / "patches"


def series_names() -> list[str]:
    return sorted(p.parent.name for p in PATCHES.glob("*/series.toml"))


def default_series() -> str | None:
    """The repository's series when it has exactly one (then ``--series`` may be left out)."""
    names = series_names()
    return names[0] if len(names) == 1 else None


def series_dir(value: str) -> Path:
    """``--series``: a name (a folder patches/NAME/) or a path to a folder with series.toml."""
    path = Path(value)
    if "/" in value or (path.is_dir() and (path / "series.toml").exists()):
        return path.resolve()
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", value):
        raise UsageError(f"bad series name {value!r}")
    return PATCHES / value


def load_series(value: str, *, check: bool = True) -> manifest.Series:
    """The series ``--series`` names, once a retirement a killed run left is finished (carry.series.retirement)."""
    root = series_dir(value)
    retirement.recover(root)
    return manifest.load(root, check=check)


def series_arg(series: manifest.Series) -> str:
    """How --series names this series: its name when it is one of ours, else its folder."""
    return series.name if series.root.resolve() == (PATCHES / series.name).resolve() else str(series.root)


def command(verb: str, series: manifest.Series | None, *args: object) -> str:
    """``python3 tools/<verb>.py --series S ARGS...``, quoted for a POSIX shell (carry.shell), with
    the user's own options that mean the same there (--source, --cache, --workdir...) unless
    ``args`` gives them."""
    parts: list[object] = [*shell.tool(verb)]
    if series is not None:
        parts += ["--series", series_arg(series)]
    parts += list(args)
    given = {str(a).partition("=")[0] for a in args if str(a).startswith("--")}
    parts += shell.carried(verb, given)
    return shell.line(*parts)
