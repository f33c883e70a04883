"""The reporter of an upstream test run: a pytest plugin loaded with ``-p carry_upstream_report`` in
every rank (upstream's launch and tests are unchanged; this only writes down what happened).

Each rank appends one JSON line per event to ``$CARRY_UT_OUT/rank-<RANK>.jsonl``, flushed at once, so
that a rank killed by a crash or a hang has told which test it was in:
``boot`` (when the process began and imported this plugin, written once pytest has loaded the conftests),
``collected`` (what this launch will run, in order), ``start`` (a test begins), ``end`` (its outcome over its phases, the first line of why), ``collect-error``, ``collect-skip``,
``deselected`` (by upstream's ``-m`` or conftest, or by this run's skip/only lists), ``timeout``,
``terminated`` and ``finish``. A test running past ``$CARRY_UT_TEST_TIMEOUT`` seconds has its
threads' stacks dumped to stderr, a ``timeout`` line written, and the rank ends (exit 3): a hung
collective must not hold the whole run. A rank sent SIGTERM writes ``terminated`` with the test it
was in, then dies of the signal as it would have, also where it waits in C code (a watcher thread
reads the signal from Python's wake-up fd): torchrun stops every other rank so when one dies,
and the rank it stopped was cut short in its test, not failed by it (carry.evidence.upstream.results
tells the two apart). A rank in C code that holds the GIL past the timeout cannot write: faulthandler
dumps its stacks (first line ``Timeout (H:MM:SS)!``) and ends it ``$CARRY_UT_GIL_GRACE`` seconds
(default 60) later, and the launcher reads that line as the test's timeout.

Two settings of the host, never of a test, applied at import (before any test imports torch):
- ``CARRY_SHARED_GPU=1``: the ranks share one physical GPU. Each process gets its own
  ``NCCL_HOSTID`` (NCCL refuses two ranks on one device otherwise) and, when ``CARRY_UT_DEVICES=N``,
  ``torch.cuda.device_count()`` answers N and device indices below N name GPU 0
  (``set_device``, ``device(...)``, the property queries), so that tests which count devices see
  the ranks they run on. A tensor placed on ``cuda:k`` by index still fails, with CUDA's own error.
- Python 3.11 (CI): ``typing.override`` (3.12) is taken from typing_extensions where missing;
  megatron-core's own metadata asks for 3.12.
Imports nothing of carry: it runs in the upstream's interpreter.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import socket
import sys
import threading
import time
import typing

_IMPORTED = time.time()   # this plugin is imported first (-p): the interpreter and pytest are up, nothing else
_OUT = os.environ.get("CARRY_UT_OUT", "")
_RANK = os.environ.get("RANK") or os.environ.get("LOCAL_RANK") or "0"
_TIMEOUT = float(os.environ.get("CARRY_UT_TEST_TIMEOUT", "0") or 0)
_GIL_GRACE = float(os.environ.get("CARRY_UT_GIL_GRACE", "60") or 60)
_stream = None
_lock = threading.Lock()
# The rank's own stderr, taken before pytest's capture replaces fd 2 with a file of its own (this plugin is
# imported first, with -p): what a timed-out rank writes as it ends (its stacks) must reach the launch's
# console, and a captured stream is lost with a process that ends by os._exit or faulthandler's exit.
_console = os.fdopen(os.dup(2), "w", buffering=1)


def _emit(**event) -> None:
    if _OUT:
        with _lock:
            _write(event)


def _write(event: dict) -> None:
    """One line of this rank's record, the lock held."""
    global _stream
    if _stream is None:
        os.makedirs(_OUT, exist_ok=True)
        _stream = open(os.path.join(_OUT, f"rank-{_RANK}.jsonl"), "a", buffering=1, encoding="utf-8")
    event["t"] = round(time.time(), 3)  # wall clock: lines of two sides or ranks can be set side by side
    _stream.write(json.dumps(event, sort_keys=True) + "\n")
    _stream.flush()


def _lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            return [line.strip() for line in f if line.strip()]
    except OSError:
        return []


# -- the host's settings -------------------------------------------------------------------------
def _shared_gpu() -> None:
    os.environ["NCCL_HOSTID"] = f"{socket.gethostname()}-carry-shared-gpu-{os.getpid()}"
    n = int(os.environ.get("CARRY_UT_DEVICES", "0") or 0)
    if n <= 0:
        return
    import torch

    cuda = torch.cuda

    def one(index):
        if isinstance(index, torch.device):
            index = index.index
        if isinstance(index, str):
            index = torch.device(index).index
        return 0 if index is not None and 0 <= int(index) < n else index

    def mapped(fn):
        def call(device=None, *args, **kwargs):
            return fn(one(device) if device is not None else None, *args, **kwargs)
        call.__wrapped__ = fn
        return call

    real_set, real_device = cuda.set_device, cuda.device
    cuda.device_count = lambda: n
    cuda.set_device = lambda device: real_set(one(device))

    class device(real_device):  # noqa: N801 - torch's own name
        def __init__(self, index):
            super().__init__(one(index))

    cuda.device = device
    for name in ("get_device_properties", "get_device_name", "get_device_capability", "mem_get_info"):
        if hasattr(cuda, name):
            setattr(cuda, name, mapped(getattr(cuda, name)))
    print(f"[carry] shared GPU: device_count() -> {n}, device indices 0..{n - 1} -> GPU 0, "
          f"NCCL_HOSTID {os.environ['NCCL_HOSTID']}", file=sys.stderr, flush=True)


if os.environ.get("CARRY_SHARED_GPU") == "1":
    _shared_gpu()
if not hasattr(typing, "override"):
    import typing_extensions

    typing.override = typing_extensions.override


# -- the hooks -----------------------------------------------------------------------------------
_state: dict[str, dict] = {}
_timer: threading.Timer | None = None


def _born() -> float | None:
    """When this process began (wall clock, to the second the kernel's boot time is given in), or None."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])   # field 22, starttime: clock ticks since boot
        with open("/proc/stat", encoding="ascii") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def pytest_configure(config):
    """``boot``: when the rank's process began, when it imported this plugin, and now, once pytest has loaded
    its plugins and the initial conftests (upstream's conftest imports torch and its package): with
    ``collected`` and the first ``start``, what a launch's start-up was spent on. It is no record of a test
    and does not say that the session began."""
    _emit(ev="boot", born=_born(), imported=round(_IMPORTED, 3))


def pytest_collection_modifyitems(session, config, items):
    skip = set(_lines(os.environ.get("CARRY_UT_SKIP", "")))
    only = set(_lines(os.environ.get("CARRY_UT_ONLY", ""))) if os.environ.get("CARRY_UT_ONLY") else None
    keep, drop = [], []
    for item in items:
        if item.nodeid in skip or (only is not None and item.nodeid not in only):
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        for item in drop:
            _emit(ev="deselected", id=item.nodeid, by="carry")
        items[:] = keep


def pytest_collection_finish(session):
    _emit(ev="collected", ids=[item.nodeid for item in session.items])


def pytest_deselected(items):
    for item in items:
        _emit(ev="deselected", id=item.nodeid, by="upstream")


def pytest_collectreport(report):
    if report.failed:
        _emit(ev="collect-error", id=report.nodeid or ".", reason=_why(report))
    elif report.skipped:  # a module that skips itself whole (pytest.importorskip, a module-level skip)
        _emit(ev="collect-skip", id=report.nodeid or ".", reason=_why(report))


_current: str = ""   # the test this rank is in, for the SIGTERM record
_PID = os.getpid()   # this rank: a process a test forks inherits the handler, and is not the rank
_said = False        # the SIGTERM record is written once (the handler and the watcher may both get there)


def _terminated(signum, frame) -> None:
    if os.getpid() == _PID:
        _say_terminated(signum)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _say_terminated(signum: int) -> None:
    global _said
    # The lock may be held by this very thread (the signal came inside _emit): wait a moment, no more,
    # and write nothing then (the rank is taken for one that died of itself, as before the record).
    if _lock.acquire(timeout=2):
        try:
            if not _said:
                _said = True
                _write({"ev": "terminated", "id": _current, "signal": int(signum)})
        finally:
            _lock.release()


# A Python handler runs only when the main thread comes back to Python: a rank that waits in C for a
# peer that died (an NCCL collective, a CUDA synchronisation) never does, so torchrun's SIGTERM did
# nothing and its SIGKILL came 30 s later, with no record (2026-12-05, H100: 12 launches of 28 ended
# so). Python's C-level handler also writes the signal's number to the wake-up fd at once, from any
# thread: a watcher thread reads it, writes the record and ends the rank of SIGTERM itself.
_wake_r = _wake_w = -1


def _watch() -> None:
    while True:
        try:
            got = os.read(_wake_r, 64)   # retried by Python itself when a signal interrupts it (PEP 475)
        except OSError:
            return
        if not got:
            return
        # a test that put in its own SIGTERM handler gets the signal there, as without the reporter
        if signal.SIGTERM in got and signal.getsignal(signal.SIGTERM) is _terminated:
            _say_terminated(signal.SIGTERM)
            _die_of(signal.SIGTERM)


def _die_of(signum: int) -> None:
    """End this process of SIGNUM's default action, from any thread (signal.signal is the main
    thread's only): the C library's own signal(), then the signal; os._exit(128 + SIGNUM) if it fails."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
        if libc.signal(int(signum), None) != ctypes.c_void_p(-1).value:   # SIG_DFL is 0
            os.kill(os.getpid(), signum)
            time.sleep(5)
    finally:
        os._exit(128 + int(signum))


def _keep_waking() -> None:
    """The wake-up fd is the process's one: a test's asyncio loop takes it for its own signal handlers
    and sets none back when it closes. Taken again before each test, unless another holds it now."""
    if _wake_w < 0:
        return
    try:
        old = signal.set_wakeup_fd(_wake_w, warn_on_full_buffer=False)
        if old not in (-1, _wake_w):
            signal.set_wakeup_fd(old)
    except ValueError:   # not the main thread
        pass


def _forked() -> None:   # a process a test forks keeps no wake-up fd of the rank's
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:
        pass


if _OUT and threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGTERM, _terminated)
    _wake_r, _wake_w = os.pipe()   # not inherited by a program a test runs (close-on-exec)
    os.set_blocking(_wake_w, False)
    _keep_waking()
    os.register_at_fork(after_in_child=_forked)
    threading.Thread(target=_watch, name="carry-sigterm", daemon=True).start()


def _expire(nodeid: str) -> None:
    _emit(ev="timeout", id=nodeid, seconds=_TIMEOUT)
    print(f"[carry] {nodeid} ran past {_TIMEOUT:.0f} s: the threads' stacks follow, then this rank ends",
          file=_console, flush=True)
    faulthandler.dump_traceback(file=_console, all_threads=True)
    _console.flush()
    os._exit(3)


def pytest_runtest_logstart(nodeid, location):
    global _timer, _current
    _state[nodeid] = {"t0": time.monotonic(), "outcome": "passed", "phase": "call", "reason": ""}
    _current = nodeid
    _keep_waking()
    _emit(ev="start", id=nodeid)
    if _TIMEOUT > 0:
        _timer = threading.Timer(_TIMEOUT, _expire, (nodeid,))
        _timer.daemon = True
        _timer.start()
        faulthandler.dump_traceback_later(_TIMEOUT + _GIL_GRACE, exit=True, file=_console)  # if the GIL never comes back


def pytest_runtest_logreport(report):
    st = _state.setdefault(report.nodeid, {"t0": time.monotonic(), "outcome": "passed", "phase": "call", "reason": ""})
    xfail = getattr(report, "wasxfail", None)
    if report.skipped:
        outcome = "xfailed" if xfail is not None else "skipped"
    elif report.failed:
        outcome = "failed" if report.when == "call" else "error"
    elif report.when == "call" and xfail is not None:
        outcome = "xpassed"
    else:
        return
    if st["outcome"] in ("passed", "xpassed") or outcome in ("failed", "error"):
        st.update(outcome=outcome, phase=report.when, reason=_why(report))


def pytest_runtest_logfinish(nodeid, location):
    global _timer, _current
    if _timer is not None:
        _timer.cancel()
        _timer = None
        faulthandler.cancel_dump_traceback_later()
    st = _state.pop(nodeid, None) or {"t0": time.monotonic(), "outcome": "error", "phase": "?", "reason": "no report"}
    _emit(ev="end", id=nodeid, outcome=st["outcome"], phase=st["phase"], reason=st["reason"],
          seconds=round(time.monotonic() - st["t0"], 3))
    _current = ""   # after its end is written: stopped before that, the rank was still in it


def pytest_sessionfinish(session, exitstatus):
    _emit(ev="finish", exitstatus=int(exitstatus))


def _why(report) -> str:
    """The first line that says why: a skip's reason, a failure's exception line."""
    rep = report.longrepr
    if rep is None:
        return ""
    if isinstance(rep, tuple) and len(rep) == 3:  # a skip: (file, line, reason)
        return str(rep[2]).removeprefix("Skipped: ")[:500]
    crash = getattr(rep, "reprcrash", None)
    text = crash.message if crash is not None else str(rep)
    lines = [line for line in text.splitlines() if line.strip()]
    if crash is None and lines:  # a collection error's text: its last E line says it best
        errors = [line for line in lines if line.startswith("E ")]
        lines = errors[-1:] or lines[-1:]
    return (lines[0] if lines else "")[:500]
