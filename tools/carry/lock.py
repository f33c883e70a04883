"""An exclusive lock on a work directory, so concurrent applies serialise."""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path

from . import progress
from .errors import LockError


class DirLock:
    def __init__(self, path: Path, timeout: float = 600.0):
        self.path = path
        self.timeout = timeout
        self._fd: int | None = None

    def __enter__(self) -> "DirLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.timeout
        announced = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise
                holder = self._holder()
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise LockError(f"{self.path.parent.parent} is locked by another run (pid {holder})",
                                    hint="wait for it to finish, or raise --lock-timeout") from None
                if not announced:
                    progress.say(f"waiting for the lock on {self.path.parent.parent} (held by pid {holder})")
                    announced = True
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return self

    def _holder(self) -> str:
        try:
            return self.path.read_text().strip() or "?"
        except OSError:
            return "?"

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
