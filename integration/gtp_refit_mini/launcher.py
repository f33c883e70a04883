"""The mini test's parent: why a run skips, the ranks spawned and watched (a rank that fails gives
its peers a grace period; one that hangs counts as hung), and the run's verdict on stdout:
``SKIP:``, ``BUG_HIT:``, ``FAIL:`` lines and the result line (report.py)."""

from __future__ import annotations

import datetime
import queue as queue_mod
import sys
import tempfile
import time
import traceback

import sharedgpu
import torch
from bugs import CheckFailed, classify
from rank import run_rank
from report import emit, summarize, te_version
from settings import EXIT_BUG, EXIT_FAILED, EXIT_OK, Settings, gpu_mode


def rank_entry(rank: int, world: int, port: int, s: Settings, ckpt_dir: str, results) -> None:
    import torch.distributed as dist

    try:
        results.put((rank, "ok", run_rank(rank, world, port, s, ckpt_dir, gpu_mode(s))))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        tb = "".join(traceback.format_exception(exc))
        bug = classify(exc, tb)
        if bug is not None:
            results.put((rank, "bug", {"id": bug.patch_id, "message": bug.message, "traceback": tb}))
        else:
            results.put((rank, "error", {"message": f"{type(exc).__name__}: {exc}", "traceback": tb}))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass


def rank_store(nproc: int):
    """The rendezvous store, bound by the parent on a port the kernel picks (port 0) and held open
    while the ranks run: no port is chosen free and bound later, which another process could take
    in between (EADDRINUSE, seen on the H200 with two runs in one call)."""
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, nproc + 1, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=300))


def gpu_shortfall(s: Settings, visible: int) -> str | None:
    """Why ``visible`` GPUs cannot hold this run's ranks, or None; a NCCL run names the shared-GPU mode."""
    need = 1 if gpu_mode(s) != "gpu-per-rank" else s.nproc
    if visible >= need:
        return None
    more = (f" (--shared-gpu, or {sharedgpu.ENV}=1, runs the {s.nproc} NCCL ranks on one GPU)"
            if s.backend == "nccl" and not s.shared_gpu and visible >= 1 else "")
    return f"--backend {s.backend} with --nproc {s.nproc} needs {need} GPU(s), {visible} visible{more}"


def skip_reason(s: Settings) -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device (the GTP path runs on GPUs only)"
    short = gpu_shortfall(s, torch.cuda.device_count())
    if short:
        return short
    try:
        from megatron.core.tensor_parallel.gtp_api import HAVE_GTP
    except ImportError as exc:
        raise CheckFailed(f"cannot import megatron-core's GTP API: {exc}") from exc
    if not HAVE_GTP:
        return "megatron.core.tensor_parallel.gtp_api.HAVE_GTP is False (GTP needs TransformerEngine >= 2.19)"
    return None


def run_ranks(s: Settings, ckpt_dir: str) -> tuple[dict[int, dict], dict[int, tuple[str, dict]]]:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    store = rank_store(s.nproc)
    procs = [ctx.Process(target=rank_entry, args=(r, s.nproc, store.port, s, ckpt_dir, results))
             for r in range(s.nproc)]
    for p in procs:
        p.start()
    ok: dict[int, dict] = {}
    failed: dict[int, tuple[str, dict]] = {}
    deadline = time.monotonic() + s.timeout
    grace = None
    try:
        while len(ok) + len(failed) < s.nproc:
            now = time.monotonic()
            if now > deadline or (grace is not None and now > grace):
                missing = [r for r in range(s.nproc) if r not in ok and r not in failed]
                why = "timed out" if grace is None else "still running after a peer failed"
                for r in missing:
                    failed[r] = ("hung", {"message": f"rank {r} {why} ({s.timeout:.0f}s budget)"})
                break
            try:
                rank, kind, payload = results.get(timeout=1.0)
            except queue_mod.Empty:
                for r, p in enumerate(procs):
                    if r not in ok and r not in failed and not p.is_alive() and p.exitcode not in (0, None):
                        failed[r] = ("error", {"message": f"rank {r} died with exit code {p.exitcode}"})
                continue
            if kind == "ok":
                ok[rank] = payload
            else:
                failed[rank] = (kind, payload)
                grace = grace or time.monotonic() + 30.0  # peers may wait on a collective forever
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    return ok, failed


def launch(s: Settings) -> int:
    base = {"test": "gtp_refit_mini", "backend": s.backend, "nproc": s.nproc, "gtp_remat_size": s.gtp,
            "expert_gtp_remat_size": s.expert_gtp, "dtype": s.dtype, "steps": s.steps, "seed": s.seed,
            "gpu_mode": gpu_mode(s)}
    if s.shared_gpu:
        base["timing_note"] = sharedgpu.NOTE
    reason = skip_reason(s)
    if reason:
        print(f"SKIP: gtp_refit_mini: {reason}", flush=True)
        emit({**base, "status": "skipped", "reason": reason}, s)
        return EXIT_OK
    base.update(torch=torch.__version__, device=torch.cuda.get_device_name(0), transformer_engine=te_version(),
                model={k: getattr(s, k) for k in ("vocab", "hidden", "layers", "heads", "query_groups", "ffn",
                                                  "tied", "experts", "topk", "moe_ffn")})
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gtp-refit-mini-") as tmp:
        ok, failed = run_ranks(s, s.ckpt_dir or tmp)
    seconds = round(time.monotonic() - t0, 1)
    if failed:
        return _failed(base, failed, seconds, s)
    metrics, problems = summarize(ok, s)
    for p in problems:
        print(f"FAIL: {p}", flush=True)
    emit({**base, **metrics, "status": "failed" if problems else "passed", "seconds": seconds,
          **({"reason": "; ".join(problems)} if problems else {})}, s)
    return EXIT_FAILED if problems else EXIT_OK


def _failed(base: dict, failed: dict[int, tuple[str, dict]], seconds: float, s: Settings) -> int:
    """Ranks that failed: each one's message and traceback on stderr; the first known bug, else the
    first failure, is the run's verdict."""
    for rank in sorted(failed):
        kind, info = failed[rank]
        print(f"--- rank {rank}: {kind}: {info.get('message', '')}", file=sys.stderr)
        if info.get("traceback"):
            print(info["traceback"], file=sys.stderr, end="")
    bugs = [(r, info) for r, (kind, info) in sorted(failed.items()) if kind == "bug"]
    if bugs:
        info = bugs[0][1]
        print(f"BUG_HIT: {info['id']}: {info['message']}", flush=True)
        emit({**base, "status": "failed", "bug": info["id"], "reason": info["message"], "seconds": seconds}, s)
        return EXIT_BUG
    first = failed[min(failed)][1]["message"]
    print(f"FAIL: {first}", flush=True)
    emit({**base, "status": "failed", "reason": first, "seconds": seconds}, s)
    return EXIT_FAILED
