"""The pinned tests, checked, and each side's folder in the upstream's own layout.

A git pin's paths come from ``--tests-source NAME=PATH``: a clone that has the commit, or a folder
holding those paths unpacked (``git archive COMMIT PATHS``, for a host that reaches no git server);
else the commit is fetched once into the cache (``CACHE/upstream-tests/NAME.git``, that commit alone).
Either way every path's git hash must be the pinned one. A side's folder is those paths with
``replace`` swapped for the side's tree (the pristine base, or the patched workspace): upstream's
tests, conftest and pytest configuration, run against the code under test. A ``source = "tree"`` pin
copies the side's tree whole: its own tests. Side folders are scratch copies, so what the tests write
(bytecode, compiled helpers, checkpoints) never lands in a workspace.
"""

from __future__ import annotations

import io
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ... import progress
from ...errors import CommandError, IntegrityError, SourceError, UsageError
from ...git import Git
from ...shell import code
from ...series.testspin import TestsPin

NO_REPLACE = {"GIT_NO_REPLACE_OBJECTS": "1"}  # a hash is the commit's own, not a replacement's


@dataclass(frozen=True)
class Checkout:
    """Where a side folder's pinned paths are read from: a repository's commit or an unpacked folder."""
    pin: TestsPin
    repo: Git | None = None
    folder: Path | None = None

    def unpack(self, dest: Path) -> None:
        if self.repo is not None:
            with tarfile.open(fileobj=io.BytesIO(self.repo.archive(self.pin.commit, self.pin.path_names))) as tar:
                tar.extractall(dest, filter="data")
            return
        for name in self.pin.path_names:
            src, to = self.folder / name, dest / name
            to.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, to, symlinks=True)
            else:
                shutil.copy2(src, to, follow_symlinks=False)


def checkout(pin: TestsPin, cache: Path, source: Path | None) -> Checkout:
    """The pinned paths, from a clone, an unpacked folder or the cache, every hash checked."""
    assert pin.source == "git" and pin.commit
    if source is None:
        repo = _fetched(pin, cache)
        _check(pin, repo, pin.commit, f"the cached clone {repo.path}")
        return Checkout(pin, repo=repo)
    if not source.is_dir():
        raise UsageError(f"--tests-source {pin.upstream}={source}: no such folder",
                         hint=f"a clone of {pin.url} that has commit {pin.commit}, or a folder holding its "
                              f"{', '.join(pin.path_names)}")
    repo = Git(source)
    if (source / ".git").exists() or (source / "HEAD").is_file():
        if not repo.has_commit(pin.commit):
            raise UsageError(f"--tests-source {pin.upstream}={source}: the clone lacks commit {pin.commit} "
                             f"({pin.ref or 'the pinned commit'})",
                             hint=f"{code('git', '-C', source, 'fetch', pin.url, pin.commit)}, then run this again")
        _check(pin, repo, pin.commit, f"the clone {source}")
        return Checkout(pin, repo=repo)
    missing = [p for p in pin.path_names if not (source / p).exists()]
    if missing:
        raise UsageError(f"--tests-source {pin.upstream}={source}: neither a git clone nor a folder with the "
                         f"pinned paths (it lacks {', '.join(missing)})",
                         hint=f"pass a clone of {pin.url}, or unpack "
                              f"{code('git', 'archive', pin.commit, *pin.path_names)} there")
    with tempfile.TemporaryDirectory(prefix="carry-tests-index-") as tmp:
        scratch = Git(Path(tmp) / "repo.git")
        scratch.init_bare()
        index = {"GIT_INDEX_FILE": str(Path(tmp) / "index"), **NO_REPLACE}
        scratch("--work-tree", str(source), "add", "-f", "--", *pin.path_names, env=index)
        tree = scratch("write-tree", env=index).stdout.strip()
        _check(pin, scratch, tree, f"the folder {source}")
    return Checkout(pin, folder=source)


def _check(pin: TestsPin, repo: Git, rev: str, where: str) -> None:
    for path, want in pin.paths:
        got = repo("rev-parse", f"{rev}:{path}", env=NO_REPLACE, check=False).stdout.strip()
        if got != want:
            raise IntegrityError(f"{pin.upstream}'s tests: {path} in {where} hashes to {got or 'nothing'}, "
                                 f"the pin says {want}",
                                 hint=f"use the pinned commit's {path} ({pin.url} at {pin.commit}), or fix the "
                                      f"pin in series.toml")


def _fetched(pin: TestsPin, cache: Path) -> Git:
    repo = Git(cache / "upstream-tests" / f"{pin.upstream}.git")
    if not (repo.path / "HEAD").exists():
        repo.init_bare()
    if repo.has_commit(pin.commit):
        return repo
    progress.say(f"{pin.upstream}: fetching its tests, {pin.url} at {pin.commit[:12]} ({pin.ref or 'commit'})")
    try:
        repo("fetch", "-q", "--depth", "1", "--no-tags", pin.url, pin.commit, timeout=1800)
    except CommandError as exc:
        raise SourceError(f"could not fetch {pin.upstream}'s tests from {pin.url} ({pin.commit[:12]}): "
                          f"{exc.message.splitlines()[-1] if exc.message else 'git fetch failed'}",
                          hint=f"on a machine without that network, unpack "
                               f"{code('git', 'archive', pin.commit, *pin.path_names)} from a clone elsewhere and pass "
                               f"--tests-source {pin.upstream}=FOLDER") from None
    return repo


def side_folder(pin: TestsPin, source: Checkout | None, tree: Path, dest: Path) -> Path:
    """The folder a side runs in: the pinned paths with ``replace`` from ``tree`` (or ``tree`` whole)."""
    if dest.exists():
        shutil.rmtree(dest)
    if pin.source == "tree":
        shutil.copytree(tree, dest, symlinks=True, ignore=shutil.ignore_patterns(".git", "__pycache__"))
        return dest
    assert source is not None and pin.replace
    dest.mkdir(parents=True)
    source.unpack(dest)
    inner = dest / pin.replace
    if inner.exists():
        shutil.rmtree(inner)
    src = tree / pin.replace
    if not src.is_dir():
        raise UsageError(f"{pin.upstream}: the tree {tree} has no {pin.replace}/ to test",
                         hint="pass the upstream's tree in its git layout (the workspace apply made)")
    shutil.copytree(src, inner, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    return dest
