"""Pinned PyPI artifacts: downloaded once with pip, hash-checked, cached, unpacked.

``fetch_artifact`` gives the pinned file from ``CACHE/artifacts/<sha256>/``,
downloading it the first time (in a scratch folder under a lock, so a killed
download leaves nothing the next run keeps); every use re-checks its sha256.
``unpack_wheel`` lays a wheel out in the upstream's git layout (the pin's
``map``). ``download_version`` fetches another release like the pinned ones,
for moving a pin.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
import sys
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path

from .. import progress, shell
from ..errors import ConfigError, IntegrityError, NoSpaceError, SourceError, UsageError, says_no_space
from ..files import write_json
from ..lock import building
from ..runner import run
from ..series.manifest import Artifact, PyPISource


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def artifact_version(file: str) -> str | None:
    """The version a wheel or sdist file name says (``name-1.2.3-py3-none-any.whl``, ``name-1.2.3.tar.gz``)."""
    if file.endswith(".whl"):
        parts = file[:-4].split("-")
        return parts[1] if len(parts) in (5, 6) else None
    for ext in (".tar.gz", ".tar.bz2", ".tgz", ".zip"):
        if file.endswith(ext):
            name, sep, version = file[:-len(ext)].rpartition("-")
            return version if sep and name else None
    return None


def _same_version(a: str, b: str) -> bool:
    if a == b:
        return True  # the common case, without importing packaging
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:
        return a == b
    try:
        return Version(a) == Version(b)
    except (InvalidVersion, ValueError):  # ValueError: a number past Python's digit limit
        return a == b


def check_pin(upstream: str, pypi: PyPISource) -> None:
    """A pin's version must be its files' own: else a warm cache would use the files' tree and a cold
    one would ask the index for a version with another version's hash (rc 0 or 1 by chance)."""
    wrong = [(a.file, v) for a in pypi.artifacts if (v := artifact_version(a.file)) and not _same_version(v, pypi.version)]
    if wrong:
        shown = ", ".join(f"{f} is version {v}" for f, v in wrong)
        raise ConfigError(f"{upstream}: the pin says {pypi.name} version {pypi.version}, but its artifact {shown}",
                          hint=f"make [upstreams.{upstream}.pypi] agree: either version = \"{wrong[0][1]}\", or the "
                               f"files of {pypi.version} with their sha256")


def _pip_download_args(art: Artifact) -> list[str]:
    """pip flags that make exactly the pinned wheel the only candidate."""
    if not art.file.endswith(".whl"):
        return ["--no-binary=:all:"]
    parts = art.file[:-4].split("-")
    pytag, abi, plats = parts[-3], parts[-2], parts[-1]
    if plats == "any":
        return ["--only-binary=:all:"]
    args = ["--only-binary=:all:", "--implementation", pytag[:2], "--abi", abi,
            "--python-version", pytag[2:3] + "." + pytag[3:]]
    for plat in plats.split("."):
        args += ["--platform", plat]
    return args


def fetch_artifact(upstream: str, pypi: PyPISource, art: Artifact, cache: Path) -> Path:
    """The pinned artifact from the cache, downloading it once; always hash-checked."""
    dest = cache / "artifacts" / art.sha256 / art.file
    if not dest.exists():
        with building(dest.parent) as tmp:
            if not dest.exists():  # another run may have fetched it while this one waited
                _download(upstream, pypi, art, tmp, dest)
    got = sha256_file(dest)
    if got != art.sha256:
        raise IntegrityError(
            f"{upstream}: cached artifact {dest} has sha256 {got}, the pin says {art.sha256}",
            hint=f"the cache was modified or corrupted: {shell.code('rm', '-rf', dest.parent)}, then "
                 f"{shell.again({}) or 'run the command again'}")
    return dest


def _download(upstream: str, pypi: PyPISource, art: Artifact, tmp: Path, dest: Path) -> None:
    req = tmp / "req.txt"
    req.write_text(f"{pypi.name}=={pypi.version} --hash=sha256:{art.sha256}\n")
    progress.say(f"{upstream}: downloading {art.file}")
    res = run([sys.executable, "-m", "pip", "download", "--no-deps", "--ignore-requires-python",
               "--disable-pip-version-check", "--no-input", "--progress-bar", "off",
               "--dest", tmp, "--require-hashes", "-r", str(req), *_pip_download_args(art)],
              check=False)
    got_path = tmp / art.file
    if not res.ok or not got_path.exists():
        tail = " ".join((res.stderr or res.stdout).strip().splitlines()[-2:])
        if says_no_space(res.stderr + res.stdout):  # not "unreachable": no other source would fit either
            raise NoSpaceError(f"{upstream}: no space left on the device holding {tmp.parent} to download {art.file}",
                               hint="free some space there (or point --cache at another disk) and " + shell.run_again())
        if "HASHES" in res.stderr.upper() and "DO NOT MATCH" in res.stderr.upper():
            raise IntegrityError(f"{upstream}: {art.file} downloaded with a different sha256 than pinned: {tail}")
        raise SourceError(f"{upstream}: could not download {pypi.name}=={pypi.version} ({art.file}): {tail}",
                          hint="check network access to the package index, or "
                               + shell.with_source(upstream, "a wheel file, a checkout or an unpacked tree"))
    progress.checkpoint("downloaded")
    got = sha256_file(got_path)
    if got != art.sha256:
        raise IntegrityError(f"{upstream}: downloaded {art.file} has sha256 {got}, the pin says {art.sha256}")
    os.replace(got_path, dest)


def keep_artifact(path: Path, art: Artifact, cache: Path) -> None:
    """A file given on the command line that is a pinned artifact (its sha256 checked by the caller) is
    cached as that artifact: a later command that needs it (upstream_tests, on a host without the
    package index) reads it from there as if it had been downloaded."""
    dest = cache / "artifacts" / art.sha256 / art.file
    if dest.exists():
        return
    with building(dest.parent) as tmp:
        if not dest.exists():
            shutil.copyfile(path, tmp / art.file)
            os.replace(tmp / art.file, dest)


def _members(zf: zipfile.ZipFile, wheel: Path, pypi: PyPISource) -> Iterator[tuple[zipfile.ZipInfo, str, bool]]:
    """Each file member the pin maps into the git layout: (its info, its path there, whether the pin's
    ``exclude`` leaves it out); a path that escapes the tree is an IntegrityError."""
    for info in zf.infolist():
        best = None if info.is_dir() else max(((src, dst) for src, dst in pypi.map if info.filename.startswith(src)),
                                               key=lambda m: len(m[0]), default=None)
        if best is None:
            continue
        out = best[1] + info.filename[len(best[0]):]
        if out.startswith("/") or ".." in Path(out).parts:
            raise IntegrityError(f"{wheel.name}: member {info.filename!r} escapes the tree")
        yield info, out, any(fnmatch.fnmatch(out, pat) or fnmatch.fnmatch(os.path.basename(out), pat)
                             for pat in pypi.exclude)


def _executable(info: zipfile.ZipInfo) -> bool:
    return bool((info.external_attr >> 16) & 0o111)


def left_out_members(wheel: Path, pypi: PyPISource) -> dict[str, tuple[bytes, int]]:
    """What an install of ``wheel`` holds that ``unpack_wheel`` leaves out of the git layout: the members
    the pin maps whose path its ``exclude`` names (compiled extensions), as {path in the layout:
    (bytes, mode)}."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            return {out: (zf.read(info), 0o755 if _executable(info) else 0o644)
                    for info, out, excluded in _members(zf, wheel, pypi) if excluded}
    except (zipfile.BadZipFile, zlib.error) as exc:
        raise IntegrityError(f"{wheel} is not a valid wheel ({exc})") from None


def unpack_wheel(wheel: Path, dest: Path, pypi: PyPISource) -> int:
    try:
        return _unpack(wheel, dest, pypi)
    except (zipfile.BadZipFile, zlib.error) as exc:  # pinned artifacts are hash-checked: a --source wheel
        raise UsageError(f"{wheel} is not a valid wheel ({exc})",
                         hint="give --source a wheel that pip downloaded or built, a checkout or an unpacked tree") from None


def _unpack(wheel: Path, dest: Path, pypi: PyPISource) -> int:
    count = 0
    with zipfile.ZipFile(wheel) as zf:
        for info, out, excluded in _members(zf, wheel, pypi):
            if excluded:
                continue
            target = dest / out
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(info))
            if _executable(info):
                target.chmod(0o755)
            count += 1
    return count


def release_record(cache: Path, pypi: PyPISource, art: Artifact, version: str) -> Path:
    """Where download_version notes which file (and sha256) a release gave for these tags."""
    tags = _pip_download_args(Artifact(art.file.replace(f"-{pypi.version}-", f"-{version}-", 1), "0" * 64))
    key = hashlib.sha256(repr((pypi.name, version, tags)).encode()).hexdigest()[:24]
    return cache / "artifacts" / "releases" / f"{key}.json"


def _cached_release(record: Path, cache: Path, tree: bool) -> Artifact | None:
    """The release a record names, when its file is in the cache with that sha256 (else None)."""
    try:
        doc = json.loads(record.read_text())
        name, sha = doc["file"], doc["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    path = cache / "artifacts" / str(sha) / str(name)
    if "/" in str(name) or not path.is_file() or sha256_file(path) != sha:
        return None
    return Artifact(name, sha, tree)


def download_version(upstream: str, pypi: PyPISource, art: Artifact, version: str, cache: Path) -> Artifact:
    """Another release of the pinned files (same tags), from the cache when an earlier call fetched it
    (its sha256 checked again), else with pip."""
    record = release_record(cache, pypi, art, version)
    cached = _cached_release(record, cache, art.tree)
    if cached is not None:
        return cached
    guess = art.file.replace(f"-{pypi.version}-", f"-{version}-", 1)
    with building(cache / "downloads") as tmp:
        progress.say(f"{upstream}: downloading {pypi.name}=={version} ({guess})")
        res = run([sys.executable, "-m", "pip", "download", "--no-deps", "--ignore-requires-python",
                   "--disable-pip-version-check", "--no-input", "--progress-bar", "off", "--dest", tmp,
                   f"{pypi.name}=={version}", *_pip_download_args(Artifact(guess, "0" * 64))], check=False)
        got = sorted(tmp.glob("*"))
        if not res.ok or len(got) != 1:
            tail = " ".join((res.stderr or res.stdout).strip().splitlines()[-2:])
            raise SourceError(f"{upstream}: could not download {pypi.name}=={version} like {art.file}: {tail}",
                              hint="check the version, or " + shell.with_source(upstream, "a wheel or a checkout of that version"))
        sha = sha256_file(got[0])
        dest = cache / "artifacts" / sha / got[0].name
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(got[0], dest)
    write_json(record, {"file": dest.name, "sha256": sha})
    return Artifact(dest.name, sha, art.tree)
