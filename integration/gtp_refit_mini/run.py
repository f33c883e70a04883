#!/usr/bin/env python3
"""GTP train + refit, end to end, on megatron-core and TransformerEngine alone.

What a GRPO step with GTP does, without NeMo-RL, Ray or vLLM:

1. Training model: a tiny Qwen2-style GPT (TE layer spec, RMSNorm, SwiGLU, rotary positions,
   QKV biases, tied embeddings, fp32) under ``initialize_model_parallel(tp=1, gtp_remat_size=2)``:
   every weight is split over the two GTP ranks. Asserted: at least one parameter is actually
   GTP-sharded; then the ``[gtp] enabling GTP weight rematerialization`` marker is logged.
2. Inference model: the same GPT built on ``build_inference_pg_collection(...)`` (GTP off),
   as NeMo-RL's colocated reshard does. Asserted: no parameter is GTP-sharded; then the
   ``[colocated-reshard] building dedicated inference model`` marker is logged.
3. Refit: every GTP shard is all-gathered over its GTP group along dim 0, its padding rows
   stripped, and copied into the whole-weight inference model; every other parameter is
   copied as it is. Shapes must match exactly and the refitted weights must be bit-identical
   on all ranks.
4. Generation: a few temperature-sampling steps on the inference model; its log-probs of the
   sampled tokens are kept (``gen_lp``).
5. Training forward: the training model's log-probs of the same tokens (``train_lp``);
   ``token_mult_prob_error`` = masked mean of exp(|gen_lp - train_lp|) must be below
   ``--max-error`` (1.05, NeMo-RL's gate; an exact refit gives ~1.0).
6. A GRPO-style clipped policy-gradient loss (advantages from a toy reward) and backward on
   the training model: gradients finite everywhere and non-zero on every GTP-sharded weight.

The last line on stdout is one JSON object with the metrics (for tools/nightly.py's judge).
On a tree without the gtp series' fixes the run stops at the first known bug it meets and
prints ``BUG_HIT: <patch id>: <message>`` (ids as in patches/gtp/series.toml).
Without CUDA, or where megatron-core reports ``HAVE_GTP`` False, it prints ``SKIP: <reason>``
and exits 0: a skip, never a pass.

Run (one GPU, two gloo ranks on cuda:0; or two GPUs with NCCL, rank r on cuda:r):
    PYTHONPATH=<megatron-lm tree>:<TE site> python integration/gtp_refit_mini/run.py --nproc 2 --backend gloo
    PYTHONPATH=<megatron-lm tree>:<TE site> python integration/gtp_refit_mini/run.py --nproc 2 --backend nccl
``--dry-check`` validates the arguments, the imports and the megatron-core APIs used, without CUDA.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import queue as queue_mod
import re
import socket
import sys
import time
import traceback
from dataclasses import asdict, dataclass

import torch

MARK_GTP = "[gtp] enabling GTP weight rematerialization"
MARK_RESHARD = "[colocated-reshard] building dedicated inference model"

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BUG = 0, 1, 2, 3

# Known signatures of the bugs the gtp series fixes, in the words the pristine code fails with.
SIGNATURES = (
    ("mlm-te-bias-sizing", re.compile(r"must match the size of tensor")),
    ("mlm-tied-weight-guard", re.compile(r"supplied weight's shape")),
    ("mlm-pg-collection", re.compile(r"unexpected keyword argument '?pg_collection'?")),
)


class KnownBug(Exception):
    """A failure this test recognises as one of the series' bugs."""

    def __init__(self, patch_id: str, message: str):
        super().__init__(f"{patch_id}: {message}")
        self.patch_id = patch_id
        self.message = message


class CheckFailed(AssertionError):
    """One of this test's own checks failed (not a known bug)."""


def check(cond, message: str) -> None:
    if not cond:
        raise CheckFailed(message)


def classify(exc: BaseException) -> KnownBug | None:
    if isinstance(exc, KnownBug):
        return exc
    text = f"{type(exc).__name__}: {exc}"
    for patch_id, pattern in SIGNATURES:
        if pattern.search(text):
            return KnownBug(patch_id, " ".join(text.split())[:400])
    return None


@dataclass(frozen=True)
class Settings:
    nproc: int = 2
    backend: str = "gloo"
    gtp: int = 2
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
    max_error: float = 1.05
    seed: int = 1234
    timeout: float = 900.0
    out: str | None = None


def parse_args(argv: list[str]) -> tuple[Settings, bool]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="exit codes: 0 passed or skipped (SKIP line); 1 a check failed; "
                                       "2 bad usage; 3 a known bug of the gtp series was hit (BUG_HIT line)")
    d = Settings()
    p.add_argument("--nproc", type=int, default=d.nproc, help="ranks to spawn (a multiple of --gtp)")
    p.add_argument("--backend", choices=("gloo", "nccl"), default=d.backend,
                   help="gloo: every rank on cuda:0 (one GPU); nccl: rank r on cuda:r")
    p.add_argument("--gtp", type=int, default=d.gtp, help="gtp_remat_size of the training layout")
    p.add_argument("--vocab", type=int, default=d.vocab)
    p.add_argument("--hidden", type=int, default=d.hidden)
    p.add_argument("--layers", type=int, default=d.layers)
    p.add_argument("--heads", type=int, default=d.heads)
    p.add_argument("--query-groups", type=int, default=d.query_groups)
    p.add_argument("--ffn", type=int, default=d.ffn,
                   help="FFN hidden size; 200 makes fc1 (400 rows) carry GTP padding rows")
    p.add_argument("--seq", type=int, default=d.seq, help="max sequence length")
    p.add_argument("--prompts", type=int, default=d.prompts, help="prompts per rank")
    p.add_argument("--generations", type=int, default=d.generations, help="samples per prompt (GRPO group)")
    p.add_argument("--prompt-len", type=int, default=d.prompt_len)
    p.add_argument("--new-tokens", type=int, default=d.new_tokens)
    p.add_argument("--temperature", type=float, default=d.temperature)
    p.add_argument("--clip", type=float, default=d.clip, help="PPO/GRPO ratio clip epsilon")
    p.add_argument("--max-error", type=float, default=d.max_error, help="gate on token_mult_prob_error")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--timeout", type=float, default=d.timeout, help="seconds before the ranks count as hung")
    p.add_argument("--out", help="also write the result JSON to OUT/result.json")
    p.add_argument("--dry-check", action="store_true",
                   help="validate arguments, imports and the megatron-core APIs used; needs no CUDA")
    a = p.parse_args(argv)
    s = Settings(**{k: getattr(a, k) for k in Settings.__dataclass_fields__})
    problems = []
    if s.gtp < 2:
        problems.append("--gtp must be at least 2 (GTP off tests nothing)")
    if s.nproc < s.gtp or s.nproc % s.gtp:
        problems.append(f"--nproc {s.nproc} must be a positive multiple of --gtp {s.gtp}")
    if s.prompt_len + s.new_tokens > s.seq:
        problems.append(f"--prompt-len + --new-tokens ({s.prompt_len + s.new_tokens}) exceeds --seq {s.seq}")
    if s.hidden % s.heads or s.heads % s.query_groups:
        problems.append("--hidden must be divisible by --heads, and --heads by --query-groups")
    if s.generations < 2:
        problems.append("--generations must be at least 2 (GRPO advantages compare samples of a prompt)")
    if s.temperature <= 0:
        problems.append("--temperature must be positive (greedy samples give a GRPO group no signal)")
    if problems:
        p.error("; ".join(problems))
    return s, a.dry_check


# -- model ----------------------------------------------------------------------------------
def model_config(s: Settings, gtp: int):
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=s.layers,
        hidden_size=s.hidden,
        num_attention_heads=s.heads,
        num_query_groups=s.query_groups,
        ffn_hidden_size=s.ffn,
        normalization="RMSNorm",
        layernorm_epsilon=1e-6,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        # TE refuses fp32 activations against bf16 weights outside autocast.
        params_dtype=torch.float32,
        # Weight shards = tp * gtp_remat; 1 for the whole-weight inference model.
        tensor_parallel_num_weight_shards=gtp,
    )


def build_gpt(s: Settings, config, pg_collection=None):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    from megatron.core.models.gpt.gpt_model import GPTModel

    kwargs = {} if pg_collection is None else {"pg_collection": pg_collection}
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_with_transformer_engine_spec(),
        vocab_size=s.vocab,
        max_sequence_length=s.seq,
        share_embeddings_and_output_weights=True,
        position_embedding_type="rope",
        rotary_base=1000000,
        **kwargs,
    )
    return model.cuda(torch.cuda.current_device())


def gtp_sharded(model) -> list[str]:
    from megatron.core.tensor_parallel.gtp_api import is_gtp_param

    return [n for n, p in model.named_parameters() if is_gtp_param(p)]


def plain_copy(param) -> torch.Tensor:
    """The values of a (possibly GTP subclass) parameter as a plain tensor."""
    out = torch.empty(param.shape, dtype=param.dtype, device=param.device)
    out.copy_(param.detach())
    return out


# -- collectives (gloo gets CPU copies: it is only trusted with those here) ------------------
def _comm(t: torch.Tensor, backend: str) -> torch.Tensor:
    return t.detach().cpu() if backend == "gloo" else t.detach().contiguous()


def all_gather_rows(t: torch.Tensor, group, backend: str) -> torch.Tensor:
    import torch.distributed as dist

    src = _comm(t, backend)
    parts = [torch.empty_like(src) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, src, group=group)
    return torch.cat(parts, 0).to(t.device)


def all_reduce_sum(values: list[float], backend: str, group=None) -> list[float]:
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device="cpu" if backend == "gloo" else "cuda")
    dist.all_reduce(t, group=group)
    return t.tolist()


# -- the steps ----------------------------------------------------------------------------
def _is_bias(name: str) -> bool:
    return re.search(r"(^|\.)bias\d*$", name) is not None


@torch.no_grad()
def refit(train, infer, s: Settings) -> dict:
    """Gather every GTP shard to its whole weight and copy all parameters into ``infer``."""
    import torch.distributed as dist
    from megatron.core.tensor_parallel.gtp_api import is_gtp_param

    src = dict(train.named_parameters())
    dst = dict(infer.named_parameters())
    check(src.keys() == dst.keys(),
          f"training and inference models name different parameters: {sorted(set(src) ^ set(dst))[:6]}")
    gathered = padded = 0
    for name, target in dst.items():
        param = src[name]
        if is_gtp_param(param):
            group_size = dist.get_world_size(param.group)
            check(param.gtp_remat_size == group_size,
                  f"{name}: gtp_remat_size {param.gtp_remat_size} but its group has {group_size} ranks")
            whole = all_gather_rows(plain_copy(param), param.group, s.backend)
            if param.pad_length:
                whole = whole[: whole.shape[0] - param.pad_length]
                padded += 1
            gathered += 1
        else:
            whole = plain_copy(param)
            if (_is_bias(name) and whole.dim() == 1 and target.dim() == 1
                    and whole.shape[0] * s.gtp == target.shape[0]):
                raise KnownBug("mlm-te-bias-sizing",
                               f"{name}: the GTP training model's bias has {whole.shape[0]} entries, the "
                               f"whole-weight model's {target.shape[0]}: TE sized a replicated bias from the "
                               f"pre-sharded out_features (1/{s.gtp} too short)")
        check(tuple(whole.shape) == tuple(target.shape),
              f"refit {name}: {'gathered' if is_gtp_param(param) else 'copied'} {tuple(whole.shape)} from the "
              f"training model, the inference model holds {tuple(target.shape)}")
        target.copy_(whole.to(target.dtype))
    # Every rank must now hold the same whole weights: a shard in the wrong place differs.
    sums = [float(p.detach().double().sum()) for p in dst.values()]
    world = dist.get_world_size()
    device = next(iter(dst.values())).device
    rows = all_gather_rows(torch.tensor([sums], dtype=torch.float64, device=device), None, s.backend)
    check(all(torch.equal(rows[0], rows[r]) for r in range(world)),
          "refitted inference weights differ between ranks")
    return {"refit_tensors": len(dst), "refit_gathered": gathered, "refit_padded": padded}


def positions(tokens: torch.Tensor) -> torch.Tensor:
    return torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0).expand_as(tokens).contiguous()


@torch.no_grad()
def generate(model, prompts: torch.Tensor, s: Settings, gen: torch.Generator):
    """Sample ``new_tokens`` tokens (full recompute each step); return tokens and their log-probs."""
    model.eval()
    tokens, lps = prompts, []
    for _ in range(s.new_tokens):
        logits = model(tokens, positions(tokens), None)
        check(tuple(logits.shape) == (tokens.shape[0], tokens.shape[1], s.vocab),
              f"inference logits have shape {tuple(logits.shape)}")
        logp = torch.log_softmax(logits[:, -1, :].float() / s.temperature, dim=-1)
        nxt = torch.multinomial(logp.exp(), 1, generator=gen)
        lps.append(logp.gather(-1, nxt))
        tokens = torch.cat([tokens, nxt], dim=1)
    return tokens, torch.cat(lps, dim=1)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, start: int, temperature: float) -> torch.Tensor:
    """log p(tokens[:, t]) for t >= start, from logits at t - 1."""
    logp = torch.log_softmax(logits[:, start - 1 : -1, :].float() / temperature, dim=-1)
    return logp.gather(-1, tokens[:, start:].unsqueeze(-1)).squeeze(-1)


def grpo_loss(lp, lp_old, advantages, mask, clip: float) -> torch.Tensor:
    ratio = torch.exp(lp - lp_old)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip, 1.0 + clip) * advantages
    return -(torch.minimum(unclipped, clipped) * mask).sum() / mask.sum()


def log0(rank: int, message: str) -> None:
    if rank == 0:
        print(message, flush=True)


def run_rank(rank: int, world: int, port: int, s: Settings) -> dict:
    import torch.distributed as dist

    torch.cuda.set_device(0 if s.backend == "gloo" else rank)
    dist.init_process_group(s.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    from megatron.core import parallel_state
    from megatron.core.inference.shards import build_inference_pg_collection
    from megatron.core.tensor_parallel.generalized_tensor_parallelism import update_gtp_config
    from megatron.core.tensor_parallel.gtp_api import HAVE_GTP, classify_gtp_remat_chains, is_gtp_param
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    check(HAVE_GTP, "megatron-core reports HAVE_GTP False in a rank")
    markers: list[str] = []
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, gtp_remat_size=s.gtp)
    try:
        model_parallel_cuda_manual_seed(s.seed)
        # The tied output layer reuses the embedding, the first weight of GTP's prefetch chain,
        # out of chain order: gather and reduce on demand (as the series' end-to-end proof does).
        update_gtp_config(weight_prefetch=False, async_reduction=False)

        # 1. the GTP-sharded training model
        train = build_gpt(s, model_config(s, gtp=s.gtp))
        classify_gtp_remat_chains(train)
        sharded = gtp_sharded(train)
        check(sharded, f"the training model built with gtp_remat_size={s.gtp} has no GTP-sharded parameter")
        line = f"{MARK_GTP} (gtp_remat_size={s.gtp} expert_gtp_remat_size=1)"
        log0(rank, line)
        markers.append(line)

        # 2. the dedicated whole-weight inference model
        pgc = build_inference_pg_collection(world_size=world, tp_size=1, pp_size=1, cp_size=1,
                                            ep_size=1, expt_tp_size=1)
        infer = build_gpt(s, model_config(s, gtp=1), pg_collection=pgc)
        still = gtp_sharded(infer)
        if still:
            where = ", ".join(still[:3]) + (" ..." if len(still) > 3 else "")
            if "gtp_remat" not in vars(pgc):
                raise KnownBug("mlm-inference-pg",
                               f"the inference model built on build_inference_pg_collection() still has "
                               f"{len(still)} GTP-sharded parameter(s) ({where}): the collection leaves "
                               f"gtp_remat unset, so the layers use training's gtp_remat_size={s.gtp} group")
            raise KnownBug("mlm-pg-collection",
                           f"the inference collection sets gtp_remat={pgc.gtp_remat!r}, yet the model built on it "
                           f"has {len(still)} GTP-sharded parameter(s) ({where}): the layers ignore the model's "
                           f"pg_collection and take the MPU group")
        line = f"{MARK_RESHARD} (inference TP=1 PP=1 EP=1 CP=1 impl=transformer_engine)"
        log0(rank, line)
        markers.append(line)

        # 3. refit
        refit_stats = refit(train, infer, s)

        # 4. generate on the inference model (each rank its own prompts, as data-parallel ranks)
        gen = torch.Generator(device="cuda").manual_seed(s.seed * 1009 + rank)
        cpu_gen = torch.Generator().manual_seed(s.seed * 7919 + rank)
        prompts = torch.randint(0, s.vocab, (s.prompts, s.prompt_len), generator=cpu_gen)
        prompts = prompts.repeat_interleave(s.generations, dim=0).cuda()
        tokens, gen_lp = generate(infer, prompts, s, gen)
        mask = torch.ones_like(gen_lp)

        # 5. training log-probs of the sampled tokens
        train.train()
        logits = train(tokens, positions(tokens), None)
        check(tuple(logits.shape) == (tokens.shape[0], tokens.shape[1], s.vocab),
              f"training logits have shape {tuple(logits.shape)}")
        train_lp = token_logprobs(logits, tokens, s.prompt_len, s.temperature)
        err = torch.exp((gen_lp - train_lp.detach()).abs())
        local_err_sum, local_count = float((err * mask).sum()), float(mask.sum())
        max_abs_diff = float(((gen_lp - train_lp.detach()).abs() * mask).max())

        # 6. GRPO-style loss and backward (plain autograd: Megatron DDP's grad sync needs NCCL)
        rewards = tokens[:, s.prompt_len:].float().mean(dim=1) / s.vocab  # toy reward: prefer high ids
        grouped = rewards.view(s.prompts, s.generations)
        adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)).view(-1, 1)
        # On-policy (lp_old = lp): the ratio is 1, so the loss is -mean(advantage) ~ 0 while its
        # gradient, mean(advantage * grad lp), is not.
        loss = grpo_loss(train_lp, train_lp.detach(), adv, mask, s.clip)
        for p in train.parameters():
            if is_gtp_param(p):
                p.main_grad = torch.zeros(p.shape, dtype=p.dtype, device=p.device)
        loss.backward()
        torch.cuda.synchronize()

        gtp_sq = other_sq = 0.0
        zero, bad = [], []
        for name, p in train.named_parameters():
            g = p.main_grad if is_gtp_param(p) else p.grad
            if g is None:
                continue
            if not bool(torch.isfinite(g).all()):
                bad.append(name)
                continue
            sq = float(g.double().pow(2).sum())
            if is_gtp_param(p):
                gtp_sq += sq
                if sq == 0.0:
                    zero.append(name)
            else:
                other_sq += sq
        check(not bad, f"non-finite gradients: {bad[:5]}")
        check(not zero, f"GTP-sharded weights with an all-zero gradient: {zero[:5]}")

        err_sum, count, loss_sum, gtp_sq_all = all_reduce_sum(
            [local_err_sum, local_count, float(loss.detach()), gtp_sq], s.backend)
        # Non-GTP parameters are replicas (no DP gradient reduction here): average their norms.
        (other_sq_all,) = all_reduce_sum([other_sq], s.backend)
        return {
            "rank": rank,
            "markers": markers,
            "token_mult_prob_error": err_sum / count,
            "token_mult_prob_error_rank": local_err_sum / local_count,
            "max_abs_logprob_diff_rank": max_abs_diff,
            "loss": loss_sum / world,
            "grad_norm": math.sqrt(gtp_sq_all / (world // s.gtp) + other_sq_all / world),
            "grad_norm_gtp_sharded": math.sqrt(gtp_sq_all / (world // s.gtp)),
            "gtp_sharded_params": len(sharded),
            "inference_gtp_sharded_params": len(still),
            "params": len(list(train.parameters())),
            "tokens": int(count),
            **refit_stats,
        }
    finally:
        parallel_state.destroy_model_parallel()


def rank_entry(rank: int, world: int, port: int, s: Settings, results) -> None:
    import torch.distributed as dist

    try:
        results.put((rank, "ok", run_rank(rank, world, port, s)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        bug = classify(exc)
        tb = "".join(traceback.format_exception(exc))
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
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def skip_reason(s: Settings) -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device (the GTP path runs on GPUs only)"
    need = 1 if s.backend == "gloo" else s.nproc
    if torch.cuda.device_count() < need:
        return f"--backend {s.backend} with --nproc {s.nproc} needs {need} GPU(s), {torch.cuda.device_count()} visible"
    try:
        from megatron.core.tensor_parallel.gtp_api import HAVE_GTP
    except ImportError as exc:
        raise CheckFailed(f"cannot import megatron-core's GTP API: {exc}") from exc
    if not HAVE_GTP:
        return "megatron.core.tensor_parallel.gtp_api.HAVE_GTP is False (GTP needs TransformerEngine >= 2.19)"
    return None


def run_ranks(s: Settings) -> tuple[dict[int, dict], dict[int, tuple[str, dict]]]:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=rank_entry, args=(r, s.nproc, port, s, results)) for r in range(s.nproc)]
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


def launch(s: Settings) -> int:
    base = {"test": "gtp_refit_mini", "backend": s.backend, "nproc": s.nproc, "gtp_remat_size": s.gtp,
            "seed": s.seed}
    reason = skip_reason(s)
    if reason:
        print(f"SKIP: gtp_refit_mini: {reason}", flush=True)
        emit({**base, "status": "skipped", "reason": reason}, s)
        return EXIT_OK
    base.update(torch=torch.__version__, device=torch.cuda.get_device_name(0), transformer_engine=_te_version())
    t0 = time.monotonic()
    ok, failed = run_ranks(s)
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
        emit({**base, "status": "failed", "reason": first, "seconds": seconds}, s)
        return EXIT_FAILED
    r0 = ok[0]
    problems = []
    for rank, res in sorted(ok.items()):
        for mark in (MARK_GTP, MARK_RESHARD):
            if not any(m.startswith(mark) for m in res["markers"]):
                problems.append(f"rank {rank} never logged {mark!r}")
    if not r0["token_mult_prob_error"] < s.max_error:
        problems.append(f"token_mult_prob_error {r0['token_mult_prob_error']:.6f} is not below {s.max_error}")
    metrics = {k: v for k, v in r0.items() if k not in ("rank", "markers", "token_mult_prob_error_rank",
                                                         "max_abs_logprob_diff_rank")}
    metrics["token_mult_prob_error_per_rank"] = [ok[r]["token_mult_prob_error_rank"] for r in sorted(ok)]
    metrics["max_abs_logprob_diff"] = max(ok[r]["max_abs_logprob_diff_rank"] for r in ok)
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
        from megatron.core import parallel_state
        from megatron.core.inference.shards import build_inference_pg_collection
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec  # noqa: F401
        from megatron.core.models.gpt.gpt_model import GPTModel
        from megatron.core.process_groups_config import ProcessGroupCollection
        from megatron.core.tensor_parallel import gtp_api
        from megatron.core.tensor_parallel.generalized_tensor_parallelism import GTP_CONFIG, update_gtp_config  # noqa: F401
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed  # noqa: F401
        from megatron.core.transformer.transformer_config import TransformerConfig
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        problems.append(f"import failed: {type(exc).__name__}: {exc}")
        print(json.dumps(report, sort_keys=True))
        return EXIT_FAILED
    need("gtp_remat_size" in inspect.signature(parallel_state.initialize_model_parallel).parameters,
         "initialize_model_parallel() takes no gtp_remat_size")
    need("pg_collection" in inspect.signature(GPTModel.__init__).parameters, "GPTModel() takes no pg_collection")
    sig = inspect.signature(build_inference_pg_collection).parameters
    need(all(k in sig for k in ("world_size", "tp_size", "pp_size", "cp_size", "ep_size", "expt_tp_size")),
         f"build_inference_pg_collection() parameters are {list(sig)}")
    fields = TransformerConfig.__dataclass_fields__
    need("tensor_parallel_num_weight_shards" in fields, "TransformerConfig has no tensor_parallel_num_weight_shards")
    need("gtp_remat" in ProcessGroupCollection.__dataclass_fields__, "ProcessGroupCollection has no gtp_remat field")
    for attr in ("HAVE_GTP", "is_gtp_param", "classify_gtp_remat_chains"):
        need(hasattr(gtp_api, attr), f"gtp_api has no {attr}")
    for attr in ("weight_prefetch", "async_reduction"):
        need(hasattr(GTP_CONFIG, attr), f"GTP config has no {attr}")
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
