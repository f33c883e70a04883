"""A prove run's scratch folder (the extracted trees, each run's reports, the zygotes' sockets),
named after its owner so that a later run can tell a folder a killed prove left.

``carry-prove-<pid>.<start>-XXXX`` in the temporary folder: the owner's pid and its start time
(``/proc/<pid>/stat``, where there is one: a pid the kernel gave to another process since is not
the owner). ``sweep()`` removes the folders whose owner is dead, and only those: another prove
running now keeps its trees.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from pathlib import Path

PREFIX = "carry-prove-"
_NAME = re.compile(re.escape(PREFIX) + r"(\d+)\.(\d+)-")


def _started(pid: int) -> int:
    """The process's start time in clock ticks since boot (0 where /proc cannot say)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


def _alive(pid: int, started: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: alive
    now = _started(pid)
    return not (started and now and now != started)


def sweep(root: Path | None = None) -> list[Path]:
    """Remove the scratch folders of prove runs that are dead; the folders removed."""
    root = Path(root or tempfile.gettempdir())
    gone = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return gone
    for path in entries:
        m = _NAME.match(path.name)
        if not m or not path.is_dir() or path.is_symlink():
            continue
        pid, started = int(m.group(1)), int(m.group(2))
        if pid == os.getpid() or _alive(pid, started):
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            gone.append(path)
    return gone


@contextlib.contextmanager
def folder(root: Path | None = None):
    """A scratch folder owned by this process, removed on the way out (also on Ctrl-C)."""
    pid = os.getpid()
    path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{pid}.{_started(pid)}-", dir=root))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
