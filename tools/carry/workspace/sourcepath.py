"""What a ``--source NAME=PATH`` names: a wheel, a git checkout (or bare repository) or an
unpacked tree of the upstream, checked before anything is downloaded or built; and whether a pin
can move to it (retire --write, rebase)."""

from __future__ import annotations

from pathlib import Path

from .. import shell
from ..errors import UsageError
from ..series.manifest import Upstream


def check_override(upstream: Upstream, path: Path) -> None:
    """``--source NAME=PATH`` names something that exists: checked before any download or build."""
    if path.expanduser().exists():
        if path.expanduser().is_dir() and not is_git(path.expanduser()):
            _check_tree_is(upstream, path.expanduser())
        return
    name, g = upstream.name, upstream.git
    if g and g.commit and upstream.sources[0] == "git":
        hint = (f"{shell.code('git', 'clone', g.url, path, shell.Raw('&&'), 'git', '-C', path, 'checkout', '-q', g.commit)}"
                f" makes one, then {shell.again({}) or 'run the command again'}; or leave --source {name}=... out")
    elif upstream.pypi:
        hint = (f"PATH is a wheel, a checkout or an unpacked tree of {upstream.pypi.name} {upstream.pypi.version}; "
                f"or leave --source {name}=... out to download the pinned wheel")
    else:
        hint = f"PATH is a checkout or an unpacked tree of {name}"
    raise UsageError(f"--source {name}={path}: no such file or directory", hint=hint)


def _check_tree_is(upstream: Upstream, path: Path) -> None:
    """A folder that is not a git checkout is taken for an unpacked tree of the upstream only where
    it has the upstream's top package (its tests pin names it): else it is some other folder."""
    package = upstream.tests.package if upstream.tests else ""
    if not package or (path / package).is_dir():
        return
    name, g = upstream.name, upstream.git
    clone = (f"{shell.code('git', 'clone', g.url, 'CHECKOUT', shell.Raw('&&'), 'git', '-C', 'CHECKOUT', 'checkout', '-q', g.commit)}"
             f" makes one; then give --source {name}=CHECKOUT") if g and g.commit else f"give --source {name}=CHECKOUT"
    raise UsageError(f"--source {name}={path} is not a {name} checkout: it is not a git repository, and it has no "
                     f"{package}/ folder, so it is no unpacked tree of {name} either", hint=clone)


def is_git(path: Path) -> bool:
    """A checkout or a bare repository (not an unpacked tree)."""
    return (path / ".git").exists() or (path / "HEAD").is_file() and (path / "objects").is_dir()


def pin_can_move(upstream: Upstream, override: Path | None) -> str | None:
    """Why retire --write / rebase cannot move this upstream's pin to ``override``, or None."""
    override = override.expanduser().resolve() if override is not None else None
    if override is None or not override.is_dir():
        return None
    if is_git(override) and upstream.git is None:
        return (f"{upstream.name} has no [upstreams.{upstream.name}.git] pin, so a checkout's commit "
                f"({override}) cannot become its pin")
    return None if is_git(override) else (f"{override} is an unpacked tree: it names no version or commit "
                                            f"to pin {upstream.name} at")


def owner(path: Path) -> str:
    import pwd

    uid = path.stat().st_uid
    try:
        return f"{pwd.getpwuid(uid).pw_name}, uid {uid}"
    except KeyError:
        return f"uid {uid}"
