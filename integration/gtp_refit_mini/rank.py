"""What each rank of the mini test does: the life of a checkpoint through GTP GRPO training.

1. Source: the model with GTP off (TP 1) writes a torch_dist checkpoint, as a converted
   checkpoint would be.
2. Training model: the same GPT under ``initialize_model_parallel(tp=1, gtp_remat_size=gtp)``;
   at least one parameter must be GTP-sharded (then the ``[gtp] enabling GTP weight
   rematerialization`` marker is logged). It loads the GTP-off checkpoint: every tensor exact.
3. Inference model: the same GPT on ``build_inference_pg_collection(...)`` (GTP off), as
   NeMo-RL's colocated reshard builds it; nothing may be GTP-sharded (then the
   ``[colocated-reshard] building dedicated inference model`` marker).
4. ``--steps`` GRPO iterations: refit (refit.py), sampling on the inference model, the training
   model's log-probs of the samples (``token_mult_prob_error`` = mean exp|gen_lp - train_lp|),
   the clipped loss, backward and an optimiser step (grpo.Trainer), with GTP's defaults.
5. The trained model writes a GTP checkpoint; a fresh whole-weight model loads it and must hold
   exactly the refitted weights, and its log-probs of the last samples must match the training
   model's (``ckpt_token_mult_prob_error``).

With experts (``--shape moe-tiny``) the expert axis is GTP-sharded too
(``expert_gtp_remat_size``), and the ``[gtp] expert weights GTP-sharded`` marker says so. GTP
gathers and reduce-scatters grouped expert weights with coalesced collectives, which gloo does
not have: on gloo the training model's forward and backward are then skipped, by name
(``train_step: skipped: gloo has no coalesced collectives``), and a seeded update of the training
weights stands in for each optimiser step, so that the refits and the GTP checkpoint still carry
weights that moved. Over NCCL the MoE model trains like the dense one.

With ``--compare-gtp-off`` the same training (from the same checkpoint, same samples) then runs
with GTP off, and both arms report what they cost per rank: memory for parameters, gradients
and optimiser state, the peak, step time, refit time and bytes.
"""

from __future__ import annotations

import gc
import os
import time

import sharedgpu
import torch
from bugs import KnownBug, check
from ckpt import check_loaded, load, logprobs_of, save
from grpo import Trainer, advantages, generate, grpo_loss, mult_prob_error, positions, token_logprobs
from model import build_gpt, expert_gtp_sharded, gtp_sharded, model_config, replicas_disagree, whole_weights
from refit import new_model_pair, refit

MARK_GTP = "[gtp] enabling GTP weight rematerialization"
MARK_RESHARD = "[colocated-reshard] building dedicated inference model"
MARK_EXPERT = "[gtp] expert weights GTP-sharded"
GLOO_EXPERT_SKIP = "skipped: gloo has no coalesced collectives"
MIB = 1024 * 1024


def log0(rank: int, message: str) -> None:
    if rank == 0:
        print(message, flush=True)


def train_step_skip(s, expert_gtp: int) -> str | None:
    """Why the training model cannot run forward and backward here, or None."""
    if s.backend == "gloo" and s.experts and expert_gtp > 1:
        return GLOO_EXPERT_SKIP
    return None


@torch.no_grad()
def stand_in_update(model, seed: int, scale: float = 1e-2) -> None:
    """Move every weight by seeded noise where no optimiser step can run; replicated tensors move
    alike on every rank, GTP padding rows stay zero as GTP keeps them."""
    from megatron.core.tensor_parallel.gtp_api import is_gtp_param

    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.add_((torch.randn(p.shape, generator=gen) * scale).to(p.device, p.dtype))
        if is_gtp_param(p) and p.pad_length and p.group.rank() == p.group.size() - 1:
            p[p.shape[0] - p.pad_length:] = 0


def _inference_model(s, world: int):
    from megatron.core.inference.shards import build_inference_pg_collection

    pgc = build_inference_pg_collection(world_size=world, tp_size=1, pp_size=1, cp_size=1, ep_size=1,
                                        expt_tp_size=1)
    model = build_gpt(s, model_config(s, gtp=1, expert_gtp=1), pg_collection=pgc)
    still = gtp_sharded(model)
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
    return model


def _release_gtp_buffers() -> None:
    from megatron.core.tensor_parallel.generalized_tensor_parallelism import get_global_GTP_cache, reset_gtp_state

    reset_gtp_state()
    get_global_GTP_cache().clear()
    gc.collect()
    torch.cuda.empty_cache()


def train_arm(rank: int, world: int, s, gtp: int, ckpt_dir: str, source: dict, markers: list[str] | None,
              expert_gtp: int = 1) -> dict:
    """Build, load the GTP-off checkpoint (checked against ``source``, its writer's weights),
    train ``s.steps`` GRPO steps; return the metrics and the models."""
    new_model_pair()
    infer = _inference_model(s, world)
    if markers is not None:
        line = f"{MARK_RESHARD} (inference TP=1 PP=1 EP=1 CP=1 impl=transformer_engine)"
        log0(rank, line)
        markers.append(line)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()

    config = model_config(s, gtp=gtp, expert_gtp=expert_gtp)
    train = build_gpt(s, config)
    sharded = gtp_sharded(train)
    experts = expert_gtp_sharded(train)
    check(bool(sharded) == (gtp > 1 or expert_gtp > 1),
          f"gtp={gtp} expert_gtp={expert_gtp} training model has {len(sharded)} GTP-sharded parameter(s)")
    check(bool(experts) == (bool(s.experts) and expert_gtp > 1),
          f"expert_gtp={expert_gtp} training model has {len(experts)} GTP-sharded expert parameter(s)")
    if markers is not None:
        line = f"{MARK_GTP} (gtp_remat_size={gtp} expert_gtp_remat_size={expert_gtp})"
        log0(rank, line)
        markers.append(line)
        if experts:
            line = f"{MARK_EXPERT}: {len(experts)} of {len(sharded)} GTP shards (expert_gtp_remat_size={expert_gtp})"
            log0(rank, line)
            markers.append(line)
    load(train, os.path.join(ckpt_dir, "off"))
    checked = check_loaded(train, source, s, f"the GTP-off checkpoint loaded into the gtp={gtp} training model")
    trainer = Trainer(train, config, s, gtp)
    setup_mib = (torch.cuda.memory_allocated() - base) / MIB

    gen = torch.Generator(device="cuda").manual_seed(s.seed * 1009 + rank)
    cpu_gen = torch.Generator().manual_seed(s.seed * 7919 + rank)
    per_step, err_sum, err_count, max_diff = [], 0.0, 0.0, 0.0
    sample_lp_sum = sample_lp_count = 0.0
    state_mib = None
    skip = train_step_skip(s, expert_gtp)
    if skip:
        log0(rank, f"train_step: {skip} (GTP all-gathers and reduce-scatters the grouped expert weights "
                   "coalesced; a seeded update stands in for each optimiser step; the nccl form trains)")
    for step in range(s.steps):
        trainer.for_inference()
        refit_stats = refit(train, infer, s, gtp)
        prompts = torch.randint(0, s.vocab, (s.prompts, s.prompt_len), generator=cpu_gen)
        prompts = prompts.repeat_interleave(s.generations, dim=0).cuda()
        tokens, gen_lp = generate(infer, prompts, s, gen)
        mask = torch.ones_like(gen_lp)
        sample_lp_sum, sample_lp_count = sample_lp_sum + float(gen_lp.sum()), sample_lp_count + gen_lp.numel()
        if skip:
            stand_in_update(train, s.seed * 31 + step)
            per_step.append({"step": step, "train_step": skip, "refit_seconds": refit_stats["refit_seconds"]})
            continue

        trainer.for_training()
        train.train()
        t0 = time.perf_counter()
        logits = trainer.model(tokens, positions(tokens), None)
        check(tuple(logits.shape) == (tokens.shape[0], tokens.shape[1], s.vocab),
              f"training logits have shape {tuple(logits.shape)}")
        train_lp = token_logprobs(logits, tokens, s.prompt_len, s.temperature)
        e_sum, e_count, e_max = mult_prob_error(gen_lp, train_lp.detach(), mask)
        err_sum, err_count, max_diff = err_sum + e_sum, err_count + e_count, max(max_diff, e_max)
        # On-policy (lp_old = lp): the ratio is 1, so the loss is -mean(advantage) ~ 0 while its
        # gradient, mean(advantage * grad lp), is not.
        loss = grpo_loss(train_lp, train_lp.detach(), advantages(tokens, s), mask, s.clip)
        forward_seconds = time.perf_counter() - t0
        stepped = trainer.step(loss)
        if state_mib is None:  # Adam's moments exist from the first step on
            state_mib = (torch.cuda.memory_allocated() - base) / MIB
        per_step.append({"step": step, "loss": float(loss.detach()), "token_mult_prob_error": e_sum / e_count,
                         "seconds": forward_seconds + stepped["step_seconds"], "grad_norm": stepped["grad_norm"],
                         "refit_seconds": refit_stats["refit_seconds"]})
    trainer.for_inference()
    final_refit = refit(train, infer, s, gtp)
    timed = per_step[1:] or per_step
    return {
        "train": train, "infer": infer, "tokens": tokens, "sharded": sharded, "trained": skip is None,
        "metrics": {
            "steps": per_step, "train_step": skip or "ran", "expert_gtp_sharded_params": len(experts),
            "ckpt_tensors_checked": checked, "sample_logprob_sum": sample_lp_sum, "samples": sample_lp_count,
            "token_mult_prob_error_sum": err_sum, "tokens_compared": err_count, "max_abs_logprob_diff": max_diff,
            "setup_mib": setup_mib, "train_state_mib": state_mib,
            "peak_mib": (torch.cuda.max_memory_allocated() - base) / MIB,
            "step_seconds": sum(x.get("seconds", 0.0) for x in timed) / len(timed),
            "refit_seconds": sum(x["refit_seconds"] for x in timed) / len(timed),
            "refit_bytes_received": final_refit["refit_bytes_received"],
            "refit_tensors": final_refit["refit_tensors"], "refit_gathered": final_refit["refit_gathered"],
            "refit_padded": final_refit["refit_padded"], "refit_expert_gathered": final_refit["refit_expert_gathered"],
            "grad_norm": per_step[-1].get("grad_norm"), "loss": per_step[-1].get("loss"),
        },
    }


def seed_like_training(seed: int) -> None:
    """Seed every generator a model's construction draws from, as Megatron's and Megatron-Bridge's
    training do (``_set_random_seed``: Python's, torch's CPU generator, then the model-parallel
    CUDA generators). Most weights initialise on the GPU from the CUDA trackers; the MoE router's
    initialises on the CPU (megatron-core 0.19.2 ``Router.__init__``), so with the CUDA seed alone
    each data-parallel rank built a different router and the checkpoint held rank 0's."""
    import random

    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    random.seed(seed)
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)


def join_world(rank: int, world: int, port: int, backend: str, mode: str) -> None:
    """Pick this rank's device and join the parent's rendezvous store (run.py's rank_store)."""
    torch.cuda.set_device(rank if mode == "gpu-per-rank" else 0)
    if mode == "shared-gpu":
        sharedgpu.enter()   # before NCCL reads NCCL_HOSTID: at the first collective
    connect(rank, world, port, backend)


def connect(rank: int, world: int, port: int, backend: str) -> None:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, world + 1, is_master=False)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world)


def run_rank(rank: int, world: int, port: int, s, ckpt_dir: str, mode: str) -> dict:
    join_world(rank, world, port, s.backend, mode)
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.generalized_tensor_parallelism import GTP_CONFIG
    from megatron.core.tensor_parallel.gtp_api import HAVE_GTP

    check(HAVE_GTP, "megatron-core reports HAVE_GTP False in a rank")
    # GTP's defaults, as NeMo-RL and Megatron-Bridge run it: asserted, never set here.
    check(GTP_CONFIG.weight_prefetch and GTP_CONFIG.async_reduction, f"GTP's defaults were changed: {GTP_CONFIG}")
    markers: list[str] = []

    # 1. the checkpoint a GTP-off run (or a converter) wrote
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    try:
        seed_like_training(s.seed)
        source = build_gpt(s, model_config(s, gtp=1))
        source_weights = whole_weights(source, s.backend)
        # Every rank holds the same model (data parallel): the checkpoint keeps one replica of
        # each tensor, and each rank checks what it loads against its own copy.
        apart = replicas_disagree(source_weights, s.backend)
        check(not apart, f"the GTP-off source model differs across its {world} data-parallel ranks before any "
                         f"checkpoint ({len(apart)} tensor(s): {'; '.join(apart[:4])}): a generator the ranks "
                         f"do not seed alike")
        save(source, os.path.join(ckpt_dir, "off"))
        del source
    finally:
        parallel_state.destroy_model_parallel()

    # 2-4. GTP training from that checkpoint, with refit and sampling
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, gtp_remat_size=s.gtp,
                                             expert_gtp_remat_size=s.expert_gtp)
    try:
        seed_like_training(s.seed)
        arm = train_arm(rank, world, s, s.gtp, ckpt_dir, source_weights, markers, s.expert_gtp)
        metrics = arm["metrics"]
        # 5. the GTP checkpoint, read by a whole-weight model; the inference model holds the
        # trained weights from the last refit.
        train, infer, tokens = arm["train"], arm["infer"], arm["tokens"]
        save(train, os.path.join(ckpt_dir, "gtp"))
        reader = _inference_model(s, world)
        load(reader, os.path.join(ckpt_dir, "gtp"))
        checked = check_loaded(reader, {n: p.detach().clone() for n, p in infer.named_parameters()}, s,
                               "the GTP checkpoint loaded into a whole-weight model")
        metrics["ckpt_tensors_checked"] = min(metrics["ckpt_tensors_checked"], checked)
        if arm["trained"]:  # the training model's forward is what a skipped train step cannot run
            lp_train = logprobs_of(train, tokens, s)
            lp_reader = logprobs_of(reader, tokens, s)
            c_sum, c_count, c_max = mult_prob_error(lp_reader, lp_train, torch.ones_like(lp_train))
            metrics.update(ckpt_err_sum=c_sum, ckpt_count=c_count, ckpt_max_abs_logprob_diff=c_max)
        sharded = arm["sharded"]
        del arm, train, infer, reader
        _release_gtp_buffers()
    finally:
        parallel_state.destroy_model_parallel()

    result = {"rank": rank, "markers": markers, "gtp_sharded_params": len(sharded), "gtp": metrics}
    if s.compare_gtp_off:
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
        try:
            seed_like_training(s.seed)
            off = train_arm(rank, world, s, 1, ckpt_dir, source_weights, None)
            result["gtp_off"] = off["metrics"]
            del off
            _release_gtp_buffers()
        finally:
            parallel_state.destroy_model_parallel()
    return result
