"""Typed errors. Only ``cli.run`` turns them into a message and an exit code.

Exit codes (README.md, "Exit codes", and every command's --help): 0 success;
1 the operation failed and nothing was changed; 2 bad usage, bad input or bad
configuration. A hint is printed as ``next:``; a command in it is in
backticks, spelled by carry.shell (every word quoted), and runs as written.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from . import shell


class CarryError(Exception):
    """Base class: a message for people plus the exit code it maps to."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def render(self) -> str:
        text = f"error: {self.message}"
        if self.hint:
            text += f"\n  next: {self.hint}"
        return text


# -- exit 2: the input is wrong -------------------------------------------------
class UsageError(CarryError):
    exit_code = 2


class ConfigError(CarryError):
    """The series manifest (or another TOML input) is invalid."""

    exit_code = 2


class PatchFormatError(ConfigError):
    """A patch file is malformed or unsafe (escapes the tree, symlinks...)."""


class FileSystemError(CarryError):
    """A path the command needs is the wrong kind of thing, unwritable, or its disk is full.

    Exit 2: the run stopped before it changed anything it does not undo, and what must change
    is the machine's set-up (a path, a mount, a permission, free space), not the series.
    """

    exit_code = 2


class NotAFileError(FileSystemError):
    """A path read as a file is a FIFO, a socket or a device: never opened for a read that could block."""

    def __init__(self, path: Path | str, kind: str):
        super().__init__(f"{path} is {kind}, not a regular file",
                         hint="put the file itself in its place (a FIFO, a socket or a device is never read: a "
                              "read could wait for ever, or never end)")
        self.path = Path(path)


class NoSpaceError(FileSystemError):
    """A write failed for want of disk space (ENOSPC), in this process or in one it ran."""


_NO_SPACE_TEXT = ("No space left on device", "[Errno 28]", "Disk quota exceeded")
# What git says when a write fails without naming the errno (a full disk among other causes):
# read as a full disk only when the disk it wrote to is in fact (nearly) full.
_WRITE_FAILED_TEXT = ("Out of diskspace", "unable to write", "could not write", "write error", "short write",
                      "failed to write", "unable to checkout working tree", "unable to append", "unable to create")
_NEARLY_FULL = 16 << 20


def says_no_space(text: str) -> bool:
    """Whether a command's output reports a full disk (git, pip and tar all say it so)."""
    return any(t in text for t in _NO_SPACE_TEXT)


def _existing(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _mount_of(path: Path) -> Path:
    path = _existing(path)
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def _nearly_full(path: Path) -> bool:
    try:
        st = os.statvfs(_existing(path))
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < _NEARLY_FULL or (st.f_files > 0 and st.f_favail == 0)


def no_space(place: Path | str, detail: str = "") -> "NoSpaceError":
    """The full-disk error for a write to ``place``: the place, its mount point and what is free there."""
    place = Path(place)
    mount = _mount_of(place)
    try:
        st = os.statvfs(_existing(place))
        free = f", {st.f_bavail * st.f_frsize // 1024} KiB free" + (", no inodes free" if st.f_files and not st.f_favail
                                                                      else "")
    except OSError:
        free = ""
    return NoSpaceError(f"no space left on the device holding {place} (the file system mounted at {mount}{free})"
                        + (f": {detail}" if detail else ""),
                        hint=f"free some space on {mount} ({shell.code('df', '-h', mount)} shows it), or point "
                             "the command at a folder on another disk (--workdir, --cache, --json, --wheels; "
                             "TMPDIR for temporary files), then " + shell.run_again())


def full_disk_in_output(text: str, where: Path) -> "NoSpaceError | None":
    """The full-disk error a failed command's output shows, naming the place it wrote to: of the
    absolute paths the output quotes and ``where`` (git's -C folder), the first on a full disk;
    None when it shows none."""
    candidates = [Path(m) for m in re.findall(r"'(/[^'\n]+)'", text)] + [Path(where)]
    place = next((c for c in candidates if _nearly_full(c)), None)
    if says_no_space(text) or (place is not None and any(t in text for t in _WRITE_FAILED_TEXT)):
        place = place or Path(where)
        said = [line.strip() for line in text.splitlines() if any(t in line for t in _NO_SPACE_TEXT + _WRITE_FAILED_TEXT)]
        return no_space(place, said[0] if said else "")
    return None


def _where(exc: OSError) -> str:
    return " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)


def from_os_error(exc: OSError) -> CarryError | None:
    """The named error for an OSError about a path; None for one that says nothing we can name.

    One place for every command: a file where a folder must be (or above it), a folder where a
    file must be, a read-only mount, no permission, a full disk.
    """
    where = _where(exc)
    code = exc.errno
    if code in (errno.ENOSPC, errno.EDQUOT):
        if exc.filename is not None:
            return no_space(exc.filename, os.strerror(code))
        # A failed write() names no file (carry.files names the ones it writes): say where the command writes.
        return NoSpaceError(f"no space left on the device holding the work directory, the cache or the temporary "
                            f"folder ($TMPDIR) ({os.strerror(code)})",
                            hint="free some space there (`df -h` shows each disk), or point --workdir / --cache / "
                                 "TMPDIR at another disk, then " + shell.run_again())
    if not where:
        return None
    if code == errno.ENOTDIR:
        return FileSystemError(f"{where}: not a directory (a file is in its place or in the place of a "
                               "folder above it)", hint="move that file out of the way, or give the command another path")
    if code == errno.EISDIR:
        return FileSystemError(f"{where} is a directory, where a file is needed",
                               hint=f"move it out of the way ({shell.code('mv', Path(where), Path(where + '.moved'))}) "
                                    f"and {shell.again({}) or 'run the command again'}"
                               if exc.filename2 is None else "move that directory out of the way")
    if code == errno.EROFS:
        return FileSystemError(f"{where} is on a read-only file system",
                               hint="point --workdir / --cache at a writable place and " + shell.run_again())
    if code == errno.EACCES:
        return FileSystemError(f"permission denied: {where}",
                               hint="make it (and the folders above it) writable by you, or use another path")
    if code == errno.EPERM:
        return FileSystemError(f"{where}: operation not permitted",
                               hint=f"check its owner and attributes ({shell.code('lsattr', '-d', Path(where))}: an immutable folder "
                                    "takes no new files), or use another path")
    if code is not None:
        return FileSystemError(f"{where}: {os.strerror(code)}")
    return None


# -- exit 1: the operation failed, nothing changed -------------------------------
class OperationError(CarryError):
    exit_code = 1


class SourceError(OperationError):
    """An upstream source could not be fetched or did not verify."""


class IntegrityError(SourceError):
    """A downloaded or cached artifact does not match its pinned hash."""


class ConflictError(OperationError):
    """A patch does not apply to its base."""


class DirtyTreeError(OperationError):
    """A workspace or --into target has changes the tool did not make."""


class LockError(OperationError):
    """Another process holds the workspace lock."""


class DriftError(OperationError):
    """Exported patch files would differ from the committed ones."""

    def __init__(self, message: str, *, files: list[str], hint: str | None = None):
        super().__init__(message, hint=hint)
        self.files = files


class CommandError(OperationError):
    """An external command failed in a way the caller did not expect."""

    def __init__(self, argv: list[str], returncode: int, stdout: str, stderr: str):
        more = " ..." if len(argv) > 6 else ""
        tail = (stderr or stdout).strip().splitlines()[-8:]
        super().__init__(f"{shell.code(*argv[:6])}{more} exited {returncode}" + ("\n    " + "\n    ".join(tail) if tail else ""))
        if says_no_space(stderr + stdout):
            # Not a failure of the command's own: the disk is full (exit 2, like NoSpaceError).
            self.message = f"no space left on the device: {self.message}"
            self.hint = "free some space there (or point --workdir / --cache at another disk) and " + shell.run_again()
            self.exit_code = 2
        self.argv = argv
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
