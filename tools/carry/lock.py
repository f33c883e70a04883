"""Exclusive locks on a directory, so concurrent runs serialise, and scratch space under them.

A lock is a file held with ``flock``. The holder removes the file when it
lets go, so a finished (or failed) run leaves nothing behind; a waiter that
got the lock on a file removed meanwhile sees the inode changed and tries
again. A run killed with the lock held leaves the file, which the kernel has
already unlocked: the next run takes it and removes it.
"""

from __future__ import annotations

import contextvars
import errno
import fcntl
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from . import progress, shell
from .errors import LockError

LOCK_TIMEOUT = 600.0  # seconds a run waits for another one before giving up (--lock-timeout)

# How long the cache's locks (``building``) wait: a command's --lock-timeout, set with ``patience``.
_patience: contextvars.ContextVar[float] = contextvars.ContextVar("carry_lock_patience", default=LOCK_TIMEOUT)


@contextmanager
def patience(timeout: float) -> Iterator[None]:
    """Every lock taken inside waits at most ``timeout`` seconds unless told otherwise."""
    token = _patience.set(timeout)
    try:
        yield
    finally:
        _patience.reset(token)


class DirLock:
    def __init__(self, path: Path, timeout: float = LOCK_TIMEOUT, what: Path | None = None):
        self.path = path
        self.timeout = timeout
        self.what = what or path.parent  # what the lock protects, for messages
        self._fd: int | None = None

    def __enter__(self) -> "DirLock":
        deadline = time.monotonic() + self.timeout
        announced = False
        while True:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:
                continue  # the folder went away with the last holder's cleanup
            if not self._wait(fd, deadline, announced):
                os.close(fd)
                raise LockError(f"{self.what} is locked by another run (pid {self._holder()})",
                                hint=self._hint())
            announced = True
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the holder removed this file as we waited: lock the new one
        try:
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
        except OSError as exc:
            os.close(fd)
            raise OSError(exc.errno, exc.strerror, str(self.path)) from exc  # a full disk: say which
        self._fd = fd
        return self

    def _hint(self) -> str:
        longer = max(LOCK_TIMEOUT, self.timeout * 4)
        again = shell.again({"--lock-timeout": [f"{longer:g}"]})
        if again is None:  # not a command's lock: the caller's own timeout
            return "wait for it to finish, then try again"
        return f"wait for it to finish, or wait up to {longer:g} s for it: {again}"

    def _wait(self, fd: int, deadline: float, announced: bool) -> bool:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
            if time.monotonic() >= deadline:
                return False
            if not announced:
                progress.say(f"waiting for the lock on {self.what} (held by pid {self._holder()})")
                announced = True
            time.sleep(0.05)

    def _holder(self) -> str:
        try:
            return self.path.read_text().strip() or "?"
        except OSError:
            return "?"

    def __exit__(self, *exc) -> None:
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)  # still held: nobody can take the old file meanwhile
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None
        try:
            self.path.parent.rmdir()  # only when empty: the folder existed for the lock alone
        except OSError:
            pass


@contextmanager
def holding(f, what: Path, *, shared: bool = False, timeout: float = LOCK_TIMEOUT) -> Iterator[None]:
    """``flock`` on the open file ``f`` itself, for a file that several runs write in place (the
    nightly's history): exclusive, or ``shared`` among readers; LockError after ``timeout`` s.
    The file stays where it is (a DirLock's file goes with its holder)."""
    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    deadline = time.monotonic() + timeout
    announced = False
    while True:
        try:
            fcntl.flock(f.fileno(), mode | fcntl.LOCK_NB)
            break
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
        if time.monotonic() >= deadline:
            raise LockError(f"{what} is locked by another run for more than {timeout:g} s",
                            hint="wait for it to finish, then try again")
        if not announced:
            progress.say(f"waiting for the lock on {what} (another run reads or writes it)")
            announced = True
        time.sleep(0.05)
    try:
        yield
    finally:
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def process_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs here (one of another user's counts: it may be at work)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


BUILD_PREFIX = ".build-"


@contextmanager
def building(parent: Path, timeout: float | None = None) -> Iterator[Path]:
    """A fresh scratch folder under ``parent``, with ``parent`` locked (waiting ``timeout``, or the
    run's --lock-timeout).

    Scratch folders a killed run left in ``parent`` are removed first: under
    the lock, no live run can be using one.
    """
    parent.mkdir(parents=True, exist_ok=True)
    with DirLock(parent / ".lock", _patience.get() if timeout is None else timeout, what=parent):
        for stale in parent.glob(BUILD_PREFIX + "*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(dir=parent, prefix=BUILD_PREFIX))
        try:
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def sweep_builds(root: Path) -> None:
    """Remove the scratch folders killed or interrupted runs left anywhere in the cache ``root``.

    ``building`` clears its own folder's leftovers, but only when it builds there again; a folder
    whose artifact is already cached would keep them for good. A run building holds its folder's
    lock for as long as its scratch lives: a folder whose lock is free (taken here without
    waiting) holds only dead runs' scratch.
    """
    if not root.is_dir():
        return
    parents = {p.parent for depth in ("", "*/", "*/*/") for p in root.glob(depth + BUILD_PREFIX + "*")}
    for parent in sorted(parents):
        try:
            with DirLock(parent / ".lock", 0, what=parent):
                for stale in parent.glob(BUILD_PREFIX + "*"):
                    shutil.rmtree(stale, ignore_errors=True)
        except LockError:
            continue  # a live run is building there
