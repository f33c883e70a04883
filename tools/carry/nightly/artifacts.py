"""What a cell's run left in its folder, read so that no file of it can stop the night.

The run owns its folder: any file there may be missing, a directory, a FIFO, a symlink (to
``/dev/zero``, or out of the folder), huge, not UTF-8, or JSON nested past the parser's depth.
Each reader here returns what it could read and, when it could not, a problem that names the
file and what it is; carry.nightly.judge fails the cell on that problem. Nothing is followed
through a symlink, nothing blocks on a FIFO, nothing is read past a bound.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from ..files import kind_of
from .runlog import DuplicateKey, loads_object

LOG_LIMIT = 256 * 1024 * 1024       # a log past this is not read at all: its middle could hold anything
METRICS_LIMIT = 64 * 1024 * 1024    # NeMo-RL's metrics.json is kilobytes
LISTING_LIMIT = 2000                # artifact names listed in run.json


def read_bytes(path: Path, limit: int) -> tuple[bytes | None, str]:
    """The bytes of a regular file (not a symlink) of at most ``limit`` bytes; else None and why.
    A missing file is (None, "")."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None, ""
    except OSError as exc:
        return None, f"{path.name} cannot be read: {exc.strerror or exc}"
    if not stat.S_ISREG(st.st_mode):
        return None, f"{path.name} is {kind_of(st.st_mode)}, not a file"
    try:
        # O_NOFOLLOW and O_NONBLOCK: a file swapped for a symlink or a FIFO since lstat is refused, not waited on.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        return None, f"{path.name} cannot be opened: {exc.strerror or exc}"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, f"{path.name} is {kind_of(st.st_mode)}, not a file"
        if st.st_size > limit:
            return None, f"{path.name} is {st.st_size} bytes, past the {limit} bytes the nightly reads"
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:  # it grew while being read
                return None, f"{path.name} is past the {limit} bytes the nightly reads"
        return b"".join(chunks), ""
    except OSError as exc:
        return None, f"{path.name} cannot be read: {exc.strerror or exc}"
    finally:
        os.close(fd)


def read_log(path: Path, limit: int = LOG_LIMIT) -> tuple[str | None, str]:
    """A log as text (bytes that are not UTF-8 replaced: a log is read for its lines); else None and why."""
    data, problem = read_bytes(path, limit)
    return (None, problem) if data is None else (data.decode("utf-8", errors="replace"), "")


def read_metrics(path: Path, limit: int = METRICS_LIMIT) -> tuple[dict[str, Any] | None, str]:
    """A metrics file as a JSON object; else None and why (a missing file is (None, ""))."""
    data, problem = read_bytes(path, limit)
    if data is None:
        return None, problem
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"{path.name} is not UTF-8 ({exc.reason} at byte {exc.start})"
    try:
        doc = loads_object(text)
    except RecursionError:
        return None, f"{path.name} is nested too deeply to read"
    except DuplicateKey as exc:
        return None, f"{path.name} is ambiguous: {exc}"
    except ValueError as exc:  # JSONDecodeError, and the int digit limit's plain ValueError
        return None, f"{path.name} is not valid JSON: {str(exc)[:200]}"
    if not isinstance(doc, dict):
        return None, f"{path.name} is not a JSON object (a {type(doc).__name__})"
    return doc, ""


def listing(root: Path, limit: int = LISTING_LIMIT) -> list[str]:
    """The regular files under ``root`` (relative, sorted), symlinks not followed, at most ``limit``
    names (then one line saying how many more). Iterative: a run's folder nested thousands deep
    is walked without recursion."""
    found: list[str] = []
    more = 0
    stack = [root]
    while stack:
        top = stack.pop()
        try:
            with os.scandir(top) as it:
                entries = list(it)
        except OSError:
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    stack.append(Path(e.path))
                elif e.is_file(follow_symlinks=False):
                    if len(found) < limit:
                        found.append(str(Path(e.path).relative_to(root)))
                    else:
                        more += 1
            except OSError:
                continue
    found.sort()
    if more:
        found.append(f"... and {more} more files")
    return found
