"""The zygote: one interpreter per prove run that has imported what no tree provides, and forks
each proof run from it (carry.evidence.zygote starts it and talks to it).

    python carry_zygote.py SOCKET --preload MOD,MOD,... --exclude TOP,TOP,...

It imports the ``--preload`` modules (torch and the parts of it megatron-core pulls in, numpy,
pytest, ...), never one whose top-level name is in ``--exclude`` (what the trees under test
provide: it never imports a tree), prints one JSON line ``{"ready": ...}`` on stdout and serves
``SOCKET``. A connection carries one request, a JSON line ``{"argv", "env", "cwd", "stdout",
"stderr"}``; the zygote forks a child, answers ``{"pid"}`` and, once the child has exited and
the rest of its process group is killed, ``{"rc"}`` (a subprocess-style return code).

The child is what ``python -m pytest ARGV`` would be with that environment and cwd: a session
of its own (its pid is its process group), its stdout and stderr in the two files, stdin
``/dev/null``, ``os.environ`` replaced, ``sys.path`` rebuilt as a fresh interpreter would build
it from that ``PYTHONPATH``, every module of a tree's top-level package dropped, the random
generators reseeded, then pytest run as ``__main__``, atexit handlers run, and exit.

It dies with prove: EOF on its stdin (prove holds the other end) ends it and kills its
children's groups, and on Linux it and each child are tied to their parent (carry_lifeline).
Only the standard library until the preloads: it runs in every proof interpreter.
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import socket
import sys
import time
import traceback

import carry_lifeline


class _Watch:
    """Notes a preload that reaches for a tree's package (a plugin that looks for megatron-core):
    what it set up depends on whether the tree is there, so a fork of it would not be what a fresh
    interpreter is, and prove does not fork from this zygote."""

    def __init__(self, exclude: set[str]):
        self.exclude, self.now, self.seen = exclude, "", {}

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.exclude:
            self.seen.setdefault(self.now, name)
        return None


def _preload(modules: list[str], exclude: set[str]) -> dict:
    import importlib

    t0 = time.monotonic()
    failed = {}
    reached = _Watch(exclude)
    sys.meta_path.insert(0, reached)
    for name in modules:
        if name.split(".")[0] in exclude:
            failed[name] = "provided by a tree under test: never imported here"
            continue
        reached.now = name
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - the proof meets it itself, as a fresh interpreter would
            failed[name] = f"{type(exc).__name__}: {exc}"[:200]
    sys.meta_path.remove(reached)
    devices = 0
    if "torch" in sys.modules:
        # NVML's count: no CUDA context is made. Where it is not 0 prove does not fork proofs.
        devices = sys.modules["torch"].cuda.device_count()
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else None
    return {"seconds": round(time.monotonic() - t0, 2), "failed": failed, "cuda_devices": devices,
            "tree_imports": reached.seen,
            "threads": threads, "pid": os.getpid()}


def _base_path() -> list[str]:
    """sys.path without its first entry (this script's folder) and without this interpreter's
    PYTHONPATH entries: what a fresh interpreter puts after a PYTHONPATH of its own."""
    own = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    rest = sys.path[1:]
    for p in own:
        if rest and rest[0] == p:
            rest.pop(0)
    return rest


def _drop_tree_modules(trees: list[str]) -> None:
    tops = set()
    for root in trees:
        try:
            names = os.listdir(root)
        except OSError:
            continue
        tops.update(n[:-3] if n.endswith(".py") else n for n in names)
    for name in [m for m in sys.modules if m.split(".")[0] in tops]:
        del sys.modules[name]


def _child(req: dict, base: list[str]) -> int:
    os.setsid()
    env = req["env"]
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, fd)
        os.close(out)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(req["cwd"])
    sys.path[:] = [os.getcwd(), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p], *base]
    sys.path_importer_cache.clear()
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    _drop_tree_modules([p for p in env.get("CARRY_PROOF_TREES", "").split(os.pathsep) if p])
    import importlib

    importlib.invalidate_caches()
    # A fresh interpreter seeds these (torch's too) from the OS; every fork of one zygote would share its state.
    if "random" in sys.modules:
        sys.modules["random"].seed()
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()
    if "torch" in sys.modules:
        sys.modules["torch"].random.default_generator.seed()  # the CPU generator; CUDA's seed themselves
    carry_lifeline.tie_forks()
    import runpy

    sys.argv = ["pytest", *req["argv"]]
    code = 0
    try:
        runpy.run_module("pytest", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - as the interpreter would report it
        traceback.print_exc()
        code = 1
    import atexit
    import threading

    getattr(threading, "_shutdown", lambda: None)()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    return code


def _read_line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def _from(conn: socket.socket, parent: int) -> bool:
    """Whether the peer is the process that started the zygote (an abstract socket has no file
    permissions: the kernel's word on who connected is the check)."""
    if not hasattr(socket, "SO_PEERCRED"):
        return True  # a socket path in prove's own scratch folder: its permissions are the check
    import struct

    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", creds)
    return pid == parent and uid == os.getuid()


def _send(conn: socket.socket, doc: dict) -> None:
    try:
        conn.sendall(json.dumps(doc).encode() + b"\n")
    except OSError:
        pass  # prove stopped listening for it


def serve(path: str, preload: list[str], exclude: set[str]) -> None:
    parent = os.getppid()
    carry_lifeline.tie(parent)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + path[1:] if path.startswith("@") else path)  # @NAME: Linux's abstract namespace
    listener.listen(64)
    ready = _preload(preload, exclude)
    # What the preloads made is never garbage: frozen, a child's collections skip it (pytest's
    # session end runs gc.collect() five times: 0.9 s over torch's objects unfrozen) and leave its
    # pages shared with the zygote (the use gc.freeze is documented for, before fork()).
    gc.freeze()
    base = _base_path()
    sys.stdout.write(json.dumps({"ready": ready}) + "\n")
    sys.stdout.flush()
    children: dict[int, socket.socket] = {}
    try:
        while True:
            readable, _, _ = select.select([listener, sys.stdin], [], [], 0.05)
            if sys.stdin in readable and not os.read(sys.stdin.fileno(), 4096):
                return  # prove is gone (or done): EOF on the watchdog pipe
            if listener in readable:
                conn, _ = listener.accept()
                if not _from(conn, parent):
                    conn.close()  # only prove, which started it, may ask for a fork
                    continue
                req = json.loads(_read_line(conn) or b"{}")
                sys.stdout.flush()
                sys.stderr.flush()
                zygote = os.getpid()
                pid = os.fork()
                if pid == 0:
                    code = 1
                    try:
                        listener.close()
                        conn.close()
                        for c in children.values():
                            c.close()
                        carry_lifeline.tie(zygote)
                        code = _child(req, base)
                    finally:
                        os._exit(code)
                children[pid] = conn
                _send(conn, {"pid": pid})
            while children:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                try:
                    os.killpg(pid, signal.SIGKILL)  # what of its group outlived it (a rank)
                except (ProcessLookupError, PermissionError):
                    pass
                conn = children.pop(pid, None)
                if conn is not None:
                    _send(conn, {"rc": os.waitstatus_to_exitcode(status)})
                    conn.close()
    finally:
        for pid in children:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("socket")
    p.add_argument("--preload", default="")
    p.add_argument("--exclude", default="")
    a = p.parse_args(argv)
    serve(a.socket, [m for m in a.preload.split(",") if m], {m for m in a.exclude.split(",") if m})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
