"""The one subprocess runner. git and docker go through small named verbs on it: carry.git's
``Git`` (with git's pinned configuration), carry.images.docker.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from .errors import CommandError


@dataclass(frozen=True)
class Result:
    argv: list[str]
    returncode: int
    stdout: Any  # str, or bytes with binary=True
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def run(
    argv: Sequence[str],
    *,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    input: str | bytes | None = None,
    check: bool = True,
    timeout: float | None = None,
    binary: bool = False,
    group: bool = False,
) -> Result:
    """Run a command, capture its output, raise CommandError when check fails.

    Output is read as bytes: ``binary`` keeps stdout so (a patch, an archive: what the caller
    writes or compares); else it is decoded as UTF-8 with its line ends as they are (no
    universal newlines: a CR git prints is kept) and a byte that is not UTF-8 replaced (text is
    for reading, never for writing back). A str ``input`` is encoded as UTF-8, a name read
    from a patch that held other bytes as those bytes again.

    ``group``: the command runs in a process group of its own, and whatever of that group is
    left when it exits or times out is killed: the processes it started (a proof's ranks) die
    with it, where a timeout would otherwise kill only the command and leave them running.
    While it runs, ``kill_groups()`` (a Ctrl-C of the caller) kills it and its group.
    """
    argv = [str(a) for a in argv]
    if isinstance(input, str):
        input = input.encode("utf-8", "surrogateescape")
    if group:
        return _run_group(argv, cwd, env, input, check, timeout, binary)
    try:
        proc = subprocess.run(
            argv,
            cwd=cwd,
            env=dict(env) if env is not None else None,
            input=input,
            capture_output=True,
            timeout=timeout,
        )
    except FileNotFoundError as exc:
        raise _not_found(argv, exc) from None
    except subprocess.TimeoutExpired as exc:
        raise CommandError(argv, 124, "", f"timed out after {timeout}s") from exc
    return _result(argv, proc.returncode, proc.stdout, proc.stderr, check, binary)


def _run_group(argv, cwd, env, input, check, timeout, binary) -> Result:
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=dict(env) if env is not None else None,
                                stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except FileNotFoundError as exc:
        raise _not_found(argv, exc) from None
    with _GROUPS_LOCK:
        _GROUPS.add(proc.pid)
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        out, err = proc.communicate()
        exc = CommandError(argv, 124, "", f"timed out after {timeout}s")
        exc.partial = (_text(out), _text(err))  # what it said before it was killed, for a log
        raise exc from None
    except BaseException:
        _kill_group(proc.pid)
        raise
    finally:
        with _GROUPS_LOCK:
            _GROUPS.discard(proc.pid)
    _kill_group(proc.pid)  # whatever of its group outlived it
    return _result(argv, proc.returncode, out, err, check, binary)


def _not_found(argv: list[str], exc: OSError) -> CommandError:
    """A program the command needs is not installed (or not on PATH): the machine's set-up, exit 2."""
    err = CommandError(argv, 127, "", f"{argv[0]}: not found ({exc})")
    err.message = f"{argv[0]} is not installed or not on PATH ({exc.strerror or exc})"
    err.hint = f"install {argv[0]} (or put the folder that holds it on PATH) and run the command again"
    err.exit_code = 2
    return err


_GROUPS: set[int] = set()  # the process groups run(group=True) has running now (any thread's)
_GROUPS_LOCK = threading.Lock()


@contextlib.contextmanager
def killable(proc: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """While the block runs, ``kill_groups()`` kills ``proc`` and its process group, as it does
    run(group=True)'s: ``proc`` leads a group of its own (spawn(..., start_new_session=True))."""
    with _GROUPS_LOCK:
        _GROUPS.add(proc.pid)
    try:
        yield proc
    finally:
        with _GROUPS_LOCK:
            _GROUPS.discard(proc.pid)


def kill_groups() -> int:
    """Kill every process group run(group=True) has running now; their callers return at once
    (each with the command's death by SIGKILL). The number killed."""
    with _GROUPS_LOCK:
        groups = list(_GROUPS)
    for pgid in groups:
        _kill_group(pgid)
    return len(groups)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _text(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", "replace")


def _result(argv, returncode, stdout, stderr, check, binary) -> Result:
    # binary=True keeps stdout as bytes (patches, archives); stderr is always text.
    err = _text(stderr)
    stdout = stdout if binary else _text(stdout)
    result = Result(argv, returncode, stdout, err)
    if check and returncode != 0:
        raise CommandError(argv, returncode, "" if binary else stdout, err)
    return result


def spawn(argv: Sequence[str], *, env: Mapping[str, str] | None = None, **popen) -> subprocess.Popen:
    """Start a process whose streams the caller reads while it runs (builds, pipelines)."""
    argv = [str(a) for a in argv]
    try:
        return subprocess.Popen(argv, env=dict(env) if env is not None else None, **popen)
    except FileNotFoundError as exc:
        raise _not_found(argv, exc) from None


def stream(argv: Sequence[str], on_line, *, env: Mapping[str, str] | None = None, cwd: Path | str | None = None,
           timeout: float | None = None, group: bool = False, keepends: bool = False) -> int:
    """Run a command, hand each line of its merged output to on_line as it comes; return its exit code.

    ``keepends``: each line keeps its line end (the last may have none), to be written as it came.
    ``group`` (and any ``timeout``): the command runs in a session of its own with nothing on its
    stdin, so that what it starts (Ray, a run's workers) can be stopped with it. When ``timeout``
    seconds have passed, the whole group is stopped (stop_group, then SIGKILL to any of it left) and,
    once its output has ended, CommandError (exit 124) says that it timed out and its process group
    was killed.
    """
    own = {"start_new_session": True, "stdin": subprocess.DEVNULL} if group or timeout is not None else {}
    proc = spawn(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                 errors="replace", **own)
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        stop_group(proc)
        _kill_group(proc.pid)  # what outlived its leader (a SIGTERM it ignored) would hold the output open

    timer = threading.Timer(timeout, expire) if timeout is not None else None
    if timer:
        timer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            on_line(line if keepends else line.rstrip("\n"))
        rc = proc.wait()
    finally:
        if timer:
            timer.cancel()
    if expired.is_set():
        raise CommandError([str(a) for a in argv], 124, "", f"timed out after {timeout:g}s: its process group was killed")
    return rc


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group ``proc`` leads, then SIGKILL what is left (ours only: we made the
    group, spawn(..., start_new_session=True)); each signal given 15 s to end it."""
    for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 15.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
