"""Upstream sources: pinned PyPI artifacts, git commits, local overrides.

Each upstream resolves to a *base* (PyPI artifacts: carry.workspace.artifacts): a cached git repository
whose branch ``main`` is the pristine tree in the upstream's git layout. A git pin (or a
``--source`` checkout) gives the pinned commit itself, with the history the
source has; a PyPI artifact, an unpacked tree or a git pin narrowed to some
``paths`` gives one commit of that tree. Artifacts are downloaded with pip,
checked against their pinned sha256 and cached, so a second run downloads
nothing; bases are cached by the identity of what they were built from, so a
second run unpacks nothing either. :func:`ready_base` is the one call: it
chooses the source, then builds the base only if the cache lacks it (download,
hash check, unpacking, cache entry) in scratch folders under a lock; what a
killed run left there is removed by the next one.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from .. import progress, shell
from ..errors import IntegrityError, NoSpaceError, SourceError, UsageError, says_no_space
from ..lock import building
from ..git import Git
from ..series.manifest import SOURCE_KINDS, Artifact, Upstream
from .artifacts import (
    check_pin,
    download_version,
    fetch_artifact,
    keep_artifact,
    sha256_file,
    unpack_wheel,
)
from .basecheck import RECORD, check_base
from .sourcepath import check_override, is_git, owner

GIT_ONLY = tuple(k for k in SOURCE_KINDS if k == "git")  # git as a pin's only source (not a command line)


def default_cache() -> Path:
    env = os.environ.get("GTP_CARRY_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "gtp-carry"


@dataclass(frozen=True)
class Base:
    upstream: str
    key: str        # identity of the pristine tree's origin (cache key, digest input)
    describe: str   # for people: where the tree came from
    repo: Path      # cached repository holding the base commit on refs/heads/main
    commit: str


@dataclass(frozen=True)
class _Recipe:
    """Which base a source gives, and how to build it: chosen first, built (if absent) by :func:`_ready`."""
    key: str
    describe: str
    make: Callable[[Path], Path]   # scratch folder -> the bare repository staged there
    pinned: str | None = None      # the commit main must be; None: one root commit naming ``key``


def ready_base(upstream: Upstream, cache: Path, override: Path | None = None) -> Base:
    """The pristine base of an upstream, ready in the cache: the one call ``apply`` makes.

    The source is chosen first (``--source NAME=PATH``, else the pins in order, one that cannot
    be reached giving way to the next); the base is built only when the cache lacks it.
    """
    if override is not None:
        return _ready(cache, upstream.name, _override_recipe(upstream, cache, override))
    errors: list[SourceError] = []
    for kind in upstream.sources:
        try:
            recipe = _pypi_recipe(upstream, cache) if kind == "pypi" else _git_recipe(upstream, cache)
            return _ready(cache, upstream.name, recipe)
        except IntegrityError:
            raise
        except SourceError as exc:
            errors.append(exc)
    if len(errors) == 1:
        raise errors[0]
    raise SourceError(f"{upstream.name}: no source could be reached:\n    " +
                      "\n    ".join(e.message for e in errors),
                      hint=shell.with_source(upstream.name, "a wheel, a checkout or an unpacked tree of it"))


def check_pins(upstream: Upstream, override: Path | None) -> None:
    """A bad PyPI pin is bad input: said before any work, with a warm cache as with a cold one."""
    if upstream.pypi is not None and "pypi" in upstream.sources and override is None:
        check_pin(upstream.name, upstream.pypi)


# -- git --------------------------------------------------------------------------
def _archive_into(repo: Path, commit: str, paths: tuple[str, ...], dest: Path) -> None:
    res = Git(repo)("archive", "--format=tar", commit, "--", *paths, binary=True, check=False)
    if not res.ok:
        raise SourceError(f"cannot read {commit} from {repo}: {res.stderr.strip()}")
    with tarfile.open(fileobj=io.BytesIO(res.stdout)) as tf:
        tf.extractall(dest, filter="data")


def mirror_path(upstream: Upstream, cache: Path) -> Path:
    assert upstream.git is not None
    return cache / "git" / (hashlib.sha256(upstream.git.url.encode()).hexdigest()[:16] + ".git")


def _fetch_git(upstream: Upstream, cache: Path) -> Path:
    """A shallow mirror of the pinned commit (or ref) from the pin's URL: the network path."""
    g = upstream.git
    assert g is not None
    mirror = mirror_path(upstream, cache)
    repo = Git(mirror)
    want = g.commit or g.ref
    if mirror.exists() and g.commit and repo.has_commit(g.commit):
        return mirror
    if not mirror.exists():
        repo.init_bare()
    progress.say(f"{upstream.name}: fetching {want} from {g.url}")
    # A ref per fetched pin, so that no later fetch or gc loses it (FETCH_HEAD is overwritten).
    res = repo("fetch", "-q", "--depth=1", g.url, f"+{want}:refs/carry/fetched/{want}", check=False)
    if not res.ok and says_no_space(res.stderr):
        raise NoSpaceError(f"{upstream.name}: no space left on the device holding {mirror} to fetch {want}",
                           hint="free some space there (or point --cache at another disk) and " + shell.run_again())
    if not res.ok:
        raise SourceError(f"{upstream.name}: cannot fetch {want} from {g.url}: "
                          + " ".join(res.stderr.strip().splitlines()[-2:]),
                          hint=shell.with_source(upstream.name, "a local checkout or mirror that has this commit"))
    return mirror


# -- bases ------------------------------------------------------------------------
def _ready(cache: Path, upstream: str, recipe: _Recipe) -> Base:
    """The recipe's base from the cache, made by ``recipe.make(scratch)`` under the lock when absent.

    A cached base is used only when its main is what it was built as: the pinned commit
    (``pinned``), or the one root commit that names ``key``. Anything else (a commit added
    to main, main moved) is rebuilt, and said so.
    """
    key, describe, make, pinned = recipe.key, recipe.describe, recipe.make, recipe.pinned
    dest = cache / "bases" / upstream / f"{key}.git"
    repo = Git(dest)
    commit, problem = check_base(repo, key, pinned)
    if commit is None:
        with building(dest.parent) as tmp:
            commit, problem = check_base(repo, key, pinned)
            if commit is None:
                if dest.exists():
                    if problem:
                        print(f"note: {upstream}: the cached base {dest} is not the pinned tree ({problem}); "
                              "building it again", file=sys.stderr)
                    shutil.rmtree(dest)  # tampered, or half written by a run from before builds were locked
                progress.say(f"{upstream}: preparing pristine base ({describe})")
                staged = make(tmp)
                progress.checkpoint("base-built")
                os.rename(staged, dest)
                commit, problem = check_base(repo, key, pinned)
                if commit is None:
                    raise SourceError(f"{upstream}: the base just built in {dest} does not check: {problem}")
    return Base(upstream, key, describe, dest, commit)


def _tree_recipe(key: str, describe: str, populate: Callable[[Path], object]) -> _Recipe:
    """A base of one commit holding the tree ``populate(dir)`` writes (artifacts, unpacked trees)."""
    def make(tmp: Path) -> Path:
        tree = tmp / "tree"
        tree.mkdir()
        populate(tree)
        t = Git(tree)
        t.init()
        commit = t.commit_all(f"base: {describe}\n\nPristine upstream tree, unmodified.\nCarry-Base-Key: {key}\n")
        staged = Git.clone(tree, tmp / "base.git", bare=True, local=False)
        staged("remote", "remove", "origin", check=False)
        made = t("rev-parse", f"{commit}^{{tree}}").stdout.strip()
        (staged.path / RECORD).write_text(json.dumps({"commit": commit, "tree": made}) + "\n")
        return staged.path
    return _Recipe(key, describe, make)


def _commit_recipe(source: Path, commit: str, describe: str) -> _Recipe:
    """A base whose main is the pinned commit itself, with the history ``source`` has for it.

    The objects are shared (hardlinked) from the source where the file system
    allows; git objects never change, so the base stays valid if the source moves on.
    """
    shallow = Git(source)("rev-parse", "--is-shallow-repository", check=False).stdout.strip() == "true"
    key = "commit-" + hashlib.sha256(repr((commit, "shallow" if shallow else "history")).encode()).hexdigest()[:20]

    def make(tmp: Path) -> Path:
        if shallow:  # a local clone of a shallow repository transfers nothing that no branch names
            staged = Git(tmp / "base.git")
            staged.init_bare()
            staged("fetch", "-q", "--no-tags", "--depth=1", str(source), commit)
        else:
            staged = Git.clone(source, tmp / "base.git", bare=True)
        staged("update-ref", "refs/heads/main", commit)
        staged("symbolic-ref", "HEAD", "refs/heads/main")
        others = staged("for-each-ref", "--format=%(refname)").stdout.split()
        for ref in others:
            if ref != "refs/heads/main":
                staged("update-ref", "-d", ref)
        staged("remote", "remove", "origin", check=False)
        return staged.path
    return _Recipe(key, describe + (" (shallow: no history)" if shallow else ""), make, pinned=commit)


def _dir_key(path: Path) -> str:
    h = hashlib.sha256()
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d != ".git")
        for f in sorted(files):
            p = Path(root) / f
            h.update(str(p.relative_to(path)).encode() + b"\0")
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def _pypi_recipe(upstream: Upstream, cache: Path) -> _Recipe:
    pypi = upstream.pypi
    assert pypi is not None
    check_pin(upstream.name, pypi)
    art = pypi.tree_artifact
    key = "pypi-" + hashlib.sha256(repr((art.sha256, pypi.map, pypi.exclude)).encode()).hexdigest()[:20]
    describe = f"{pypi.name}=={pypi.version} ({art.file})"
    # The artifact is only read (and then hash-checked) when the base must be built.
    return _tree_recipe(key, describe,
                        lambda tree: unpack_wheel(fetch_artifact(upstream.name, pypi, art, cache), tree, pypi))


def _git_recipe(upstream: Upstream, cache: Path) -> _Recipe:
    g = upstream.git
    assert g is not None
    mirror = _fetch_git(upstream, cache)
    commit = Git(mirror).rev_parse(g.commit or "FETCH_HEAD")
    if not commit:
        raise SourceError(f"{upstream.name}: {g.commit or g.ref} not found after fetching {g.url}")
    return _commit_or_paths(upstream, mirror, commit, f"{g.url}@{commit}")


def _commit_or_paths(upstream: Upstream, repo: Path, commit: str, describe: str) -> _Recipe:
    """The pinned commit itself; a tree of its ``paths`` when the pin narrows it to the PyPI layout.

    A checkout of an upstream pinned only on PyPI (no git table) is narrowed to what its wheel
    maps into the repository (``pypi.map``): the same tree a release gives, and no need for the
    checkout's other files (a snapshot may lack its large documentation blobs).
    """
    paths = upstream.git.paths if upstream.git else ()
    if upstream.git is None and upstream.pypi is not None:
        paths = tuple(sorted({dst.rstrip("/") for _, dst in upstream.pypi.map}))
    if not paths:
        return _commit_recipe(repo, commit, describe)
    key = "git-" + hashlib.sha256(repr((commit, paths)).encode()).hexdigest()[:20]
    return _tree_recipe(key, f"{describe} ({', '.join(paths)})", lambda tree: _archive_into(repo, commit, paths, tree))


def _override_recipe(upstream: Upstream, cache: Path, path: Path) -> _Recipe:
    check_override(upstream, path)
    path = path.expanduser().resolve()
    if path.is_file():
        if upstream.pypi is None or path.suffix != ".whl":
            raise UsageError(f"--source {upstream.name}={path}: a file source must be a wheel of a PyPI-pinned upstream")
        sha = sha256_file(path)
        pypi = upstream.pypi
        note = "" if sha == pypi.tree_artifact.sha256 else " (not the pinned artifact)"
        for art in pypi.artifacts:   # a pinned file: kept in the cache as if downloaded (upstream_tests reads it)
            if art.sha256 == sha:
                keep_artifact(path, art, cache)
        key = "pypi-" + hashlib.sha256(repr((sha, pypi.map, pypi.exclude)).encode()).hexdigest()[:20]
        return _tree_recipe(key, f"{path.name}{note}", lambda tree: unpack_wheel(path, tree, pypi))
    g = Git(path)
    a_repo = is_git(path)
    if a_repo and g.untrusted():
        raise UsageError(f"--source {upstream.name}={path}: git refuses this checkout: it is owned by another "
                         f"user ({owner(path)}) and git works only in repositories you own or trust "
                         "(\"dubious ownership\")",
                         hint=f"if you trust it, {shell.code('git', 'config', '--global', '--add', 'safe.directory', path)} (gtp-carry "
                              "honours safe.directory from your git config, nothing else of it), or clone it "
                              "and give --source your clone")
    if a_repo:
        pinned = upstream.git.commit if upstream.git else None
        if pinned and g.has_commit(pinned):
            commit, note = pinned, "the pinned commit"
        elif pinned:
            raise UsageError(f"--source {upstream.name}={path} does not contain the pinned commit {pinned}",  # bad input
                             hint=f"{shell.code('git', '-C', path, 'fetch', upstream.git.url, pinned)} (the pin's URL), "
                                  f"then {shell.again({}) or 'run the command again'}, or give another --source")
        else:
            commit = g.rev_parse("HEAD") or ""
            note = "HEAD of the checkout; this upstream has no pinned commit"
            if not commit:
                raise SourceError(f"{upstream.name}: {path} has no HEAD commit")
        return _commit_or_paths(upstream, path, commit, f"{commit} from a local checkout ({note})")
    key = "dir-" + _dir_key(path)[:20]
    return _tree_recipe(key, "an unpacked tree given with --source",
                        lambda tree: shutil.copytree(path, tree, dirs_exist_ok=True,
                                                     ignore=shutil.ignore_patterns(".git")))


# -- moving a pin -----------------------------------------------------------------
def retarget(upstream: Upstream, target: str, cache: Path, override: Path | None = None) -> tuple[Upstream, Base]:
    """The upstream pinned at a new version (PyPI) or commit (git), and its pristine base.

    New PyPI artifacts are downloaded with the same tags as the current pins and
    their sha256 recorded, so the returned pin can be written to series.toml.
    """
    if override is not None:
        override = override.expanduser().resolve()
        if upstream.pypi and override.is_file():
            art = Artifact(override.name, sha256_file(override), tree=True)
            new = replace(upstream, pypi=replace(upstream.pypi, version=target, artifacts=(art,)))
            return new, ready_base(new, cache, override)
        if upstream.git and override.is_dir() and is_git(override):
            commit = Git(override).rev_parse(target)
            if not commit:
                raise SourceError(f"{upstream.name}: {override} has no commit {target}")
            # A checkout's commit is a git pin, also for an upstream pinned on PyPI so far (an
            # upstream's main head): its wheels are another tree, so git becomes its only source.
            sources = upstream.sources if upstream.sources[0] == "git" else GIT_ONLY
            new = replace(upstream, sources=sources, git=replace(upstream.git, commit=commit, ref=None))
            return new, ready_base(new, cache, override)
        return upstream, ready_base(upstream, cache, override)
    if upstream.sources[0] == "pypi":
        pypi = upstream.pypi
        assert pypi is not None
        arts = []
        for art in pypi.artifacts:
            arts.append(download_version(upstream.name, pypi, art, target, cache))
        new = replace(upstream, pypi=replace(pypi, version=target, artifacts=tuple(arts)))
        return new, _ready(cache, new.name, _pypi_recipe(new, cache))
    g = upstream.git
    assert g is not None
    probe = replace(upstream, git=replace(g, commit=None, ref=target))
    mirror = _fetch_git(probe, cache)
    commit = Git(mirror).rev_parse(target if len(target) == 40 else "FETCH_HEAD")
    if not commit:
        raise SourceError(f"{upstream.name}: {target} not found in {g.url}")
    new = replace(upstream, git=replace(g, commit=commit, ref=None if len(target) == 40 else target))
    return new, _ready(cache, new.name, _git_recipe(new, cache))
