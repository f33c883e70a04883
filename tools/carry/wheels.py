"""Installable patched wheels for PyPI-pinned upstreams (``apply --wheels``).

The original wheel is the starting point: members the series did not touch
are copied byte for byte (compiled helpers included), patched files replace
theirs, the version gets a local label derived from the series digest
(``0.19.2+gtp.<digest>``) and RECORD is rewritten. Every pinned wheel of the
upstream gets the same edits (one per Python tag), after checking that its
copy of each touched file is the one the patches were applied to.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import tempfile
import zipfile
from pathlib import Path

from . import progress
from .errors import IntegrityError, UsageError
from .manifest import Series, Upstream
from .runner import Git, run
from .sources import fetch_artifact


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _to_member(repo_path: str, pypi_map: tuple[tuple[str, str], ...]) -> str | None:
    best = None
    for src, dst in pypi_map:
        if repo_path.startswith(dst) and (best is None or len(dst) > len(best[1])):
            best = (src, dst)
    return None if best is None else best[0] + repo_path[len(best[1]):]


def changed_files(ws: Path, base: str, head: str) -> dict[str, str]:
    """repo path -> 'M'/'A'/'D' between the pristine base and the patched head."""
    out = Git(ws)("diff", "--no-renames", "--name-status", "-z", base, head).stdout.split("\0")
    pairs = [p for p in out if p]
    return {pairs[i + 1]: pairs[i][0] for i in range(0, len(pairs), 2)}


def build(series: Series, up: Upstream, ws: Path, base: str, head: str, cache: Path,
          out_dir: Path, label: str) -> list[Path]:
    pypi = up.pypi
    if pypi is None:
        raise UsageError(f"{up.name} has no PyPI pin; --wheels only covers PyPI-pinned upstreams")
    if not re.fullmatch(r"[a-z0-9.]+", label):
        raise UsageError(f"bad local version label {label!r}")
    version = f"{pypi.version}+{label}"
    changes = changed_files(ws, base, head) if base and head and base != head else {}
    g = Git(ws)
    out_dir.mkdir(parents=True, exist_ok=True)
    built = []
    for art in pypi.artifacts:
        if not art.file.endswith(".whl"):
            continue
        src = fetch_artifact(up.name, pypi, art, cache)
        dist, old_version, *tags = art.file[:-4].split("-")
        target = out_dir / ("-".join([dist, version, *tags]) + ".whl")
        progress.say(f"{up.name}: writing {target.name}")
        _rewrite(src, target, dist, old_version, version, changes, pypi.map, g, base, head, up.name)
        built.append(target)
    return built


def _rewrite(src: Path, target: Path, dist: str, old_version: str, version: str, changes: dict[str, str],
             pypi_map, g: Git, base: str, head: str, upstream: str) -> None:
    old_info, new_info = f"{dist}-{old_version}.dist-info/", f"{dist}-{version}.dist-info/"
    members = {(_to_member(p, pypi_map) or ""): (p, kind) for p, kind in changes.items()}
    members.pop("", None)
    unmapped = [p for p in changes if _to_member(p, pypi_map) is None]
    if unmapped:
        raise UsageError(f"{upstream}: patched files outside the wheel's mapped paths: {', '.join(unmapped[:5])}")
    records: list[tuple[str, bytes]] = []
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".wheel-")
    os.close(fd)
    try:
        with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
            seen = set()
            for info in zin.infolist():
                name = info.filename
                if info.is_dir() or name == old_info + "RECORD":
                    continue
                data = zin.read(info)
                if name in members:
                    repo_path, kind = members[name]
                    seen.add(name)
                    pristine = _blob(g, base, repo_path) if kind != "A" else None
                    if pristine is not None and pristine != data:
                        raise IntegrityError(
                            f"{upstream}: {src.name} has a different {name} than the tree the patches were "
                            "proven on; refusing to patch it blindly")
                    if kind == "D":
                        continue
                    data = _blob(g, head, repo_path)
                if name.startswith(old_info):
                    name = new_info + name[len(old_info):]
                    if name == new_info + "METADATA":
                        data = re.sub(rb"(?m)^Version: .*$", f"Version: {version}".encode(), data, count=1)
                _write(zout, info, name, data)
                records.append((name, data))
            for name, (repo_path, kind) in sorted(members.items()):
                if kind == "A" and name not in seen:
                    info = zipfile.ZipInfo(name, date_time=(2000, 1, 1, 0, 0, 0))
                    info.external_attr = 0o644 << 16
                    data = _blob(g, head, repo_path)
                    _write(zout, info, name, data)
                    records.append((name, data))
            record = "".join(f"{n},{_record_hash(d)},{len(d)}\n" for n, d in records) + f"{new_info}RECORD,,\n"
            info = zipfile.ZipInfo(new_info + "RECORD", date_time=(2000, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            zout.writestr(info, record)
        os.chmod(tmp, 0o644)  # mkstemp made it private; a wheel is for others to read
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _blob(g: Git, rev: str, path: str) -> bytes:
    return run(["git", "-C", str(g.path), "show", f"{rev}:{path}"], binary=True).stdout


def _write(zout: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, data: bytes) -> None:
    new = zipfile.ZipInfo(name, date_time=info.date_time)
    new.external_attr = info.external_attr
    new.compress_type = zipfile.ZIP_DEFLATED
    zout.writestr(new, data)
