"""Commands for a person to paste: every command a ``next:`` hint (or a report line) prints is
spelled here, so that a path with a space, a quote, a ``$``, a backtick, a newline or a leading
``-`` is one word of the command it is in, and means that path.

- ``quote`` makes one word for a POSIX shell: bare when it holds nothing a shell reads, else
  single-quoted, else (a newline, a backtick, a control byte) ``$'...'`` with escapes, so the
  hint stays on one line and its backticks stay the command's delimiters; a ``Path`` that
  starts with ``-`` gets ``./`` (no command takes it for an option);
- ``code`` is one whole command in backticks, ``Raw`` the shell syntax written as is (``&&``,
  ``NAME=VALUE`` before a command);
- ``tool`` spells ``tools/<verb>.py`` with the interpreter that runs it: ``python3``, or the
  running one when ``python3`` on PATH is not of its environment (an unactivated venv);
- ``again`` is the command that is running, as the user gave it, with some options changed:
  "run the command again with ..." as a whole command. ``carried`` gives the user's own
  options (``--source``, ``--cache``, ``--workdir``...) to a hint that names another of our
  commands, where the option means the same there.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

_BARE = re.compile(r"[A-Za-z0-9_./=:,+@%-]+")


class Raw(str):
    """Shell syntax, written as is: an operator (``&&``) or an assignment before a command."""


def _ansi_c(text: str) -> str:
    out = []
    for ch in text:
        if ch in "\\'":
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ch in "`!" or not ch.isprintable():  # ! : no history expansion where a person pastes it
            out += [f"\\x{b:02x}" for b in ch.encode("utf-8", "surrogateescape")]
        else:
            out.append(ch)
    return "$'" + "".join(out) + "'"


def quote(arg: object) -> str:
    """One shell word that means ``arg`` exactly."""
    if isinstance(arg, Raw):
        return str(arg)
    text = os.fspath(arg) if isinstance(arg, os.PathLike) else str(arg)
    if isinstance(arg, os.PathLike) and text.startswith("-"):
        text = "./" + text
    if _BARE.fullmatch(text):
        return text
    if "`" in text or not text.isprintable():
        return _ansi_c(text)
    return shlex.quote(text)


def shown(text: object) -> str:
    """``text`` as a message shows it: as it is where every character prints, else as one shell word
    ($'...'), so that a name holding a newline keeps its message on one line."""
    text = os.fspath(text) if isinstance(text, os.PathLike) else str(text)
    return text if text.isprintable() else _ansi_c(text)


def line(*argv: object) -> str:
    """A command, each argument one word."""
    return " ".join(quote(a) for a in argv)


def code(*argv: object) -> str:
    """A command as a hint shows it: in backticks, runnable as written."""
    return f"`{line(*argv)}`"


# -- our own commands -------------------------------------------------------------------------
def python() -> str:
    """The interpreter a pasted command should use: the one running now, named as short as is true."""
    if sys.prefix == sys.base_prefix:
        return "python3"  # not a venv: python3 on PATH is the Python the user runs
    found = shutil.which("python3")
    if found and Path(found).parent.absolute() == Path(sys.executable).parent.absolute():
        return "python3"  # the venv is active
    rel = _from_here(Path(sys.executable))
    return rel if "/" in rel else sys.executable


def _from_here(path: Path) -> str:
    """``path`` relative to the current directory when it is below it, else absolute."""
    try:
        rel = os.path.relpath(path)
    except OSError:  # the current directory was removed
        return str(path)
    return rel if not rel.startswith("..") else str(path)


def tool(verb: str) -> list[str]:
    """``python3 tools/<verb>.py`` as reachable from the current directory."""
    return [python(), _from_here(REPO_ROOT / "tools" / f"{verb.replace('-', '_')}.py")]


@dataclass(frozen=True)
class Invocation:
    verb: str
    # (flag, values) in the parser's order; a positional has flag "", a switch no values
    options: tuple[tuple[str, tuple[str, ...]], ...]
    accepts: frozenset[str]  # every flag the command takes


_running: str | None = None
_invocation: Invocation | None = None

# Options that mean the same in these commands: a hint naming one of them carries the user's value.
SHARED = {
    "--source": {"apply", "retire", "rebase", "nightly"},
    "--cache": {"apply", "prove", "retire", "rebase", "nightly", "build-image"},
    "--workdir": {"apply", "export", "prove", "retire"},
    "--lock-timeout": {"apply", "export", "prove"},
    "--only": {"apply", "prove"},  # patch ids and upstream names, their requires added, in both
}


def running(verb: str | None) -> None:
    """carry.cli: the verb now running (None when it is done)."""
    global _running, _invocation
    _running, _invocation = verb, None


def record(options: list[tuple[str, tuple[str, ...]]], accepts: set[str]) -> None:
    """carry.commands.options: what the running command was given, once parsed, and what it takes."""
    global _invocation
    if _running is not None:
        _invocation = Invocation(_running, tuple(options), frozenset(accepts))


def values(flag: str) -> list[str]:
    """The running command's values of ``flag`` (each --source NAME=PATH, say)."""
    inv = _invocation
    return [v for f, vals in (inv.options if inv else ()) for v in vals if f == flag]


def carried(verb: str, skip: set[str]) -> list[str]:
    """The user's own shared options, as arguments for a hint that runs ``verb``."""
    inv = _invocation
    if inv is None:
        return []
    out: list[str] = []
    for flag, vals in inv.options:
        if flag not in skip and verb in SHARED.get(flag, ()) and inv.verb in SHARED[flag]:
            out += _spell(flag, vals)
    return out


def unless_own(flag: str, value: str) -> list[str]:
    """``flag value`` for a hint's command, unless the user gave the running command ``flag``:
    then none, and carried() spells the user's own (prove --only a,b: apply --only a,b, not
    --only a, which would drop b)."""
    return [] if values(flag) else [flag, value]


def _spell(flag: str, vals: tuple[str, ...]) -> list[str]:
    if not flag:
        return list(vals)
    if not vals:
        return [flag]
    # A value that starts with "-" would read as an option: it goes in the flag's word.
    return [w for v in vals for w in ([f"{flag}={v}"] if v.startswith("-") else [flag, v])]


def again(changes: dict[str, list[str] | None]) -> str | None:
    """The running command, as the user gave it, with each flag of ``changes`` given those values
    (None or []: left out), in backticks; None when no command is running (a library call) or the
    running one does not take such a flag."""
    inv = _invocation
    if inv is None or any(vals and flag not in inv.accepts for flag, vals in changes.items()):
        return None
    args: list[str] = []
    done = set()
    for flag, vals in inv.options:
        if flag not in changes:
            args += _spell(flag, vals)
        elif flag not in done:
            args += _spell(flag, tuple(changes[flag] or ())) if changes[flag] else []
            done.add(flag)
    for flag, new in changes.items():
        if flag not in done and new:
            args += _spell(flag, tuple(new))
    return code(*tool(inv.verb), *args)


def with_named(flag: str, name: str, value: str) -> list[str]:
    """The running command's NAME=... values of ``flag`` with NAME's set to ``value``."""
    return [v for v in values(flag) if v.partition("=")[0] != name] + [f"{name}={value}"]


def with_source(name: str, what: str) -> str:
    """"run the command again with --source NAME=PATH" as a whole command: PATH, ``what``, is the
    one word a person fills in."""
    cmd = again({"--source": with_named("--source", name, "PATH")})
    if cmd is None:
        return f"run the command again with --source {name}=PATH, PATH {what}"
    return f"{cmd} (PATH: {what})"


def run_as(verb: str) -> str | None:
    """Our command ``verb`` on the running command's series, with the options it shares with it,
    in backticks; None when no command is running."""
    inv = _invocation
    if inv is None:
        return None
    series = [w for f, vals in inv.options if f == "--series" for w in _spell(f, vals)]
    return code(*tool(verb), *series, *carried(verb, set()))


def release_instead(flag: str, name: str) -> str:
    """Retire or rebase against a release of ``name`` (VERSION filled in), or its wheel (WHEEL)."""
    version = again({flag: [f"{name}=VERSION"], "--source": [v for v in values("--source")
                                                               if v.partition("=")[0] != name]})
    wheel = again({"--source": with_named("--source", name, "WHEEL")})
    if version is None or wheel is None:
        return f"give a release: {flag} {name}=VERSION, or its wheel with --source {name}=WHEEL"
    return f"give a release: {version}, VERSION a release of {name} on the index, or its wheel: {wheel}"


def run_again() -> str:
    """"run the command again", with that command when one is running."""
    cmd = again({})
    return f"run the command again: {cmd}" if cmd else "run the command again"
