"""One small GPT saved and loaded across layouts, for the series' checkpoint proofs.

``run_layouts(tmp, ffn, gated, singleton)`` runs in every rank (two gloo ranks, CPU, the local
layer spec, tied embeddings, QKV biases, rotary positions, GQA) and returns,
per direction, the parameters that did not come back exactly:

- ``off->gtp``: a torch_dist checkpoint written by the model with GTP off (tp 1) is loaded into
  the same model built with ``gtp_remat_size=2``; every GTP shard must hold its rows of the
  GTP-off weight (padding rows zero), every other parameter all of it. This is a run that
  starts from a converted checkpoint.
- ``gtp->gtp``: the GTP model, its values moved off the initial ones, saved and loaded into a
  fresh GTP model (the same-layout round trip, which hides mislabelled rows).
- ``gtp->off``: that checkpoint loaded into the whole-weight model (export, evaluation).

Each direction reports either a list of mismatches (``name: max |diff|`` or ``name: shape``) or
``"failed: <error>"`` when the load itself raised; the caller asserts on them.

``run_refit(ffn, gtp_size, expert_gtp)`` moves the GTP model's weights into a whole-weight model
with megatron-core's refit and back (test_gtp_refit_plan*.py). With ``expert_gtp`` both use the
MoE form of the GPT (``gpt(..., expert_gtp=...)``), its experts sharded over the expert GTP axis.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _cpu import (
    allow_dist_checkpoints_without_cuda,
    allow_gtp_shards_without_cuda,
    allow_refit_without_cuda,
)
from _world import leaves_ranks_clean

VOCAB, HIDDEN, LAYERS = 64, 32, 2


EXPERTS, TOPK = 4, 2


def _config(ffn: int, gated: bool, gtp: int, expert_gtp: int | None = None):
    from megatron.core.transformer.transformer_config import TransformerConfig

    # expert_gtp None: a dense model; else every layer's MLP is EXPERTS routed experts (top-TOPK)
    # of ffn rows each, their weights sharded over expert_gtp shards (1: GTP off on that axis).
    moe = {} if expert_gtp is None else {
        "num_moe_experts": EXPERTS, "moe_router_topk": TOPK, "moe_ffn_hidden_size": ffn,
        "expert_tensor_parallel_num_weight_shards": expert_gtp,
    }
    return TransformerConfig(
        num_layers=LAYERS,
        hidden_size=HIDDEN,
        num_attention_heads=4,
        num_query_groups=2,
        ffn_hidden_size=ffn,
        gated_linear_unit=gated,
        activation_func=F.silu if gated else F.gelu,
        add_bias_linear=False,
        add_qkv_bias=True,
        use_cpu_initialization=True,
        tensor_parallel_num_weight_shards=gtp,
        **moe,
    )


def gpt(ffn: int, gated: bool, gtp: int, pg_collection=None, expert_gtp: int | None = None):
    """The proofs' small GPT (tied embeddings, QKV bias, local spec); ``pg_collection`` as GPTModel takes it.

    With ``expert_gtp`` it is the MoE form instead: untied (as Qwen3-MoE), every MLP a
    SequentialMLP of routed experts (the local spec's only expert class: it has no grouped GEMM,
    that is TE's TEGroupedMLP), each expert's fc1 fused [W; V] when ``gated``.
    """
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_block_spec,
        get_gpt_layer_local_spec,
    )
    from megatron.core.models.gpt.gpt_model import GPTModel

    kwargs = {"pg_collection": pg_collection} if pg_collection is not None else {}
    config = _config(ffn, gated, gtp, expert_gtp)
    spec = (get_gpt_layer_local_spec() if expert_gtp is None
            else get_gpt_decoder_block_spec(config, use_transformer_engine=False))
    return GPTModel(config, spec, vocab_size=VOCAB, max_sequence_length=16,
                    share_embeddings_and_output_weights=expert_gtp is None,
                    position_embedding_type="rope", **kwargs)


def expert_gtp_shards(model) -> list[str]:
    """The expert parameters GTP-sharded over the expert GTP group."""
    return [n for n, p in model.named_parameters()
            if ".experts." in n and getattr(p, "is_gtp_weight_remat", False)]


@torch.no_grad()
def perturb(model, seed: int, scale: float) -> None:
    """New values, the same on every rank for replicated tensors; GTP padding rows stay zero, as
    GTP keeps them."""
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.add_(torch.randn(p.shape, generator=gen) * scale)
        if getattr(p, "pad_length", 0) and p.group.rank() == p.group.size() - 1:
            p[p.shape[0] - p.pad_length:] = 0


def whole_weights(model) -> dict[str, torch.Tensor]:
    """Every parameter as the whole-weight model holds it: GTP shards gathered, padding cut."""
    out = {}
    for name, param in model.named_parameters():
        value = param.detach().clone()
        if getattr(param, "is_gtp_weight_remat", False):
            parts = [torch.empty_like(value) for _ in range(param.group.size())]
            dist.all_gather(parts, value.contiguous(), group=param.group)
            value = torch.cat(parts)[: value.shape[0] * param.group.size() - param.pad_length]
        out[name] = torch.Tensor(value)
    return out


def mismatches(expected: dict, got: dict) -> list[str]:
    bad = []
    for name, want in expected.items():
        have = got[name]
        if have.shape != want.shape:
            bad.append(f"{name}: shape {tuple(have.shape)}, not {tuple(want.shape)}")
        elif not torch.equal(have, want):
            bad.append(f"{name}: max |diff| {float((have - want).abs().max()):.4g}")
    return bad


@leaves_ranks_clean
def run_layouts(rank, world_size, tmp, ffn, gated, singleton, gtp_size=2, expert_gtp=None):
    """``gtp_size`` shards the dense weights of the GTP model; ``expert_gtp`` (None: a dense model)
    the expert weights of the MoE form, whose GTP-off twin has both axes at 1."""
    from megatron.core import dist_checkpointing, parallel_state

    allow_gtp_shards_without_cuda()
    allow_dist_checkpoints_without_cuda()
    metadata = {"singleton_local_shards": True} if singleton else None

    def save(model, name):
        path = os.path.join(tmp, name)
        os.makedirs(path, exist_ok=True)
        dist.barrier()
        dist_checkpointing.save(model.sharded_state_dict(metadata=metadata), path)

    def load(model, name):
        state = dist_checkpointing.load(model.sharded_state_dict(metadata=metadata), os.path.join(tmp, name))
        model.load_state_dict(state)

    def direction(source, target, expected):
        try:
            load(target, source)
        except BaseException as exc:  # noqa: BLE001 - torch's CheckpointException is no Exception
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            # DCP wraps a rank's error in a traceback dump: report its innermost error line.
            text = f"{type(exc).__name__}: {exc}"
            lines = [x.strip() for x in text.splitlines() if "Exception: " in x or "Error: " in x]
            return "failed: " + (lines[-1] if lines else text.splitlines()[0])[:400]
        return mismatches(expected, whole_weights(target))

    results = {}
    torch.manual_seed(1234)
    off_experts = None if expert_gtp is None else 1
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    try:
        off = gpt(ffn, gated, gtp=1, expert_gtp=off_experts)
        off_weights = whole_weights(off)
        save(off, "off")
    finally:
        parallel_state.destroy_model_parallel()

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, gtp_remat_size=gtp_size,
                                             expert_gtp_remat_size=expert_gtp or 1)
    try:
        gtp = gpt(ffn, gated, gtp=gtp_size, expert_gtp=expert_gtp)
        assert any(getattr(p, "is_gtp_weight_remat", False) for p in gtp.parameters()), "nothing GTP-sharded"
        if expert_gtp and expert_gtp > 1:
            assert expert_gtp_shards(gtp), "no expert weight is GTP-sharded"
        results["off->gtp"] = direction("off", gtp, off_weights)
        perturb(gtp, seed=99, scale=0.01)
        gtp_weights = whole_weights(gtp)
        save(gtp, "gtp")
        results["gtp->gtp"] = direction("gtp", gpt(ffn, gated, gtp=gtp_size, expert_gtp=expert_gtp), gtp_weights)
    finally:
        parallel_state.destroy_model_parallel()

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    try:
        results["gtp->off"] = direction("gtp", gpt(ffn, gated, gtp=1, expert_gtp=off_experts), gtp_weights)
    finally:
        parallel_state.destroy_model_parallel()
    return results


def have_gtp() -> bool:
    from megatron.core.tensor_parallel.gtp_api import HAVE_GTP

    return bool(HAVE_GTP)


# -- refit (megatron-core's resharding) between the GTP model and a whole-weight model --------
def params(model) -> dict[str, torch.Tensor]:
    return {n: p.detach() for n, p in model.named_parameters()}


def refit(src, dst) -> str | None:
    """megatron-core's refit of src's weights into dst over gloo, as NeMo-RL calls it; the error, if any."""
    from megatron.core.resharding.refit import clear_all_caches, prepare_swap_model_weights, swap_model_weights

    clear_all_caches()
    try:
        prepare_swap_model_weights(src_model=src, target_model=dst, group=None)
        swap_model_weights(src, dst, refit_method="gloo", group=None)
    except Exception as exc:  # noqa: BLE001 - reported as the outcome
        return f"{type(exc).__name__}: {exc}"
    return None


@leaves_ranks_clean
def run_refit(rank, world_size, ffn, gtp_size=2, expert_gtp=None):
    """In every rank: the GTP model (``gtp_size`` dense shards; the MoE form with ``expert_gtp``
    expert shards) refitted into a whole-weight model built as NeMo-RL builds its dedicated
    inference model, and back; returns what the caller asserts on."""
    from megatron.core import parallel_state
    from megatron.core.inference.shards import build_inference_pg_collection

    allow_gtp_shards_without_cuda()
    allow_refit_without_cuda()
    torch.manual_seed(1234)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, gtp_remat_size=gtp_size,
                                             expert_gtp_remat_size=expert_gtp or 1)
    whole_experts = None if expert_gtp is None else 1
    out = {}
    try:
        gtp = gpt(ffn, True, gtp=gtp_size, expert_gtp=expert_gtp)
        out["gtp shards"] = sum(getattr(p, "is_gtp_weight_remat", False) for p in gtp.parameters())
        out["expert shards"] = len(expert_gtp_shards(gtp))
        out["padded"] = sorted(n for n, p in gtp.named_parameters() if getattr(p, "pad_length", 0))
        whole = gpt(ffn, True, gtp=1, expert_gtp=whole_experts,
                    pg_collection=build_inference_pg_collection(world_size, tp_size=1))
        out["whole shards"] = sum(getattr(p, "is_gtp_weight_remat", False) for p in whole.parameters())
        perturb(gtp, seed=7, scale=1.0)
        perturb(whole, seed=8, scale=1.0)
        expected = whole_weights(gtp)
        out["differs before"] = len(mismatches(expected, params(whole)))
        error = refit(gtp, whole)
        out["gtp->whole"] = [f"failed: {error}"] if error else mismatches(expected, params(whole))

        # Back: new whole weights into the GTP shards.
        perturb(whole, seed=9, scale=1.0)
        want = {n: t.clone() for n, t in params(whole).items()}
        error = refit(whole, gtp)
        out["whole->gtp"] = [f"failed: {error}"] if error else mismatches(want, whole_weights(gtp))
        out["padding zero"] = all(
            bool((p[p.shape[0] - p.pad_length:] == 0).all())
            for p in gtp.parameters()
            if getattr(p, "pad_length", 0) and p.group.rank() == p.group.size() - 1
        )
        dist.barrier()
    finally:
        parallel_state.destroy_model_parallel()
    return out
