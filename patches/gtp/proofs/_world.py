"""Run a function on N ranks joined by gloo, for the series' proofs.

``spawn(fn, world_size=2, *args)`` starts one process per rank, runs
``fn(rank, world_size, *args)`` in each after ``torch.distributed`` is up,
and re-raises the first rank failure in the caller with that rank's
traceback, so pytest shows why a proof went red. ``fn`` must be a module
level function (it is pickled by name).

How ranks start (``start_method``): forked where torch sees no CUDA device; where it sees one,
from a forkserver that preloads torch. The CUDA driver does not survive a fork once the parent
has touched it, and on a GPU host the parent always may have: importing megatron-core or
TransformerEngine, or a proof's own ``have_gtp()`` check, reaches CUDA before any rank starts,
and a proof cannot keep imports it does not own from doing so. The forkserver is a fresh
interpreter (exec'd, not forked, from this one) that imports only torch and torch.distributed,
which initialise no CUDA, so a rank forked from it starts CUDA-clean and without paying for
torch again; it imports the proof's module, and so megatron-core and TE, itself. Each proof
interpreter starts its own forkserver (multiprocessing keeps one per process), with this
interpreter's path: one tree, as for the proof itself. Where there is no device to poison, a
plain fork is as safe and lets each rank inherit all of the parent's imports (Megatron-Bridge's
take ~20 s). ``CARRY_PROOF_START_METHOD=fork|forkserver|spawn`` overrides the choice.

**A standing world.** Where ranks are forked, the ranks of one proof interpreter (one run) outlive
the calls of functions marked ``@leaves_ranks_clean``: the first such ``spawn`` starts them, later
ones hand their function to the same processes. The mark says the function tears down all it sets
up (megatron-core's model-parallel state, in a ``finally``) and sets no other global that a new
rank would not have (megatron-core has more: the microbatch calculator refuses a second
initialisation, so an unmarked function always gets ranks of its own, as before).
What a rank pays once is then paid once per run, not per test: the imports its functions make
(megatron-core's checkpointing, torch.distributed.checkpoint) and, at its first checkpoint save,
megatron-core's write-results Manager (``filesystem_async.get_write_results_queue``: a *spawned*
interpreter per process, which imports torch to unpickle the results; about 2.5 s of CPU a rank
on 2 cores, and most of a checkpoint proof's time when each test had its own ranks). A call sees
what new ranks would give it: the caller's environment and working folder of that call, the
random generators as they were when the ranks joined, and no megatron-core model-parallel
state. A call that leaves that state initialised or the group destroyed, or fails on any rank
(its peers may hang on a collective), ends the world, and the next call starts new ranks; so
does every call under ``CARRY_PROOF_FRESH=1`` (``prove --fresh``: the old way, one world per
call) and where ranks do not fork (CUDA: each call its own forkserver ranks, as before).

A rank gets the caller's environment as it was at ``spawn`` (a forkserver's children would
otherwise see the server's, from when it started), and joins the group through a TCP store
rank 0 serves on a port the kernel picked and hands to the others: no free port is guessed, so
proofs running side by side cannot race for one. (Not served from the caller: a store's server
is a thread, and a rank forked while it runs may inherit a lock it held.)

A rank's failure carries its exception's type and, for an import error, the module it could
not import (``RankFailed.cause``): carry.evidence.prove tells a missing dependency from a red proof by it.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
import traceback

import multiprocessing.util  # noqa: F401 - its exit hook before ours (the end of this module)

import torch.distributed as dist
import torch.multiprocessing as mp

RANK_TIMEOUT_S = float(os.environ.get("CARRY_PROOF_RANK_TIMEOUT", "600"))


class RankFailed(AssertionError):
    def __init__(self, message: str, cause: dict | None = None):
        super().__init__(message)
        self.cause = cause or {}


def start_method() -> str:
    """fork, or forkserver where a CUDA device is visible (see the module's docstring)."""
    chosen = os.environ.get("CARRY_PROOF_START_METHOD")
    if chosen:
        return chosen
    import torch

    # device_count() asks NVML first and never creates a CUDA context; on a CPU build it is 0.
    return "forkserver" if torch.cuda.is_initialized() or torch.cuda.device_count() > 0 else "fork"


# What a forkserver imports before it forks a rank: torch and its distributed package, never
# megatron-core or TE (they may reach the CUDA driver, and they belong to the tree under test).
PRELOAD = ["torch", "torch.distributed"]


def context(method: str):
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)
    return ctx


def _cause(exc: BaseException) -> dict:
    cause = {"type": type(exc).__name__, "message": str(exc)[:500]}
    if isinstance(exc, ImportError) and exc.name:
        cause["module"] = exc.name
    return cause


def _rng() -> tuple:
    """The random generators' states (torch's CPU one, ``random``'s, numpy's where imported)."""
    import random

    import torch

    numpy = sys.modules.get("numpy")
    return (torch.get_rng_state(), random.getstate(), numpy.random.get_state() if numpy else None)


def _set_rng(state: tuple) -> None:
    import random

    import torch

    torch.set_rng_state(state[0])
    random.setstate(state[1])
    if state[2] is not None:
        sys.modules["numpy"].random.set_state(state[2])


def _left_clean() -> bool:
    """Whether a call left the rank as a new one would be: the world's group still up and no
    megatron-core model-parallel state (every proof function tears its own down)."""
    if not dist.is_initialized():
        return False
    ps = sys.modules.get("megatron.core.parallel_state")
    return not (ps is not None and ps.model_parallel_is_initialized())


def _serve(rank, world_size, ports, tasks, results, environ):
    """A rank: join the group, then run each task ``(fn, args, environ, cwd)`` until ``None``."""
    try:  # the rank dies with its parent (prove's plugin folder; a forked rank is tied already)
        import carry_lifeline

        carry_lifeline.tie()
    except ImportError:
        pass
    os.environ.clear()
    os.environ.update(environ)
    try:
        # Rank 0 serves the group's store on a port the kernel picks and tells the others.
        if rank == 0:
            store = dist.TCPStore("127.0.0.1", 0, world_size, True, wait_for_workers=False)
            for _ in range(world_size - 1):
                ports.put(store.port)
        else:
            store = dist.TCPStore("127.0.0.1", ports.get(timeout=RANK_TIMEOUT_S), world_size, False)
        group_env = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port), RANK=str(rank),
                         WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
        start = _rng()
        while (task := tasks.get()) is not None:
            fn, args, environ, cwd = task
            os.environ.clear()
            os.environ.update(environ, **group_env)
            os.chdir(cwd)
            _set_rng(start)
            result = fn(rank, world_size, *args)
            results.put((rank, "ok", result, _left_clean()))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent verbatim
        results.put((rank, "error", ("".join(traceback.format_exception(exc)), _cause(exc)), False))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass


class _World:
    """``world_size`` ranks serving tasks (``_serve``), started by ``method``."""

    def __init__(self, world_size: int, method: str):
        ctx = context(method)
        self.size = world_size
        # Kept with the world: a forkserver or spawned rank unpickles them after start() returns.
        self.results, self.ports = ctx.Queue(), ctx.Queue()
        self.tasks = [ctx.Queue() for _ in range(world_size)]
        self.procs = [ctx.Process(target=_serve, args=(r, world_size, self.ports, self.tasks[r], self.results,
                                                       dict(os.environ)), daemon=False)
                      for r in range(world_size)]
        for p in self.procs:
            p.start()
        self.broken = False   # a rank failed or did not answer: its peers may hang on a collective
        self.reusable = True  # every call so far left the ranks as new ones (_left_clean)

    def run(self, fn, args) -> list:
        """fn on every rank; its per-rank results, or RankFailed (the world is then of no further use)."""
        import queue as _q

        task = (fn, args, dict(os.environ), os.getcwd())
        for q in self.tasks:
            q.put(task)
        results: dict[int, object] = {}
        deadline = time.monotonic() + RANK_TIMEOUT_S
        while len(results) < self.size:
            try:  # in short waits: a rank that died without a word (a crash, os._exit) is seen at once
                rank, kind, payload, clean = self.results.get(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
            except _q.Empty:
                gone = [(r, p.exitcode) for r, p in enumerate(self.procs) if r not in results and not p.is_alive()]
                if gone or time.monotonic() >= deadline:
                    self.broken = True
                    why = (", ".join(f"rank {r} exited with code {code}" for r, code in gone) + " without an answer"
                           if gone else f"no answer from a rank within {RANK_TIMEOUT_S:.0f}s")
                    raise RankFailed(f"{why} (answered: {sorted(results)})") from None
                continue
            if kind != "ok":
                self.broken = True
                text, cause = payload
                raise RankFailed(f"rank {rank} failed:\n{text}", cause)
            results[rank] = payload
            self.reusable = self.reusable and clean
        return [results[r] for r in range(self.size)]

    def close(self) -> None:
        """Let the ranks leave the group and exit; kill what does not (a rank hung on a peer)."""
        if not self.broken:
            for q in self.tasks:
                q.put(None)
        for p in self.procs:
            p.join(timeout=5 if self.broken else 60)
            if p.is_alive():
                p.kill()
                p.join()


_standing: dict[tuple[int, str], _World] = {}


def _close_standing() -> None:
    while _standing:
        _standing.popitem()[1].close()


def standing() -> bool:
    """Whether ranks may outlive a call (forked ranks of marked functions, unless prove --fresh
    set CARRY_PROOF_FRESH=1)."""
    return os.environ.get("CARRY_PROOF_FRESH") != "1"


def leaves_ranks_clean(fn):
    """Mark a rank function whose calls may share ranks (see the module's docstring)."""
    fn.leaves_ranks_clean = True
    return fn


def spawn(fn, world_size: int = 2, *args, method: str | None = None):
    """Run fn on every rank; return the list of per-rank return values."""
    method = method or start_method()
    key = (world_size, method)
    keep = method == "fork" and standing() and getattr(fn, "leaves_ranks_clean", False)
    world = _standing.pop(key, None) if keep else None
    if world is not None and not all(p.is_alive() for p in world.procs):
        world.broken = True  # a rank was killed between calls: new ranks
        world.close()
        world = None
    if world is None:
        world = _World(world_size, method)
    try:
        results = world.run(fn, args)
    except BaseException:
        world.broken = True
        world.close()
        raise
    if keep and world.reusable:
        _standing[key] = world
    else:
        world.close()
    return results


# The standing worlds close at exit, before multiprocessing joins its children: its util module (which
# registers that join) is imported first, so its hook runs after this one; ranks waiting for a task
# do not hold the exit.
atexit.register(_close_standing)
