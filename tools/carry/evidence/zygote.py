"""A zygote per prove run: proofs fork from one interpreter that has imported what no tree provides.

A proof run used to be a fresh ``python -m pytest``: 5-9 s of imports on 2 cores before any
proof did its work, most of it torch and the parts of torch megatron-core pulls in, the same for
every tree. prove starts one zygote per interpreter its proofs run in (this Python, and each
proof environment of carry.evidence.proofenv) before it extracts the trees; the zygote
(``proofsite/carry_zygote.py``) imports ``PRELOAD`` and nothing of a tree, and each run forks
from it, puts its trees first on ``sys.path`` and imports megatron-core from them. The run's
ranks fork from that child (``proofs/_world.py``). A fork shares nothing with an earlier run: the
zygote never runs a proof, so every run starts from the same state a fresh interpreter would
have after those imports (tests/test_zygote.py checks it, and that both ways give the same
verdicts: ``prove --fresh`` runs the old way).

Where torch sees a CUDA device the zygote is not used (prove runs fresh interpreters, as
before): a fork after CUDA is not safe, and imports the zygote makes may reach the driver.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from .. import progress
from ..errors import CommandError
from ..runner import spawn
from . import reach

SERVER = Path(__file__).resolve().parent / "proofsite" / "carry_zygote.py"

# What megatron-core (and the proofs' own helpers) import that no tree provides: measured with
# ``python -X importtime`` on the series' megatron-lm tree (torch 5-7 s, then torch._inductor,
# torch.distributed.tensor and torch._dynamo another 4-6 s), and the proof environments'
# third-party imports (Megatron-Bridge's checkpointing: transformers, modelopt, datasets). A name
# an interpreter lacks is skipped (the proof then meets the ImportError itself, as it would fresh).
PRELOAD = (
    "torch", "torch.nn.functional", "torch.distributed", "torch.multiprocessing",
    "torch.distributed.tensor", "torch.distributed._tensor", "torch.distributed._symmetric_memory",
    "torch._dynamo", "torch._dynamo.backends.registry", "torch._dynamo.repro.after_dynamo",
    "torch._inductor.compile_fx", "torch._inductor.select_algorithm", "torch._inductor.lowering",
    "torch.utils.cpp_extension", "torch.utils.tensorboard", "torch.testing",
    # megatron-core's dist_checkpointing imports it where a rank first saves or loads (0.6-1.5 s a rank)
    "torch.distributed.checkpoint",
    "triton", "numpy", "einops", "packaging.version", "multistorageclient", "absl.logging",
    "pytest", "_pytest.junitxml",
)
# What every zygote holds, also for proofs that never import torch.
PRELOAD_BASE = ("pytest", "_pytest.junitxml")
# Only where the interpreter is a proof environment's (requirements.txt): only its proofs use them.
# Not modelopt: it looks for megatron-core as it is imported (the zygote would refuse to fork).
# Not transformers.modeling_utils nor datasets: each starts a thread of its own (datasets' is
# pyarrow's jemalloc), and a fork keeps only the forking thread; the one thread torch starts is
# the one every forked rank has always had.
PRELOAD_ENV = ("transformers", "omegaconf", "requests", "tensorboard")


class Zygote:
    """One started zygote (``start``), serving forks (``run``) until ``close``."""

    def __init__(self, python: str, scratch: Path, exclude: set[str], env_extra: bool, torch: bool = True):
        self.python, self.torch = python, torch
        n = len(list(scratch.glob("zygote-*.log")))
        self.log = scratch / f"zygote-{n}.log"
        # Linux: an abstract socket (no path: a deep TMPDIR would pass the 108 bytes a path may have).
        self.socket = (f"@carry-zygote-{os.getpid()}-{n}-{os.urandom(4).hex()}" if sys.platform.startswith("linux")
                       else str(scratch / f"zygote-{n}.sock"))
        # ``torch``: whether the proofs reach torch at all (carry.evidence.reach); where they do not, its
        # stack (3.6-6 s) is not worth preloading, and the zygote holds pytest alone.
        modules = (PRELOAD + (PRELOAD_ENV if env_extra else ())) if torch else PRELOAD_BASE
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CARRY_TREE_", "CARRY_PROOF_"))}
        with open(self.log, "w") as log:
            # stdin is the watchdog pipe: its EOF (this process gone) ends the zygote. Started from the
            # main thread: Linux ties it to the thread that started it.
            self.proc = spawn([python, str(SERVER), self.socket,
                               "--preload", ",".join(modules), "--exclude", ",".join(sorted(exclude))],
                              env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                              start_new_session=True)
        self.ready: dict | None = None
        self.problem = ""
        self.children: set[int] = set()
        self._lock = threading.Lock()  # the wait for its start
        self._children_lock = threading.Lock()
        self._waited = threading.Event()

    def wait_ready(self, timeout: float = 300.0) -> bool:
        """True once it has imported its preloads and serves; False (``problem`` says why) else."""
        if self._waited.is_set():
            return self.ready is not None
        with self._lock:
            if not self._waited.is_set():
                self._wait(timeout)
                self._waited.set()
        return self.ready is not None

    def _wait(self, timeout: float) -> None:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline().decode(errors="replace") if ready else ""
        try:
            self.ready = json.loads(line)["ready"]
        except (ValueError, KeyError, TypeError):
            tail = " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-3:])[-300:]
            self.problem = f"the zygote of {self.python} did not start: {tail or 'no output'}"
            self.close()

    @property
    def forks_safely(self) -> bool:
        return self.ready is not None and not self.ready.get("cuda_devices") and not self.ready.get("tree_imports")

    def why_not(self) -> str:
        """Why its runs are fresh interpreters (where forks_safely is False)."""
        if self.ready is None:
            return self.problem
        if self.ready.get("tree_imports"):
            preload, name = next(iter(self.ready["tree_imports"].items()))
            return (f"{self.python}: preloading {preload} imports {name} (a tree's package): its proofs run in "
                    "fresh interpreters")
        return f"{self.python}: torch sees a CUDA device: its proofs run in fresh interpreters (no fork after CUDA)"

    def run(self, argv: list[str], env: dict[str, str], cwd: Path, timeout: float, scratch: Path) -> tuple[int, str, str]:
        """``python -m pytest ARGV`` forked from the zygote: (returncode, stdout, stderr); a
        CommandError (as carry.runner.run raises it) for a timeout."""
        out, err = scratch / "stdout", scratch / "stderr"
        env = dict(env, CARRY_PROOF_PARENT=str(self.ready["pid"]))
        shown = [self.python, "-m", "pytest", *argv]
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(_address(self.socket))
            conn.sendall(json.dumps({"argv": argv, "env": env, "cwd": str(cwd), "stdout": str(out),
                                     "stderr": str(err)}).encode() + b"\n")
            lines = _Lines(conn)
            pid = json.loads(lines.next(60) or b"{}")["pid"]
            with self._children_lock:
                self.children.add(pid)
            line = lines.next(timeout)
            timed_out = line is None
            if timed_out:
                _kill(pid)
                lines.next(30)  # the zygote reaps it and says so
            with self._children_lock:
                self.children.discard(pid)
        except (OSError, ValueError, KeyError) as exc:
            return 1, "", f"the zygote of {self.python} could not run the proof: {exc}"
        finally:
            conn.close()
        text = [p.read_text(errors="replace") if p.exists() else "" for p in (out, err)]
        if timed_out:
            exc = CommandError(shown, 124, "", f"timed out after {timeout}s")
            exc.partial = tuple(text)
            raise exc
        try:
            rc = json.loads(line)["rc"]
        except (ValueError, KeyError, TypeError):
            rc = -signal.SIGKILL  # the zygote died under it (a Ctrl-C of prove kills both)
        return rc, text[0], text[1]

    def kill_children(self) -> None:
        with self._children_lock:
            pids = list(self.children)
        for pid in pids:
            _kill(pid)

    def close(self) -> None:
        """Stop it: its running children's groups first, then the zygote."""
        self.kill_children()
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()  # the watchdog pipe's EOF: it stops serving
            except OSError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                _kill(self.proc.pid)
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass


def _address(name: str) -> str:
    return "\0" + name[1:] if name.startswith("@") else name


class _Lines:
    """JSON lines from a socket, each within a time limit (None: none came in time)."""

    def __init__(self, conn: socket.socket):
        self.conn, self.buf = conn, b""

    def next(self, timeout: float) -> bytes | None:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.conn], [], [], left)[0]:
                return None
            chunk = self.conn.recv(65536)
            if not chunk:
                return b""  # the zygote closed it: it died
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line


def _kill(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def start_all(pythons: dict[str, list[Path]], scratch: Path, exclude: set[str], proofs_dir: Path,
              tree_roots: list[Path]) -> dict[str, Zygote]:
    """A zygote per interpreter (``pythons``: interpreter -> the proof files it runs), torch's stack
    preloaded only where those proofs reach torch (carry.evidence.reach)."""
    return {python: Zygote(python, scratch, exclude, env_extra=python != sys.executable,
                           torch=reach.reaches_torch(files, proofs_dir, tree_roots))
            for python, files in pythons.items()}


def wait_all(zygotes: dict[str, Zygote]) -> None:
    """Wait for each to start (its imports are every run's: not bounded by one run's --timeout) and
    say how they started, or why a run will be a fresh interpreter instead."""
    if not zygotes:
        return
    for z in zygotes.values():
        z.wait_ready()
    unsafe = [z for z in zygotes.values() if not z.forks_safely]
    for z in unsafe:
        progress.say(z.why_not())
    if len(unsafe) < len(zygotes):
        progress.say("proof runs fork from a zygote per interpreter (" + ", ".join(
            f"{z.ready['seconds']:.1f}s to start" + ("" if z.torch else ", without torch: no proof of it imports torch")
            for z in zygotes.values() if z.forks_safely) + ")")


def close_all(zygotes: dict[str, Zygote]) -> None:
    for z in zygotes.values():
        z.close()


def wanted() -> bool:
    """Whether this platform can fork proofs from a zygote at all (fork and Unix sockets)."""
    return hasattr(os, "fork") and hasattr(socket, "AF_UNIX") and sys.platform != "darwin"
