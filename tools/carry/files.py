"""Files written so that a reader, or a run killed half-way, sees the old content or the new;
and files read as input only when they are regular files.

Each write goes to a temporary file beside the target, is flushed to disk,
then renamed over the target; the directory is flushed too, so the rename
itself survives a crash. Reports, the workspace record, its journal and
edited series files all go through here.

Each input the tool reads as a file (series.toml, a patch, a proof, a requirements list, a
config, a record) is read with ``read_input``: a FIFO, a socket or a device in its place is
refused (NotAFileError, exit 2) before any read that could block or never end.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from .errors import NotAFileError


def kind_of(mode: int) -> str:
    """What a file of this ``st_mode`` is, in words ("a FIFO")."""
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symlink"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def _regular(path: Path, mode: int) -> None:
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if not stat.S_ISREG(mode):
        raise NotAFileError(path, kind_of(mode))


def not_regular(path: Path | str) -> str | None:
    """What ``path`` is when it exists and is not a regular file (a link is followed); else None."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else kind_of(mode)


def read_input(path: Path | str) -> bytes:
    """The bytes of a regular file (or of the one a link names). A directory is IsADirectoryError and
    a missing file FileNotFoundError, as open() says them; a FIFO, a socket or a device is
    NotAFileError, found by stat before any open, and again on the opened file (O_NONBLOCK: one
    swapped in between is not waited on)."""
    path = Path(path)
    _regular(path, os.stat(path).st_mode)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        _regular(path, os.fstat(fd).st_mode)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_input_text(path: Path | str) -> str:
    """``read_input`` as UTF-8 text (UnicodeDecodeError when it is not), line ends read as
    ``Path.read_text`` reads them (universal newlines): for a TOML or JSON file, never a patch."""
    return read_input(path).decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")


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
