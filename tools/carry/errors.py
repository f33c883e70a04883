"""Typed errors. Only ``cli.run`` turns them into a message and an exit code.

Exit codes (README.md, "Exit codes", and every command's --help): 0 success;
1 the operation failed and nothing was changed; 2 bad usage, bad input or bad
configuration. A hint is printed as ``next:``; a command in it is in
backticks and runs as written.
"""

from __future__ import annotations


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


class ProofError(OperationError):
    """A proof did not go red on the pristine base and green when patched."""


class CommandError(OperationError):
    """An external command failed in a way the caller did not expect."""

    def __init__(self, argv: list[str], returncode: int, stdout: str, stderr: str):
        shown = " ".join(argv[:6]) + (" ..." if len(argv) > 6 else "")
        tail = (stderr or stdout).strip().splitlines()[-8:]
        super().__init__(f"`{shown}` exited {returncode}" + ("\n    " + "\n    ".join(tail) if tail else ""))
        self.argv = argv
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
