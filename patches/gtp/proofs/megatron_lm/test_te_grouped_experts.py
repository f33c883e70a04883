"""TE's grouped experts (TEGroupedMLP) under expert GTP: checkpoint layouts and refit, on a GPU.

The CPU proofs (test_swiglu_ckpt_layouts_experts.py, test_gtp_refit_plan_experts.py) build the
local spec's SequentialMLP; what MoE models train with is TE's grouped GEMM, TEGroupedMLP, whose
fc1 is one ``linear_fc1.weight<i>`` per local expert. Only TE builds it, so these run where a
CUDA GPU and TransformerEngine >= 2.19 are (two gloo ranks on cuda:0) and skip elsewhere.

Issue 23's first look on one H200 (a TE MoE GPT: 4 experts, top-2, SwiGLU experts, QKV bias),
GTP on the expert axis only, pristine 0.19.2; this file shows the same, red on the pristine base
and green on the series, on one H200 through the nightly (integration/proofs/h200/2026-12-01*/):

- ``test_grouped_expert_checkpoint_layouts`` (mlm-gtp-swiglu-ckpt): a GTP-off checkpoint loaded
  into the expert-GTP model leaves the 8 tensors ``experts.linear_fc1.weight0..3`` of both layers
  off; TEGroupedMLP.sharded_state_dict hands each of them to apply_swiglu_sharded_factory,
  which takes a GTP shard (only W rows or only V rows at expert gtp 2) for this rank's halves;
- ``test_grouped_expert_refit`` (mlm-gtp-refit-plan): "Cannot build TP descriptor for
  decoder.layers.0.mlp.experts.linear_fc1.weight0 dim0: src_world*src_local=1*128 != 1*256".

Both arms, expert GTP alone and both axes at 2, must come back exactly: GTP-off -> GTP, GTP (its
values moved) -> GTP-off, and a refit into the whole-weight model of
``build_inference_pg_collection`` and back. With both axes on, pristine 0.19.2 stops at the
replicated QKV bias first (mlm-te-bias-sizing).
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from _layouts import mismatches
from _te_gpt import GPU_ONLY, assert_gtp_at_its_defaults, build_moe_like, model_parallel
from _world import spawn

# What this proof fails with on the pristine base (tools' prove checks it): each test's own patch (GPU).
PRISTINE_FAILS = {
    "test_grouped_expert_checkpoint_layouts": r"experts\.linear_fc1\.weight\d+: max \|diff\|",
    "test_grouped_expert_refit": r"Cannot build TP descriptor for .* dim0",
}

pytestmark = GPU_ONLY

VOCAB, HIDDEN, FFN, SEQ = 256, 128, 128, 32
ARMS = pytest.mark.parametrize("gtp,expert_gtp", [(1, 2), (2, 2)], ids=["experts-only", "both-axes"])


def _model(gtp, expert_gtp, pg_collection=None):
    return build_moe_like(gtp, expert_gtp, vocab=VOCAB, seq=SEQ, hidden=HIDDEN, ffn=FFN, pg_collection=pg_collection)


def _whole(model) -> dict[str, torch.Tensor]:
    """Every parameter as the whole-weight model holds it, on the CPU (gloo): GTP shards gathered."""
    from megatron.core.tensor_parallel.gtp_api import is_gtp_param

    out = {}
    for name, p in model.named_parameters():
        value = torch.empty(p.shape, dtype=p.dtype, device="cpu")
        value.copy_(p.detach())
        if is_gtp_param(p):
            parts = [torch.empty_like(value) for _ in range(p.group.size())]
            dist.all_gather(parts, value, group=p.group)
            value = torch.cat(parts)[: value.shape[0] * p.group.size() - p.pad_length]
        out[name] = value
    return out


@torch.no_grad()
def _perturb(model, seed: int) -> None:
    """New values, the same on every rank for replicated tensors; GTP padding rows stay zero."""
    from megatron.core.tensor_parallel.gtp_api import is_gtp_param

    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.add_((torch.randn(p.shape, generator=gen) * 0.05).to(p.device, p.dtype))
        if is_gtp_param(p) and p.pad_length and p.group.rank() == p.group.size() - 1:
            p[p.shape[0] - p.pad_length:] = 0


def _expert_shards(model) -> int:
    from megatron.core.tensor_parallel.gtp_api import is_gtp_param

    return sum(1 for n, p in model.named_parameters() if ".mlp.experts." in n and is_gtp_param(p))


def _outcome(fn) -> list[str]:
    try:
        return fn()
    except BaseException as exc:  # torch's CheckpointException is no Exception
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        lines = [x.strip() for x in f"{type(exc).__name__}: {exc}".splitlines() if "Error: " in x or "Exception: " in x]
        return ["failed: " + (lines[-1] if lines else str(exc).splitlines()[0])[:400]]


def _checkpoints(rank, world_size, tmp, gtp, expert_gtp):
    from megatron.core import dist_checkpointing

    torch.cuda.set_device(0)
    assert_gtp_at_its_defaults()

    def save(model, name):
        path = os.path.join(tmp, name)
        os.makedirs(path, exist_ok=True)
        dist.barrier()
        dist_checkpointing.save(model.sharded_state_dict(), path)
        dist.barrier()

    def load_and_compare(model, name, expected):
        def go():
            model.load_state_dict(dist_checkpointing.load(model.sharded_state_dict(), os.path.join(tmp, name)))
            return mismatches(expected, _whole(model))
        return _outcome(go)

    out = {}
    with model_parallel(1):
        off = _model(1, 1)
        off_weights = _whole(off)
        save(off, "off")
        del off
    with model_parallel(gtp, expert_gtp=expert_gtp):
        sharded = _model(gtp, expert_gtp)
        out["expert shards"] = _expert_shards(sharded)
        out["off->gtp"] = load_and_compare(sharded, "off", off_weights)
        _perturb(sharded, seed=99)
        gtp_weights = _whole(sharded)
        save(sharded, "gtp")
        del sharded
    with model_parallel(1):
        out["gtp->off"] = load_and_compare(_model(1, 1), "gtp", gtp_weights)
    return out


def _refit(rank, world_size, gtp, expert_gtp):
    from megatron.core.inference.shards import build_inference_pg_collection
    from megatron.core.resharding.refit import (
        clear_all_caches,
        prepare_swap_model_weights,
        swap_model_weights,
    )

    torch.cuda.set_device(0)
    assert_gtp_at_its_defaults()

    def refit(src, dst, expected):
        def go():
            clear_all_caches()
            prepare_swap_model_weights(src_model=src, target_model=dst, group=None)
            swap_model_weights(src, dst, refit_method="gloo", group=None)
            torch.cuda.synchronize()
            return mismatches(expected, _whole(dst))
        return _outcome(go)

    out = {}
    with model_parallel(gtp, expert_gtp=expert_gtp):
        sharded = _model(gtp, expert_gtp)
        whole = _model(1, 1, pg_collection=build_inference_pg_collection(world_size, tp_size=1, ep_size=1,
                                                                         expt_tp_size=1))
        out["expert shards"] = _expert_shards(sharded)
        out["whole expert shards"] = _expert_shards(whole)
        _perturb(sharded, seed=7)
        _perturb(whole, seed=8)
        out["gtp->whole"] = refit(sharded, whole, _whole(sharded))
        _perturb(whole, seed=9)
        out["whole->gtp"] = refit(whole, sharded, _whole(whole))
        dist.barrier()
    return out


@ARMS
def test_grouped_expert_checkpoint_layouts(tmp_path, gtp, expert_gtp):
    for rank, res in enumerate(spawn(_checkpoints, 2, str(tmp_path), gtp, expert_gtp)):
        assert res["expert shards"] > 0, f"rank {rank}: no grouped expert weight is GTP-sharded"
        assert res["off->gtp"] == [], f"rank {rank}, GTP-off -> GTP: {res['off->gtp']}"
        assert res["gtp->off"] == [], f"rank {rank}, GTP -> GTP-off: {res['gtp->off']}"


@ARMS
def test_grouped_expert_refit(gtp, expert_gtp):
    for rank, res in enumerate(spawn(_refit, 2, gtp, expert_gtp)):
        assert res["expert shards"] > 0, f"rank {rank}: no grouped expert weight is GTP-sharded"
        assert res["whole expert shards"] == 0, f"rank {rank}: the whole-weight model's experts are GTP-sharded"
        assert res["gtp->whole"] == [], f"rank {rank}, GTP -> whole weights: {res['gtp->whole']}"
        assert res["whole->gtp"] == [], f"rank {rank}, whole weights -> GTP: {res['whole->gtp']}"
