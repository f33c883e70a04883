"""Installable patched wheels for PyPI-pinned upstreams (``apply --wheels``).

The original wheel is the starting point: members the series did not touch
are copied byte for byte (compiled helpers included), patched files replace
theirs, the version gets a local label derived from the series digest
(``0.19.2+gtp.<digest>``) and RECORD is rewritten. Every pinned wheel of the
upstream gets the same edits (one per Python tag), after checking that its
copy of each touched file is the one the patches were applied to.

A wheel whose own Requires-Python excludes the Python its tag names (the
cp311 megatron-core wheel says ``>=3.12``) is not written: pip would refuse
it. The report names each such wheel and why.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from .. import progress
from ..errors import IntegrityError, UsageError
from ..git import Git
from ..lock import process_alive
from ..series.manifest import Series, Upstream
from .artifacts import fetch_artifact


@dataclass
class Wheels:
    written: list[Path] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)  # {"file", "reason"}


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
          out_dir: Path, label: str) -> Wheels:
    pypi = up.pypi
    if pypi is None:
        raise UsageError(f"{up.name} has no PyPI pin; --wheels only covers PyPI-pinned upstreams")
    if not re.fullmatch(r"[a-z0-9.]+", label):
        raise UsageError(f"bad local version label {label!r}")
    version = f"{pypi.version}+{label}"
    changes = changed_files(ws, base, head) if base and head and base != head else {}
    g = Git(ws)
    out_dir.mkdir(parents=True, exist_ok=True)
    _sweep(out_dir)
    result = Wheels()
    for art in pypi.artifacts:
        if not art.file.endswith(".whl"):
            continue
        src = fetch_artifact(up.name, pypi, art, cache)
        dist, old_version, *tags = art.file[:-4].split("-")
        target = out_dir / ("-".join([dist, version, *tags]) + ".whl")
        refused = _requires_python_refuses(src, tags[-3])
        if refused:
            result.skipped.append({"file": target.name, "reason": refused})
            continue
        progress.say(f"{up.name}: writing {target.name}")
        _rewrite(src, target, dist, old_version, version, changes, pypi.map, g, base, head, up.name)
        result.written.append(target)
    return result


_TEMP = ".wheel-"  # a wheel being written: .wheel-<pid>-<random>, renamed to its name when whole
_STALE_UNNAMED = 3600.0  # a temporary wheel of an older version names no pid: stale after this long


def _sweep(out_dir: Path) -> None:
    """Remove the temporary wheels killed runs left in ``out_dir``: those of a dead pid (and old ones
    that name none). A live run's, being written now, stay."""
    for tmp in out_dir.glob(_TEMP + "*"):
        m = re.fullmatch(re.escape(_TEMP) + r"([0-9]+)-.*", tmp.name)
        try:
            stale = not process_alive(int(m[1])) if m else time.time() - tmp.lstat().st_mtime > _STALE_UNNAMED
            if stale and tmp.is_file():
                tmp.unlink()
        except OSError:
            pass


def metadata_text(wheel: Path) -> str:
    """A wheel's own METADATA (its top-level .dist-info's), or "" when it has none."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next((n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")), None)
        return zf.read(meta).decode("utf-8", "replace") if meta else ""


def _requires_python_refuses(wheel: Path, python_tag: str) -> str | None:
    """Why pip would refuse this wheel on the Python its tag names, or None."""
    m = re.fullmatch(r"cp(\d)(\d+)", python_tag)
    if not m:
        return None  # py3 / py2.py3: no single Python to check against
    text = metadata_text(wheel)
    spec = re.search(r"(?mi)^Requires-Python:\s*(.+?)\s*$", text.split("\n\n")[0])
    if not spec:
        return None
    python = (int(m.group(1)), int(m.group(2)))
    if _admits(spec.group(1), python):
        return None
    return (f"its Requires-Python {spec.group(1)!r} excludes Python {python[0]}.{python[1]}, the Python of "
            f"its tag {python_tag}: pip would refuse it")


_CLAUSE = re.compile(r"^(~=|==|!=|<=|>=|<|>)\s*(\d+(?:\.\d+)*)(\.\*)?$")


def _admits(spec: str, python: tuple[int, int]) -> bool:
    """Whether some X.Y.z release of Python X.Y satisfies every clause of a Requires-Python spec."""
    clauses = []
    for raw in (c.strip() for c in spec.split(",")):
        m = _CLAUSE.match(raw)
        if not raw:
            continue
        if not m:
            raise IntegrityError(f"cannot read the Requires-Python clause {raw!r}")
        clauses.append((m.group(1), tuple(int(x) for x in m.group(2).split(".")), bool(m.group(3))))
    micros = {0, 999} | {v[2] + d for _, v, _ in clauses if v[:2] == python and len(v) > 2 for d in (-1, 0, 1)}
    return any(all(_holds(op, ver, star, python + (z,)) for op, ver, star in clauses) for z in micros if z >= 0)


def _holds(op: str, ver: tuple[int, ...], star: bool, v: tuple[int, ...]) -> bool:
    if star or op == "~=":
        prefix = ver if star else ver[:-1]
        same = v[:len(prefix)] == prefix
        if op == "~=":
            return same and _cmp(v, ver) >= 0
        return same if op == "==" else not same
    c = _cmp(v, ver)
    return {"==": c == 0, "!=": c != 0, "<": c < 0, "<=": c <= 0, ">": c > 0, ">=": c >= 0}[op]


def _cmp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = max(len(a), len(b))
    a, b = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
    return (a > b) - (a < b)


def _rewrite(src: Path, target: Path, dist: str, old_version: str, version: str, changes: dict[str, str],
             pypi_map, g: Git, base: str, head: str, upstream: str) -> None:
    old_info, new_info = f"{dist}-{old_version}.dist-info/", f"{dist}-{version}.dist-info/"
    members = {(_to_member(p, pypi_map) or ""): (p, kind) for p, kind in changes.items()}
    members.pop("", None)
    unmapped = [p for p in changes if _to_member(p, pypi_map) is None]
    if unmapped:
        raise UsageError(f"{upstream}: patched files outside the wheel's mapped paths: {', '.join(unmapped[:5])}")
    records: list[tuple[str, bytes]] = []
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f"{_TEMP}{os.getpid()}-")
    os.close(fd)
    progress.checkpoint("wheel-writing")
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
    return g.show_blob(rev, path)


def _write(zout: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, data: bytes) -> None:
    new = zipfile.ZipInfo(name, date_time=info.date_time)
    new.external_attr = info.external_attr
    new.compress_type = zipfile.ZIP_DEFLATED
    zout.writestr(new, data)
