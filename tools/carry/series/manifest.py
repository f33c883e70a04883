"""The series manifest (``patches/<series>/series.toml``) as frozen dataclasses.

Unknown keys are errors with a suggestion, so a typo never silently drops a
pin or a proof. The patch entries are checked on every load (``problems``:
ids, files inside the series folder and listed once, and ``requires``:
unknown ids, cycles, a patch needing a later one of its own upstream): every
command that reads a series refuses a broken one the same way, and lint
reports the same problems among its others. The digest covers everything that
determines a patched tree: the pins and the bytes of the selected patch files.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from .. import shell
from ..errors import ConfigError, UsageError
from ..files import read_input, read_input_text
from . import entries
from .entries import ID_RE  # noqa: F401  (names other modules import from here)
from .entries import suggest as _suggest
from .patchfile import path_problems
from .testspin import TestsPin, load_tests

STATUSES = ("pending", "submitted", "backport", "merged", "rejected", "inappropriate")
UPSTREAM_NAMES = ("megatron-lm", "megatron-bridge", "nemo-rl")
SOURCE_KINDS = ("pypi", "git")
NO_PROOF = "none:"  # proof = "none: <why>": a patch that has no proof, and says why
_VERSION_RE = re.compile(r"^v?[0-9][0-9A-Za-z.+!_-]*$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class Artifact:
    file: str
    sha256: str
    tree: bool = False  # the artifact the base tree is unpacked from


@dataclass(frozen=True)
class PyPISource:
    name: str
    version: str
    artifacts: tuple[Artifact, ...]
    map: tuple[tuple[str, str], ...]  # (prefix in the artifact, prefix in the repo)
    exclude: tuple[str, ...] = ()

    @property
    def tree_artifact(self) -> Artifact:
        return next(a for a in self.artifacts if a.tree)


@dataclass(frozen=True)
class GitSource:
    url: str
    commit: str | None = None
    ref: str | None = None
    paths: tuple[str, ...] = ()  # restrict the tree to these (matches the PyPI layout)


@dataclass(frozen=True)
class Upstream:
    name: str
    description: str
    python_path: str
    sources: tuple[str, ...]
    pypi: PyPISource | None
    git: GitSource | None
    tests: TestsPin | None = None  # its own unit tests (carry.series.testspin)

    def pin_text(self) -> str:
        if self.pypi and (not self.git or self.sources[0] == "pypi"):
            return f"{self.pypi.name}=={self.pypi.version}"
        assert self.git is not None
        return f"{self.git.url}@{self.git.commit or self.git.ref}"


@dataclass(frozen=True)
class PatchMeta:
    id: str
    upstream: str
    title: str
    file: str
    status: str
    owner: str
    why: str
    retire_when: str
    links: tuple[str, ...] = ()
    proofs: tuple[str, ...] = ()  # each must fail on the pristine base and pass patched
    requires: tuple[str, ...] = ()
    merged_in: str | None = None
    no_proof: str | None = None   # why there is no proof (proof = "none: <why>")
    upstream_tests: tuple[str, ...] = ()   # upstream's own tests it fixes (tools/upstream_tests.py --record-fixed)

    @property
    def proof(self) -> str | None:
        return self.proofs[0] if self.proofs else None


@dataclass(frozen=True)
class Series:
    name: str
    description: str
    root: Path  # patches/<series>
    upstreams: tuple[Upstream, ...]
    patches: tuple[PatchMeta, ...]

    def upstream(self, name: str) -> Upstream:
        for u in self.upstreams:
            if u.name == name:
                return u
        raise UsageError(f"unknown upstream {name!r}", hint=_suggest(name, [u.name for u in self.upstreams]))

    def patches_for(self, upstream: str) -> list[PatchMeta]:
        return [p for p in self.patches if p.upstream == upstream]

    def patch(self, pid: str) -> PatchMeta:
        for p in self.patches:
            if p.id == pid:
                return p
        raise UsageError(f"unknown patch id {pid!r}", hint=_suggest(pid, [p.id for p in self.patches]))

    def _unknown_only(self, item: str, only: list[str]) -> UsageError:
        """--only names no patch and no upstream: say what it may name, and the command with it fixed."""
        names = [p.id for p in self.patches] + [u.name for u in self.upstreams]
        close = difflib.get_close_matches(item, names, n=1, cutoff=0.6)
        rest = [x for x in only if x != item]
        fixed = [close[0] if x == item else x for x in only] if close else rest
        cmd = shell.again({"--only": [",".join(fixed)] if fixed else None})
        what = (f"with {close[0]!r}" if close else f"without {item!r}") + (" instead" if close else "")
        return UsageError(f"--only names {item!r}, which is neither a patch nor an upstream of series {self.name}; "
                          f"its patches: {', '.join(p.id for p in self.patches)}; its upstreams: "
                          f"{', '.join(u.name for u in self.upstreams)}",
                          hint=f"the same command {what}: {cmd}" if cmd else _suggest(item, names))

    def patch_path(self, p: PatchMeta) -> Path:
        return self.root / p.file

    def select(self, only: Iterable[str] | None) -> list[PatchMeta]:
        """Patches chosen by ``--only`` (ids or upstream names), plus what they require."""
        if not only:
            return list(self.patches)
        wanted: set[str] = set()
        for item in only:
            if item in (u.name for u in self.upstreams):
                wanted.update(p.id for p in self.patches_for(item))
            elif item in (p.id for p in self.patches):
                wanted.add(item)
            else:
                raise self._unknown_only(item, list(only))
        stack = list(wanted)
        while stack:
            for dep in self.patch(stack.pop()).requires:
                if dep not in wanted:
                    wanted.add(dep)
                    stack.append(dep)
        return [p for p in self.patches if p.id in wanted]

    def upstream_digest(self, upstream: str, selected: Iterable[PatchMeta], source_key: str) -> str:
        h = hashlib.sha256()
        h.update(json.dumps({"series": self.name, "upstream": upstream, "source": source_key},
                            sort_keys=True).encode())
        for p in selected:
            if p.upstream == upstream:
                h.update(p.id.encode() + b"\0" + file_sha256(self.patch_path(p)).encode() + b"\0")
        return h.hexdigest()

    def entry_problems(self) -> list[tuple[str, str]]:
        """(where, message) for each bad patch entry (carry.series.entries)."""
        return entries.entry_problems(self)

    def problems(self) -> list[tuple[str, str]]:
        """Everything every command refuses in the entries (lint reports these and more)."""
        return self.entry_problems() + self.requires_problems()

    def requires_problems(self) -> list[tuple[str, str]]:
        """(where, message) for each broken ``requires`` (carry.series.entries)."""
        return entries.requires_problems(self)

    def digest(self, selected: Iterable[PatchMeta]) -> str:
        """Digest of the pins plus the selected patches (used in wheel version labels)."""
        h = hashlib.sha256()
        sel = list(selected)
        for u in self.upstreams:
            h.update(self.upstream_digest(u.name, sel, _pin_key(u)).encode())
        return h.hexdigest()


def _pin_key(u: Upstream) -> str:
    parts = []
    if u.pypi:
        parts.append(f"pypi:{u.pypi.name}=={u.pypi.version}:{u.pypi.tree_artifact.sha256}")
    if u.git:
        parts.append(f"git:{u.git.url}@{u.git.commit or u.git.ref}")
    return "|".join(parts)


def file_sha256(path: Path) -> str:
    try:
        return hashlib.sha256(read_input(path)).hexdigest()
    except FileNotFoundError:
        return "missing"


class _Table:
    """A TOML table that reports unknown and missing keys with their location."""

    def __init__(self, data: Any, where: str, path: Path):
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: [{where}] must be a table")
        self.data, self.where, self.path = data, where, path

    def check_keys(self, allowed: Iterable[str]) -> None:
        allowed = list(allowed)
        for key in self.data:
            if key not in allowed:
                hint = _suggest(key, allowed) or f"allowed keys: {', '.join(allowed)}"
                raise ConfigError(f"{self.path}: unknown key {key!r} in [{self.where}]", hint=hint)

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ..., *, required: bool = False) -> Any:
        if key not in self.data:
            if required or default is ...:
                raise ConfigError(f"{self.path}: [{self.where}] is missing required key {key!r}")
            return default
        value = self.data[key]
        if not isinstance(value, kind):
            want = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
            raise ConfigError(f"{self.path}: [{self.where}] {key} must be {want}, got {type(value).__name__}")
        return value

    def strings(self, key: str) -> tuple[str, ...]:
        value = self.get(key, list, [])
        if not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{self.path}: [{self.where}] {key} must be a list of strings")
        return tuple(value)


def _load_pypi(t: _Table) -> PyPISource:
    t.check_keys(["name", "version", "artifacts", "map", "exclude"])
    arts = []
    for i, raw in enumerate(t.get("artifacts", list, required=True)):
        a = _Table(raw, f"{t.where}.artifacts[{i}]", t.path)
        a.check_keys(["file", "sha256", "tree"])
        sha = a.get("sha256", str, required=True)
        if not _SHA256_RE.match(sha):
            raise ConfigError(f"{t.path}: [{a.where}] sha256 must be 64 lowercase hex digits")
        arts.append(Artifact(a.get("file", str, required=True), sha, a.get("tree", bool, False)))
    trees = [a for a in arts if a.tree]
    if len(trees) != 1:
        raise ConfigError(f"{t.path}: [{t.where}] needs exactly one artifact with tree = true (has {len(trees)})")
    mapping = t.get("map", dict, required=True)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()):
        raise ConfigError(f"{t.path}: [{t.where}] map must map strings to strings")
    for src, dst in mapping.items():
        why = [w for w in path_problems(dst.rstrip("/")) if w != "empty path"] if dst.strip("/") else []
        if why or dst.startswith("/"):
            raise ConfigError(f"{t.path}: [{t.where}] map {src!r} = {dst!r}: the target must be a folder inside "
                              f"the upstream's tree ({'; '.join(why) or 'absolute path'})",
                              hint=f'write a relative folder, as in map = {{ "{src}" = "{src}" }}')
    version = t.get("version", str, required=True)
    if len(version) > 64 or not _VERSION_RE.match(version):
        raise ConfigError(f"{t.path}: [{t.where}] version {version[:40]!r}{'...' if len(version) > 40 else ''} is not "
                          "a release version (digits, letters and . + ! _ -, at most 64 characters)")
    return PyPISource(t.get("name", str, required=True), version, tuple(arts),
                      tuple(sorted(mapping.items())), t.strings("exclude"))


def _load_git(t: _Table) -> GitSource:
    t.check_keys(["url", "commit", "ref", "paths"])
    commit = t.get("commit", str, None)
    if commit is not None and not _COMMIT_RE.match(commit):
        raise ConfigError(f"{t.path}: [{t.where}] commit must be a full 40-hex commit id")
    ref = t.get("ref", str, None)
    if not commit and not ref:
        raise ConfigError(f"{t.path}: [{t.where}] needs commit (or at least ref)")
    return GitSource(t.get("url", str, required=True), commit, ref, t.strings("paths"))


def load(series_dir: Path, *, check: bool = True) -> Series:
    """The series in ``series_dir``; EntryError when a patch entry is bad, RequiresError when
    only the ``requires`` are (lint reads with check=False and reports them among its other problems)."""
    path = series_dir / "series.toml"
    try:
        raw = tomllib.loads(read_input_text(path))
    except FileNotFoundError:
        raise ConfigError(f"no series manifest at {path}",
                          hint="pass --series NAME for a folder patches/NAME/ that has series.toml") from None
    except IsADirectoryError:
        raise ConfigError(f"{path} is a directory, not the series manifest (a TOML file)") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})",
                          hint="TOML files are UTF-8: re-save it so") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:  # tomllib reads nested arrays and tables by recursion
        raise ConfigError(f"{path}: values nested too deeply to read") from None
    except ValueError as exc:  # an integer past Python's digit limit, and the like
        raise ConfigError(f"{path}: a value this tool cannot read ({str(exc).split(';')[0]})") from None
    top = _Table(raw, "<top>", path)
    top.check_keys(["series", "upstreams", "patches"])
    s = _Table(top.get("series", dict, required=True), "series", path)
    s.check_keys(["name", "description"])
    name = s.get("name", str, required=True)
    if name != series_dir.name:
        raise ConfigError(f"{path}: [series] name {name!r} differs from its folder {series_dir.name!r}")

    upstreams = []
    for uname, udata in top.get("upstreams", dict, required=True).items():
        u = _Table(udata, f"upstreams.{uname}", path)
        if uname not in UPSTREAM_NAMES:
            raise ConfigError(f"{path}: unknown upstream {uname!r}", hint=_suggest(uname, UPSTREAM_NAMES))
        u.check_keys(["description", "python_path", "sources", "pypi", "git", "tests"])
        pypi = _load_pypi(_Table(u.data["pypi"], f"{u.where}.pypi", path)) if "pypi" in u.data else None
        git = _load_git(_Table(u.data["git"], f"{u.where}.git", path)) if "git" in u.data else None
        sources = u.strings("sources") or tuple(k for k in SOURCE_KINDS if k in u.data)
        for kind in sources:
            if kind not in SOURCE_KINDS or (kind == "pypi" and not pypi) or (kind == "git" and not git):
                raise ConfigError(f"{path}: [{u.where}] sources lists {kind!r} but has no [{u.where}.{kind}]")
        if not sources:
            raise ConfigError(f"{path}: [{u.where}] needs a [pypi] or [git] source")
        tests = load_tests(_Table(u.data["tests"], f"{u.where}.tests", path), uname) if "tests" in u.data else None
        upstreams.append(Upstream(uname, u.get("description", str, ""), u.get("python_path", str, "."),
                                  sources, pypi, git, tests))

    patches = []
    fields = ["id", "upstream", "title", "file", "status", "owner", "why", "retire_when", "links",
              "proof", "requires", "merged_in", "upstream_tests"]
    for i, pdata in enumerate(top.get("patches", list, [])):
        t = _Table(pdata, f"patches[{i}]", path)
        t.check_keys(fields)
        pid = t.get("id", str, required=True)
        t.where = f"patches[{i}] ({pid})"
        p = PatchMeta(
            id=pid, upstream=t.get("upstream", str, required=True), title=t.get("title", str, required=True),
            file=t.get("file", str, required=True), status=t.get("status", str, required=True),
            owner=t.get("owner", str, required=True), why=t.get("why", str, required=True),
            retire_when=t.get("retire_when", str, required=True), links=t.strings("links"),
            requires=t.strings("requires"), merged_in=t.get("merged_in", str, None), **_proofs(t),
            upstream_tests=t.strings("upstream_tests"))
        if p.upstream not in [u.name for u in upstreams]:
            raise ConfigError(f"{path}: [{t.where}] upstream {p.upstream!r} is not declared",
                              hint=_suggest(p.upstream, [u.name for u in upstreams]))
        if p.status not in STATUSES:
            raise ConfigError(f"{path}: [{t.where}] status {p.status!r} is not one of {', '.join(STATUSES)}",
                              hint=_suggest(p.status, STATUSES))
        patches.append(p)
    ids = [p.id for p in patches]
    dupes = sorted({x for x in ids if ids.count(x) > 1})
    if dupes:
        raise ConfigError(f"{path}: duplicate patch id(s): {', '.join(dupes)}")
    series = Series(name, s.get("description", str, ""), series_dir, tuple(upstreams), tuple(patches))
    if check:
        probs = series.entry_problems()
        if probs:
            raise EntryError(f"{path}: the patch entries are invalid:\n    "
                             + "\n    ".join(f"{w}: {m}" for w, m in probs),
                             hint=f"fix them in {path}")
        probs = series.requires_problems()
        if probs:
            raise RequiresError(f"{path}: the patches' requires are broken:\n    "
                                + "\n    ".join(f"{w}: {m}" for w, m in probs),
                                hint=f"fix requires = [...] in {path}")
    return series


class EntryError(ConfigError):
    """A patch entry's id or file is one no command may use (Series.entry_problems)."""


class RequiresError(EntryError):
    """A patch requires an unknown patch, itself, a later patch of its upstream, or a cycle."""


def _proofs(t: _Table) -> dict[str, Any]:
    """`proof` is one test file, a list of them, or "none: <why>"."""
    value = t.get("proof", (str, list), None)
    if value is None:
        return {}
    if isinstance(value, str) and value.startswith(NO_PROOF):
        why = value[len(NO_PROOF):].strip()
        if not why:
            raise ConfigError(f"{t.path}: [{t.where}] proof = \"none: <why>\" needs the why")
        return {"no_proof": why}
    if isinstance(value, str):
        return {"proofs": (value,)}
    if not value or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{t.path}: [{t.where}] proof must be a string or a non-empty list of strings")
    if any(v.startswith(NO_PROOF) for v in value):
        raise ConfigError(f"{t.path}: [{t.where}] \"none: <why>\" stands alone, not in a list of proofs")
    return {"proofs": tuple(value)}
