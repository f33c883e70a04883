"""The pinned tests, checked, and each side's folder in the upstream's own layout.

A git pin's paths come from ``--tests-source NAME=PATH``: a clone that has the commit, or a folder
holding those paths unpacked (``git archive COMMIT PATHS``, for a host that reaches no git server);
else the commit is fetched once into the cache (``CACHE/upstream-tests/NAME.git``, that commit alone).
Either way every path's git hash must be the pinned one; from a repository, the pin must also hold every
module of the repository the pinned files import (Megatron-LM's tests import its root's ``tools`` and
``examples``: a pin without them left those test files failing to collect on both sides, a loss no
verdict shows). A side's folder is those paths with
``replace`` swapped for the side's tree (the pristine base, or the patched workspace): upstream's
tests, conftest and pytest configuration, run against the code under test. A ``source = "tree"`` pin
copies the side's tree whole: its own tests. Side folders are scratch copies, so what the tests write
(bytecode, compiled helpers, checkpoints) never lands in a workspace.
"""

from __future__ import annotations

import io
import re
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ... import progress
from ...errors import CommandError, ConfigError, IntegrityError, SourceError, UsageError
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
        _check_imports(pin, repo, pin.commit)
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
        _check_imports(pin, repo, pin.commit)
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


# An absolute import at the start of a line: "from a.b import c", or "import a.b as x, d" (its names, each before
# any "as"); relative imports name no root.
_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+([A-Za-z_][\w.]*)[ \t]+import\b|import[ \t]+([A-Za-z_][\w. \t,]*))")


def _imported(text: str) -> list[str]:
    """The dotted names an import line brings in, as _IMPORT reads it; none for another line."""
    m = _IMPORT.match(text)
    if not m:
        return []
    if m.group(1):
        return [m.group(1)]
    return [n.split()[0] for n in m.group(2).split(",") if n.split() and n.split()[0] != "as"]


def _check_imports(pin: TestsPin, repo: Git, rev: str) -> None:
    """Every module of the repository that a pinned file imports (the files under ``replace`` are the code
    under test, not read) lies in a pinned path; else a ConfigError naming the paths to add, with their
    hashes, and a file that imports each."""
    files = set(repo("ls-tree", "-r", "-z", "--name-only", rev, env=NO_REPLACE).stdout.split("\0")) - {""}
    dirs = {f.rsplit("/", i)[0] for f in files for i in range(1, f.count("/") + 1)}
    pinned = pin.path_names

    def inside(path: str, roots) -> bool:
        return any(path == p or path.startswith(p + "/") for p in roots)

    def module(dotted: str) -> str | None:   # the deepest file or folder of the repository the name reaches
        parts = dotted.split(".")
        for k in range(len(parts), 0, -1):
            base = "/".join(parts[:k])
            for cand in (f"{base}.py", f"{base}/__init__.py", base):
                if cand in files or cand in dirs:
                    return cand
        return None

    scanned = [p for p in pinned if not (pin.replace and inside(p, [pin.replace]))]
    grep = repo("grep", "-z", "-I", "--full-name", "-E", "-e", r"^[[:space:]]*(from|import)[[:space:]]+[A-Za-z_]", rev,
                "--", *scanned, f":(exclude){pin.replace}" if pin.replace else ":(exclude).git",
                env=NO_REPLACE, check=False)
    # 1: no line matched; another status, or a word on stderr (git grep goes on past a blob it cannot read, a
    # partial clone's, and still exits 0): a file was not read, and the check would pass on what it never saw
    if grep.returncode not in (0, 1) or grep.stderr.strip():
        raise SourceError(f"{pin.upstream}'s tests: cannot read the pinned files' imports at {rev[:12]}: "
                          f"{(grep.stderr.strip().splitlines() or ['git grep failed'])[-1]}")
    lacking: dict[str, str] = {}   # a path to pin -> a file that imports from it
    # -z: each name as it is, ended by a NUL (a name holding a colon or a newline is not split)
    for path, text in re.findall(re.escape(rev) + r":([^\0]*)\0([^\n]*)", grep.stdout):
        if not path.endswith(".py"):
            continue
        for dotted in _imported(text):
            target = module(dotted)
            if target is None or inside(target, pinned):
                continue
            parts = target.split("/")   # the shortest folder of it that holds no pinned path
            add = next(("/".join(parts[:k]) for k in range(1, len(parts) + 1)
                        if not any(p.startswith("/".join(parts[:k]) + "/") for p in pinned)), target)
            lacking.setdefault(add, f"{path} imports {dotted}")
    if lacking:
        lines = ", ".join(f'"{a}" = "{repo("rev-parse", f"{rev}:{a}", env=NO_REPLACE).stdout.strip()}"'
                          for a in sorted(lacking))
        raise ConfigError(f"{pin.upstream}'s tests pin lacks what its files import from the repository: "
                          + "; ".join(f"{a} ({why})" for a, why in sorted(lacking.items())),
                          hint=f"add to [upstreams.{pin.upstream}.tests] paths in series.toml: {lines}")


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
