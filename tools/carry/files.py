"""Files written so that a reader, or a run killed half-way, sees the old content or the new.

Each write goes to a temporary file beside the target, is flushed to disk,
then renamed over the target; the directory is flushed too, so the rename
itself survives a crash. Reports, the workspace record, its journal and
edited series files all go through here.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any


def write_atomic(path: Path | str, data: str | bytes) -> None:
    """Replace ``path`` by ``data`` (text is written as UTF-8, bytes as they are)."""
    path = Path(path)
    tmp = stage(path, data.encode("utf-8") if isinstance(data, str) else data)
    try:
        install(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def stage(path: Path | str, data: bytes) -> Path:
    """``data`` in a new temporary file beside ``path``, flushed to disk, with ``path``'s mode (a
    new file: 0644); ``install`` puts it in place. The caller may read it first (export checks
    the patch it is about to write) and unlinks it when it is not installed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            if exc.filename is None:  # write() names no file: a full disk must say which one it was
                raise OSError(exc.errno, exc.strerror, str(path)) from exc
            raise
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o777)
        else:
            os.chmod(tmp, 0o644)  # mkstemp makes it private; these files are for everyone to read
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def install(tmp: Path, path: Path | str) -> None:
    """Rename a file ``stage`` wrote over ``path``, and flush the directory (the rename survives a crash)."""
    path = Path(path)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_json(path: Path | str, doc: dict[str, Any]) -> None:
    write_atomic(path, json_text(doc, indent=2) + "\n")


def json_text(doc: Any, **kwargs: Any) -> str:
    """Strict JSON: a NaN or an infinity (a broken run's metric) is written as the string "NaN",
    "Infinity" or "-Infinity", which every JSON reader takes, not as the bare token only Python reads."""
    return json.dumps(_finite(doc), allow_nan=False, **kwargs)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
