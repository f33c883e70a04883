"""Run a function on N ranks joined by gloo, for the series' proofs.

``spawn(fn, world_size=2, *args)`` starts one process per rank, runs
``fn(rank, world_size, *args)`` in each after ``torch.distributed`` is up,
and re-raises the first rank failure in the caller with that rank's
traceback, so pytest shows why a proof went red. ``fn`` must be a module
level function (it is pickled by name).
"""

from __future__ import annotations

import os
import socket
import traceback

import torch.distributed as dist
import torch.multiprocessing as mp

RANK_TIMEOUT_S = float(os.environ.get("CARRY_PROOF_RANK_TIMEOUT", "600"))


class RankFailed(AssertionError):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world_size, port, fn, args, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        result = fn(rank, world_size, *args)
        queue.put((rank, "ok", result))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent verbatim
        queue.put((rank, "error", "".join(traceback.format_exception(exc))))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass


def spawn(fn, world_size: int = 2, *args, method: str | None = None):
    """Run fn on every rank; return the list of per-rank return values."""
    method = method or os.environ.get("CARRY_PROOF_START_METHOD", "fork")
    ctx = mp.get_context(method)
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_entry, args=(r, world_size, port, fn, args, queue), daemon=False)
             for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, object] = {}
    errors: dict[int, str] = {}
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
        raise RankFailed(f"rank {rank} failed:\n{errors[rank]}")
    return [results[r] for r in range(world_size)]
