"""Option definitions the commands share, so that an option means the same everywhere.

``--source NAME=PATH`` is where upstream NAME's tree comes from (a wheel, a
checkout, a mirror or an unpacked tree) in every command; ``--series``,
``--workdir``, ``--only``, ``--cache``, ``--json`` and ``--lock-timeout`` too.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from .. import shell
from ..errors import UsageError
from ..files import write_json
from ..lock import LOCK_TIMEOUT
from ..series import repo
from ..series.manifest import EntryError, Series
from ..workspace.sourcepath import check_override
from ..workspace.sources import default_cache

EPILOG = ("exit codes: 0 success; 1 the operation failed and nothing was changed; "
          "2 bad usage, input or configuration")


class Parser(argparse.ArgumentParser):
    _quiet = False

    def error(self, message: str) -> None:  # argparse exits 2 too; keep our one message style
        if not self._quiet:
            self.print_usage(sys.stderr)
        raise UsageError(message)

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        # argparse reports missing required options before unknown ones, so `apply --bogus`
        # would say "--workdir is required". Look for unknown flags first, with nothing required.
        argv = sys.argv[1:] if args is None else [str(x) for x in args]
        if "-h" in argv or "--help" in argv:  # help is printed in the pass it appears in: the real one,
            return super().parse_args(args, namespace)  # where the required options show as required
        required = [a for a in self._actions if a.required]
        for a in required:
            a.required = False
        self._quiet = True
        try:
            _, extra = self.parse_known_args(args, namespace)
        except UsageError:
            extra = []  # some other problem: the real parse below reports it
        finally:
            self._quiet = False
            for a in required:
                a.required = True
        if extra:
            self.error(f"unrecognized arguments: {' '.join(extra)}")
        ns = super().parse_args(args, namespace)
        shell.record(self._given(ns), {f for act in self._actions for f in act.option_strings})
        return ns

    def _given(self, ns: argparse.Namespace) -> list[tuple[str, tuple[str, ...]]]:
        """What the user gave, option by option, for the hints that run this command again."""
        out = []
        for act in self._actions:
            if isinstance(act, argparse._HelpAction):
                continue
            val = getattr(ns, act.dest, None)
            if act.option_strings and (val is None or val is False or val == []
                                       or (val == act.default and act.dest != "series")):
                continue
            flag = max(act.option_strings, key=len) if act.option_strings else ""
            if val is True and act.nargs == 0:
                out.append((flag, ()))
            else:
                out += [(flag, (_word(v),)) for v in (val if isinstance(val, list) else [val])]
        return out


def _word(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def parser(prog: str, description: str, epilog: str = EPILOG) -> Parser:
    return Parser(prog=prog, description=description, epilog=epilog,
                  formatter_class=argparse.RawDescriptionHelpFormatter)


def add_series(p: argparse.ArgumentParser, default_note: str | None = None) -> None:
    """--series; its default is the repository's only series (or what ``default_note`` says)."""
    only = None if default_note else repo.default_series()
    if default_note:
        note = f"default: {default_note}"
    elif only:
        note = f"default: {only}, the only series in patches/"
    else:
        note = "required: patches/ holds more than one series"
    p.add_argument("--series", default=only, metavar="NAME|DIR",
                   help=f"a series: NAME for patches/NAME/series.toml, or a folder with series.toml ({note})")


def load_series(a: argparse.Namespace, *, check: bool = True) -> Series:
    if not a.series:
        raise UsageError("--series is required here", hint=f"series in patches/: {', '.join(repo.series_names())}")
    try:
        return repo.load_series(a.series, check=check)
    except EntryError as exc:
        exc.hint = f"{exc.hint}; `{repo.command('lint', None, '--series', a.series)}` lists every problem"
        raise


def directory(path: Path, flag: str) -> Path:
    """``path`` for a folder option: refused when it, or a folder above it, is not a directory."""
    for at in (path, *path.absolute().parents):
        if at.is_symlink() and not at.exists():
            raise UsageError(f"{flag} {path}: {at} is a symbolic link to {os.readlink(at)}, which does not exist",
                             hint=f"make the folder it points to ({shell.code('mkdir', '-p', at.parent / os.readlink(at))}), "
                                  f"or give {flag} another directory")
        if at.exists() or at.is_symlink():
            if not at.is_dir():
                where = "is a file, not a directory" if at == path else f"is under {at}, a file, not a directory"
                raise UsageError(f"{flag} {path} {where}",
                                 hint=f"give {flag} a directory (one that does not exist yet is made)")
            break
    return path


def _dir_type(flag: str):
    def convert(value: str) -> Path:
        try:
            return directory(Path(value), flag)
        except UsageError as exc:
            raise argparse.ArgumentTypeError(exc.message.removeprefix(f"{flag} ")) from None
    return convert


def add_workdir(p: argparse.ArgumentParser, *, required: bool = True, default: Path | None = None,
                help: str = "the work directory tools/apply.py made: DIR/<upstream> per upstream") -> None:
    p.add_argument("--workdir", required=required and default is None, default=default,
                   type=_dir_type("--workdir"), metavar="DIR", help=help)


def add_only(p: argparse.ArgumentParser, help: str = "comma-separated patch ids and/or upstream names") -> None:
    p.add_argument("--only", metavar="ID,UPSTREAM,...", help=help)


def add_sources(p: argparse.ArgumentParser, help: str | None = None) -> None:
    p.add_argument("--source", action="append", metavar="NAME=PATH",
                   help=help or "where upstream NAME's tree comes from: a wheel, a git checkout or mirror, "
                                "or an unpacked tree (repeat for several upstreams)")


def add_cache(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache", type=_dir_type("--cache"), metavar="DIR",
                   help="download and base cache (default $GTP_CARRY_CACHE or ~/.cache/gtp-carry)")


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", type=output_path("file"), metavar="FILE", help="also write the report as JSON to FILE")


def seconds(value: str) -> float:
    """A number of seconds to wait: finite and not negative (nan would wait forever)."""
    try:
        out = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not math.isfinite(out) or out < 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds (finite, 0 or more)")
    return out


def add_lock_timeout(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lock-timeout", type=seconds, default=LOCK_TIMEOUT, metavar="SECONDS",
                   help=f"how long to wait for another run on the same work directory ({LOCK_TIMEOUT:g})")


def add_timeout(p: argparse.ArgumentParser, default: float = 900.0) -> None:
    p.add_argument("--timeout", type=float, default=default, metavar="SECONDS",
                   help=f"seconds per proof run ({default:g})")


def cache(a: argparse.Namespace) -> Path:
    # Absolute: git runs with -C in scratch folders, where a relative cache path would name nothing.
    return directory(a.cache or default_cache(), "--cache" if a.cache else "the cache ($GTP_CARRY_CACHE)").absolute()


def name_paths(values: list[str] | None, flag: str) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for v in values or []:
        name, sep, path = v.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"{flag} expects NAME=PATH, got {v!r}",
                             hint=f"e.g. {flag} nemo-rl=PATH/TO/NeMo-RL (NAME is an upstream of the series)")
        if name in out:
            raise UsageError(f"{flag} {name} given twice")
        out[name] = Path(path)
    return out


def add_tests_source(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--tests-source", action="append", metavar="NAME=CLONE", help=help)


def tests_sources(a: argparse.Namespace, series: Series | None = None) -> dict[str, Path]:
    """--tests-source NAME=CLONE, absolute; with SERIES, each NAME an upstream of it (else a usage error)."""
    found = {name: path.absolute() for name, path in name_paths(a.tests_source, "--tests-source").items()}
    for name in found if series is not None else ():
        series.upstream(name)
    return found


def sources(a: argparse.Namespace, series: Series) -> dict[str, Path]:
    found = name_paths(a.source, "--source")
    for name, path in found.items():
        # an unknown name, or a path that is not there, is a usage error before any work
        check_override(series.upstream(name), path)
    return found


def output_path(kind: str):
    """An argparse type for an output FILE or DIR: refused at once when it cannot be written,
    so that a run does not fail only after its work is done."""
    def check(value: str) -> Path:
        path = Path(value)
        if kind == "file" and path.is_dir():
            raise argparse.ArgumentTypeError(f"{value} is a directory; give a file name")
        if kind == "dir" and path.exists() and not path.is_dir():
            raise argparse.ArgumentTypeError(f"{value} exists and is not a directory")
        above = path.absolute().parent
        while not above.exists():
            above = above.parent
        if not above.is_dir() or not os.access(above, os.W_OK | os.X_OK):
            raise argparse.ArgumentTypeError(f"{value} cannot be written ({above} is not a writable directory)")
        return path
    return check


def comma_list(value: str | None, flag: str = "--only") -> list[str] | None:
    if value is None:
        return None
    items = [x.strip() for x in value.split(",") if x.strip()]
    if not items:
        raise UsageError(f"{flag} needs at least one name")
    return items


def upstream_target(value: str, flag: str, series) -> tuple[str, str]:
    """NAME=VERSION_OR_COMMIT of --onto/--against: NAME must be an upstream of SERIES."""
    name, sep, target = value.partition("=")
    if not sep or not name or not target:
        raise UsageError(f"{flag} expects NAME=VERSION_OR_COMMIT, got {value!r}")
    series.upstream(name)  # a UsageError naming the known upstreams
    return name, target


def write_report(path: Path | None, doc: dict) -> None:
    if path is not None:
        write_json(path, doc)
