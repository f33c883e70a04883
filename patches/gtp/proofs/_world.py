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

A rank gets the caller's environment as it was at ``spawn`` (a forkserver's children would
otherwise see the server's, from when it started), and joins the group through a TCP store
rank 0 serves on a port the kernel picked and hands to the others: no free port is guessed, so
proofs running side by side cannot race for one. (Not served from the caller: a store's server
is a thread, and a rank forked while it runs may inherit a lock it held.)

A rank's failure carries its exception's type and, for an import error, the module it could
not import (``RankFailed.cause``): carry.evidence.prove tells a missing dependency from a red proof by it.
"""

from __future__ import annotations

import os
import traceback

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


def _entry(rank, world_size, ports, fn, args, queue, environ):
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
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port), RANK=str(rank),
                          WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
        result = fn(rank, world_size, *args)
        queue.put((rank, "ok", result))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent verbatim
        queue.put((rank, "error", ("".join(traceback.format_exception(exc)), _cause(exc))))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass


def spawn(fn, world_size: int = 2, *args, method: str | None = None):
    """Run fn on every rank; return the list of per-rank return values."""
    ctx = context(method or start_method())
    queue, ports = ctx.Queue(), ctx.Queue()
    environ = dict(os.environ)
    procs = [ctx.Process(target=_entry, args=(r, world_size, ports, fn, args, queue, environ), daemon=False)
             for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, object] = {}
    errors: dict[int, tuple[str, dict]] = {}
    import queue as _q
    try:
        for _ in range(world_size):
            try:
                rank, kind, payload = queue.get(timeout=RANK_TIMEOUT_S)
            except _q.Empty:
                raise RankFailed(f"no answer from a rank within {RANK_TIMEOUT_S:.0f}s "
                                 f"(answered: {sorted(results) + sorted(errors)})") from None
            if kind == "ok":
                results[rank] = payload
            else:
                errors[rank] = payload
                break  # the peers may now hang on a collective
    finally:
        for p in procs:
            p.join(timeout=5 if errors else 60)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        rank = min(errors)
        text, cause = errors[rank]
        raise RankFailed(f"rank {rank} failed:\n{text}", cause)
    return [results[r] for r in range(world_size)]
