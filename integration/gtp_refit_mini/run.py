#!/usr/bin/env python3
"""GTP GRPO training + refit + checkpoints, end to end, on megatron-core and TransformerEngine alone.

What a GRPO run with GTP does to a model, without NeMo-RL, Ray or vLLM (rank.py has the steps):
a torch_dist checkpoint written with GTP off is loaded into the GTP-sharded training model (every
tensor exact); ``--steps`` GRPO iterations refit a whole-weight inference model built on
``build_inference_pg_collection``, sample from it, compare the training model's log-probs of the
samples (``token_mult_prob_error`` below ``--max-error``, NeMo-RL's gate of 1.05) and take an
optimiser step (Megatron DDP and distributed Adam over NCCL; plain SGD on gloo); the trained
model writes a GTP checkpoint that a whole-weight model must read back exactly
(``ckpt_token_mult_prob_error``). GTP runs with its defaults. The model is Qwen2.5's shape in
small: TE spec, tied embeddings, SwiGLU, QKV bias, RMSNorm, rope, GQA; ``--dtype fp32`` or
``bf16``. ``--shape moe-tiny`` makes every MLP routed experts (grouped GEMM, top-2, untied) with GTP
on both axes; over gloo its training step is skipped by name (``train_step: skipped: gloo has
no coalesced collectives``) and the rest still runs. ``--compare-gtp-off`` then trains the same
way with GTP off and reports both arms'
cost per rank (memory of parameters, gradients and optimiser state; peak; step time; refit time
and bytes received) and their ratios.

The last line on stdout is one JSON object with the metrics (for tools/nightly.py's judge).
On a tree without the gtp series' fixes the run stops at the first known bug it meets and
prints ``BUG_HIT: <patch id>: <message>`` (ids as in patches/gtp/series.toml).
Without CUDA, or where megatron-core reports ``HAVE_GTP`` False, it prints ``SKIP: <reason>``
and exits 0: a skip, never a pass.

Run (one GPU, two gloo ranks on cuda:0; or two GPUs with NCCL, rank r on cuda:r; or, with
``--shared-gpu``, two NCCL ranks on one GPU):
    PYTHONPATH=<megatron-lm tree>:<TE site> python integration/gtp_refit_mini/run.py --nproc 2 --backend gloo
    PYTHONPATH=<megatron-lm tree>:<TE site> python integration/gtp_refit_mini/run.py --nproc 2 --backend nccl --dtype bf16
    PYTHONPATH=<megatron-lm tree>:<TE site> python integration/gtp_refit_mini/run.py --nproc 2 --backend nccl --shared-gpu

The shared-GPU mode (``--shared-gpu``, or ``CARRY_SHARED_GPU=1`` in the environment, which is how
tools/nightly.py --shared-gpu turns it on): every NCCL rank runs on cuda:0, each process with an
``NCCL_HOSTID`` of its own set before its process group exists, so NCCL takes the ranks for two hosts
and joins them over its socket transport instead of refusing a duplicate GPU. What is exact is
exact in that mode, and each process has its own allocator, so per-rank memory still counts; its
times and bandwidths are not GTP's price, and the result line says so (``gpu_mode``, ``timing_note``).
``--dry-check`` validates the arguments, the imports and the megatron-core APIs used, without CUDA.

The test is split by concept (bugs, model, refit, grpo, ckpt, rank) beside this launcher and
stays standalone: it imports nothing from the repository's tools, so it runs from a copy of this
folder inside any image.
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import os
import queue as queue_mod
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import sharedgpu  # noqa: E402
from bugs import CheckFailed, classify  # noqa: E402
from rank import MARK_EXPERT, MARK_GTP, MARK_RESHARD, run_rank  # noqa: E402

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BUG = 0, 1, 2, 3


@dataclass(frozen=True)
class Settings:
    nproc: int = 2
    backend: str = "gloo"
    gtp: int = 2
    dtype: str = "fp32"
    vocab: int = 512
    hidden: int = 128
    layers: int = 2
    heads: int = 4
    query_groups: int = 2
    ffn: int = 192
    seq: int = 32
    prompts: int = 2
    generations: int = 4
    prompt_len: int = 12
    new_tokens: int = 8
    temperature: float = 1.0
    clip: float = 0.2
    steps: int = 2
    lr: float = 1e-4
    max_error: float = 1.05
    tied: bool = True
    experts: int = 0
    topk: int = 2
    moe_ffn: int = 0
    expert_gtp: int = 1
    compare_gtp_off: bool = False
    precision_aware_optimizer: bool = True
    seed: int = 1234
    timeout: float = 900.0
    shared_gpu: bool = False
    out: str | None = None
    ckpt_dir: str | None = None


# Model shapes by name (--shape); explicit size flags still win over the shape's values.
SHAPES = {
    "qwen2.5-0.5b": dict(vocab=151936, hidden=896, layers=24, heads=14, query_groups=2, ffn=4864, seq=128,
                         prompt_len=32, new_tokens=16),
    # Qwen3-MoE's layout in small: routed SwiGLU experts (TE grouped GEMM), top-2, untied, QKV bias;
    # GTP on both axes.
    "moe-tiny": {"experts": 4, "topk": 2, "moe_ffn": 128, "expert_gtp": 2, "tied": False},
}


def parse_args(argv: list[str]) -> tuple[Settings, bool]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="exit codes: 0 passed or skipped (SKIP line); 1 a check failed; "
                                       "2 bad usage; 3 a known bug of the gtp series was hit (BUG_HIT line)")
    d = Settings()
    p.add_argument("--nproc", type=int, default=d.nproc, help="ranks to spawn (a multiple of --gtp)")
    p.add_argument("--backend", choices=("gloo", "nccl"), default=d.backend,
                   help="gloo: every rank on cuda:0 (one GPU; plain SGD, as gloo allows); "
                        "nccl: rank r on cuda:r (Megatron DDP and distributed Adam)")
    p.add_argument("--gtp", type=int, default=d.gtp, help="gtp_remat_size of the training layout")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default=d.dtype, help="parameter and compute dtype")
    p.add_argument("--shape", choices=sorted(SHAPES),
                   help="a named model shape (qwen2.5-0.5b: the series' target, its sequence sizes too; "
                        "moe-tiny: routed experts with GTP on both axes)")
    p.add_argument("--vocab", type=int, default=d.vocab)
    p.add_argument("--hidden", type=int, default=d.hidden)
    p.add_argument("--layers", type=int, default=d.layers)
    p.add_argument("--heads", type=int, default=d.heads)
    p.add_argument("--query-groups", type=int, default=d.query_groups)
    p.add_argument("--ffn", type=int, default=d.ffn,
                   help="FFN hidden size; 200 makes fc1 (400 rows) carry GTP padding rows")
    p.add_argument("--seq", type=int, default=d.seq, help="max sequence length")
    p.add_argument("--tied", action=argparse.BooleanOptionalAction, default=d.tied,
                   help="share the embedding and output weights")
    p.add_argument("--experts", type=int, default=d.experts, help="routed experts per MLP (0: dense MLPs)")
    p.add_argument("--topk", type=int, default=d.topk, help="experts per token")
    p.add_argument("--moe-ffn", type=int, default=d.moe_ffn, help="each expert's FFN size (0: --ffn)")
    p.add_argument("--expert-gtp", type=int, default=d.expert_gtp,
                   help="expert_gtp_remat_size of the training layout (1: the expert axis unsharded)")
    p.add_argument("--prompts", type=int, default=d.prompts, help="prompts per rank")
    p.add_argument("--generations", type=int, default=d.generations, help="samples per prompt (GRPO group)")
    p.add_argument("--prompt-len", type=int, default=d.prompt_len)
    p.add_argument("--new-tokens", type=int, default=d.new_tokens)
    p.add_argument("--temperature", type=float, default=d.temperature)
    p.add_argument("--clip", type=float, default=d.clip, help="PPO/GRPO ratio clip epsilon")
    p.add_argument("--steps", type=int, default=d.steps, help="GRPO iterations (refit, sample, train step)")
    p.add_argument("--lr", type=float, default=d.lr, help="learning rate")
    p.add_argument("--max-error", type=float, default=d.max_error,
                   help="gate on token_mult_prob_error and ckpt_token_mult_prob_error")
    p.add_argument("--compare-gtp-off", action="store_true",
                   help="also train with GTP off and report both arms' memory, step and refit cost")
    p.add_argument("--no-precision-aware-optimizer", dest="precision_aware_optimizer", action="store_false",
                   help="bf16 only: Megatron's distributed Adam without TE's precision-aware mode (NeMo-RL "
                        "turns it on; this is for narrowing down a failure, not for a green run)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--timeout", type=float, default=d.timeout, help="seconds before the ranks count as hung")
    p.add_argument("--shared-gpu", action="store_true",
                   help="NCCL ranks all on cuda:0, each process its own NCCL_HOSTID (also on for --backend nccl "
                        f"when {sharedgpu.ENV}=1); times in this mode are not GTP's price, per-rank memory is")
    p.add_argument("--out", help="also write the result JSON to OUT/result.json")
    p.add_argument("--ckpt-dir", help="where the checkpoints go (default: a temporary folder, removed)")
    p.add_argument("--dry-check", action="store_true",
                   help="validate arguments, imports and the megatron-core APIs used; needs no CUDA")
    shape = p.parse_known_args(argv)[0].shape
    if shape:
        p.set_defaults(**SHAPES[shape])
    a = p.parse_args(argv)
    if a.backend == "nccl" and sharedgpu.requested():
        a.shared_gpu = True   # the night's mode: every NCCL run shares the GPU; gloo ranks do anyway
    s = Settings(**{k: getattr(a, k) for k in Settings.__dataclass_fields__})
    problems = []
    if s.gtp < 2:
        problems.append("--gtp must be at least 2 (GTP off tests nothing; --compare-gtp-off adds that arm)")
    if s.nproc < s.gtp or s.nproc % s.gtp:
        problems.append(f"--nproc {s.nproc} must be a positive multiple of --gtp {s.gtp}")
    if s.experts < 0 or s.expert_gtp < 1 or s.moe_ffn < 0:
        problems.append("--experts, --moe-ffn must be >= 0 and --expert-gtp >= 1")
    elif s.experts:
        if not 1 <= s.topk <= s.experts:
            problems.append(f"--topk {s.topk} must be between 1 and --experts {s.experts}")
        if s.nproc < s.expert_gtp or s.nproc % s.expert_gtp:
            problems.append(f"--nproc {s.nproc} must be a positive multiple of --expert-gtp {s.expert_gtp}")
    elif s.expert_gtp > 1:
        problems.append("--expert-gtp needs --experts (a dense model has no expert axis)")
    if s.compare_gtp_off and s.backend == "gloo" and s.experts and s.expert_gtp > 1:
        problems.append("--compare-gtp-off compares trained arms: expert GTP over gloo skips its train step")
    if s.prompt_len + s.new_tokens > s.seq:
        problems.append(f"--prompt-len + --new-tokens ({s.prompt_len + s.new_tokens}) exceeds --seq {s.seq}")
    if s.hidden % s.heads or s.heads % s.query_groups:
        problems.append("--hidden must be divisible by --heads, and --heads by --query-groups")
    if s.generations < 2:
        problems.append("--generations must be at least 2 (GRPO advantages compare samples of a prompt)")
    if s.temperature <= 0:
        problems.append("--temperature must be positive (greedy samples give a GRPO group no signal)")
    if s.steps < 2:
        problems.append("--steps must be at least 2 (a refit after an optimiser step is the point)")
    if s.lr <= 0:
        problems.append("--lr must be positive")
    if s.shared_gpu and s.backend != "nccl":
        problems.append("--shared-gpu is for --backend nccl (gloo ranks share cuda:0 already)")
    if problems:
        p.error("; ".join(problems))
    return s, a.dry_check


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


# -- the parent ---------------------------------------------------------------------------
def gpu_mode(s: Settings) -> str:
    """How the ranks sit on GPUs: ``gloo-one-gpu``, ``gpu-per-rank`` (NCCL) or ``shared-gpu`` (NCCL)."""
    if s.backend == "gloo":
        return "gloo-one-gpu"
    return "shared-gpu" if s.shared_gpu else "gpu-per-rank"


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


def _te_version() -> str | None:
    try:
        import transformer_engine
    except ImportError:
        return None
    return getattr(transformer_engine, "__version__", "unknown")


def emit(result: dict, s: Settings) -> None:
    line = json.dumps(result, sort_keys=True)
    if s.out:
        os.makedirs(s.out, exist_ok=True)
        with open(os.path.join(s.out, "result.json"), "w") as f:
            f.write(line + "\n")
    print(line, flush=True)


_ARM_KEYS = ("setup_mib", "train_state_mib", "peak_mib", "step_seconds", "refit_seconds", "refit_bytes_received")


def summarize(ok: dict[int, dict], s: Settings) -> tuple[dict, list[str]]:
    """Fold the ranks' results into the metrics and the problems that fail the run.

    A run whose train step was skipped (MoE over gloo) reports ``train_step`` with the reason and
    no training metric at all: nothing it did not measure can pass a gate.
    """
    ranks = [ok[r] for r in sorted(ok)]
    g = [r["gtp"] for r in ranks]
    skipped = sorted({x["train_step"] for x in g if x["train_step"] != "ran"})
    metrics = {
        "train_step": skipped[0] if skipped else "ran",
        "gtp_sharded_params": ranks[0]["gtp_sharded_params"],
        "expert_gtp_sharded_params": g[0]["expert_gtp_sharded_params"],
        "ckpt_tensors_checked": min(x["ckpt_tensors_checked"] for x in g),
        "refit_tensors": g[0]["refit_tensors"], "refit_gathered": g[0]["refit_gathered"],
        "refit_padded": g[0]["refit_padded"], "refit_expert_gathered": g[0]["refit_expert_gathered"],
        # The inference model's mean log-prob of what it sampled: depends on the seed (weights, samples).
        "sample_logprob_mean": sum(x["sample_logprob_sum"] for x in g) / sum(x["samples"] for x in g),
        "refit_seconds": max(x["refit_seconds"] for x in g),
    }
    if not skipped:
        count = sum(x["tokens_compared"] for x in g)
        metrics.update({
            "token_mult_prob_error": sum(x["token_mult_prob_error_sum"] for x in g) / count,
            "token_mult_prob_error_per_step": [
                sum(x["steps"][k]["token_mult_prob_error"] for x in g) / len(g) for k in range(s.steps)],
            "max_abs_logprob_diff": max(x["max_abs_logprob_diff"] for x in g),
            "ckpt_token_mult_prob_error": sum(x["ckpt_err_sum"] for x in g) / sum(x["ckpt_count"] for x in g),
            "ckpt_max_abs_logprob_diff": max(x["ckpt_max_abs_logprob_diff"] for x in g),
            "loss_per_step": [g[0]["steps"][k]["loss"] for k in range(s.steps)],
            "grad_norm_per_step": [g[0]["steps"][k]["grad_norm"] for k in range(s.steps)],
            "grad_norm": g[0]["grad_norm"],
            "tokens": int(count),
        })
        # Cost: the worst rank of each arm (max), and GTP's ratio to GTP off.
        for key in _ARM_KEYS:
            metrics[f"gtp_{key}"] = max(x[key] for x in g)
    if not skipped and all("gtp_off" in r for r in ranks):
        for key in _ARM_KEYS:
            off = max(r["gtp_off"][key] for r in ranks)
            metrics[f"off_{key}"] = off
            if off:
                metrics[f"ratio_{key}"] = metrics[f"gtp_{key}"] / off
        metrics["off_grad_norm_per_step"] = [ranks[0]["gtp_off"]["steps"][k]["grad_norm"] for k in range(s.steps)]
        metrics["off_token_mult_prob_error"] = (
            sum(r["gtp_off"]["token_mult_prob_error_sum"] for r in ranks)
            / sum(r["gtp_off"]["tokens_compared"] for r in ranks))
    problems = []
    marks = (MARK_GTP, MARK_RESHARD) + ((MARK_EXPERT,) if s.experts and s.expert_gtp > 1 else ())
    for rank, res in sorted(ok.items()):
        for mark in marks:
            if not any(m.startswith(mark) for m in res["markers"]):
                problems.append(f"rank {rank} never logged {mark!r}")
    for key in ("token_mult_prob_error", "ckpt_token_mult_prob_error"):
        if key in metrics and not metrics[key] < s.max_error:
            problems.append(f"{key} {metrics[key]:.6f} is not below {s.max_error}")
    return metrics, problems


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
    base.update(torch=torch.__version__, device=torch.cuda.get_device_name(0), transformer_engine=_te_version(),
                model={k: getattr(s, k) for k in ("vocab", "hidden", "layers", "heads", "query_groups", "ffn",
                                                  "tied", "experts", "topk", "moe_ffn")})
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gtp-refit-mini-") as tmp:
        ok, failed = run_ranks(s, s.ckpt_dir or tmp)
    seconds = round(time.monotonic() - t0, 1)
    if failed:
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
    metrics, problems = summarize(ok, s)
    for p in problems:
        print(f"FAIL: {p}", flush=True)
    emit({**base, **metrics, "status": "failed" if problems else "passed", "seconds": seconds,
          **({"reason": "; ".join(problems)} if problems else {})}, s)
    return EXIT_FAILED if problems else EXIT_OK


# -- --dry-check ----------------------------------------------------------------------------
def dry_check(s: Settings) -> int:
    """Imports and API shapes this test relies on, checked without CUDA."""
    report: dict = {"test": "gtp_refit_mini", "dry_check": True, "settings": asdict(s), "problems": []}
    problems = report["problems"]

    def need(cond, message):
        if not cond:
            problems.append(message)

    try:
        from megatron.core import dist_checkpointing, parallel_state  # noqa: F401
        from megatron.core.distributed import (  # noqa: F401
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.inference.shards import build_inference_pg_collection
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
        from megatron.core.models.gpt.gpt_model import GPTModel
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer  # noqa: F401
        from megatron.core.process_groups_config import ProcessGroupCollection
        from megatron.core.resharding import refit as mcore_refit
        from megatron.core.tensor_parallel import gtp_api
        from megatron.core.tensor_parallel.generalized_tensor_parallelism import (  # noqa: F401
            GTP_CONFIG,
            get_global_GTP_cache,
            reset_gtp_state,
        )
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed  # noqa: F401
        from megatron.core.transformer.transformer_config import TransformerConfig
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        problems.append(f"import failed: {type(exc).__name__}: {exc}")
        print(json.dumps(report, sort_keys=True))
        return EXIT_FAILED
    init_params = inspect.signature(parallel_state.initialize_model_parallel).parameters
    need("gtp_remat_size" in init_params, "initialize_model_parallel() takes no gtp_remat_size")
    if s.experts:
        need("expert_gtp_remat_size" in init_params, "initialize_model_parallel() takes no expert_gtp_remat_size")
        spec_params = inspect.signature(get_gpt_layer_with_transformer_engine_spec).parameters
        need("num_experts" in spec_params and "moe_grouped_gemm" in spec_params,
             "get_gpt_layer_with_transformer_engine_spec() takes no num_experts / moe_grouped_gemm")
    need("pg_collection" in inspect.signature(GPTModel.__init__).parameters, "GPTModel() takes no pg_collection")
    sig = inspect.signature(build_inference_pg_collection).parameters
    need(all(k in sig for k in ("world_size", "tp_size", "pp_size", "cp_size", "ep_size", "expt_tp_size")),
         f"build_inference_pg_collection() parameters are {list(sig)}")
    fields = TransformerConfig.__dataclass_fields__
    need("tensor_parallel_num_weight_shards" in fields, "TransformerConfig has no tensor_parallel_num_weight_shards")
    if s.experts:
        need(all(k in fields for k in ("expert_tensor_parallel_num_weight_shards", "num_moe_experts",
                                        "moe_router_topk", "moe_ffn_hidden_size", "moe_grouped_gemm")),
             "TransformerConfig lacks an expert field the test sets")
        need("expt_gtp_remat" in ProcessGroupCollection.__dataclass_fields__,
             "ProcessGroupCollection has no expt_gtp_remat field")
    need("gtp_remat" in ProcessGroupCollection.__dataclass_fields__, "ProcessGroupCollection has no gtp_remat field")
    opt_fields = OptimizerConfig.__dataclass_fields__
    need(all(k in opt_fields for k in ("use_distributed_optimizer", "use_precision_aware_optimizer", "clip_grad")),
         "OptimizerConfig lacks a field the test sets")
    for attr in ("enable_forward_pre_hook", "disable_forward_pre_hook", "zero_grad_buffer"):
        need(hasattr(DistributedDataParallel, attr), f"DistributedDataParallel has no {attr}")
    for attr in ("HAVE_GTP", "is_gtp_param", "classify_gtp_remat_chains"):
        need(hasattr(gtp_api, attr), f"gtp_api has no {attr}")
    for attr in ("prepare_swap_model_weights", "swap_model_weights", "clear_all_caches"):
        need(hasattr(mcore_refit, attr), f"megatron.core.resharding.refit has no {attr}")
    for attr in ("weight_prefetch", "async_reduction"):
        need(hasattr(GTP_CONFIG, attr), f"GTP config has no {attr}")
    report["gtp_defaults"] = {"weight_prefetch": GTP_CONFIG.weight_prefetch,
                              "async_reduction": GTP_CONFIG.async_reduction}
    report["transformer_engine"] = _te_version()
    report["have_gtp"] = bool(getattr(gtp_api, "HAVE_GTP", False))
    report["cuda"] = torch.cuda.is_available()
    report["ok"] = not problems
    print(json.dumps(report, sort_keys=True))
    return EXIT_OK if not problems else EXIT_FAILED


def main(argv: list[str] | None = None) -> int:
    try:
        s, dry = parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:
        return EXIT_USAGE if exc.code else EXIT_OK
    if dry:
        return dry_check(s)
    try:
        return launch(s)
    except CheckFailed as exc:
        print(f"FAIL: {exc}", flush=True)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
