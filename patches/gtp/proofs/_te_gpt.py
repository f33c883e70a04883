"""A tiny TransformerEngine GPT built twice, with GTP off and on, for the series' GPU proofs.

``GPU_ONLY`` is the skip marking every such proof carries: it needs a CUDA GPU and
TransformerEngine (>= 2.19 is asserted inside the ranks through megatron-core's HAVE_GTP, so
an old TE is a failure, not a skip; ``assert_gtp_at_its_defaults`` does it, with GTP's config).
``model_parallel(gtp)`` is one phase of a proof: megatron-core's model-parallel state at TP 1
(GTP off, or GTP with ``gtp_remat_size`` gtp), the CUDA RNG seeded alike for both phases, torn
down afterwards. ``fixed_tokens`` gives every proof its inputs from one seed. ``build`` makes
the GPTModel on the current device the way megatron.training's get_model does, and
``build_qwen_like`` the Qwen2.5 shape in small with it (``build_moe_like``: Qwen3-MoE's, grouped experts with
expert GTP); ``load_gtp_off_params`` gives each GTP
shard its rows of the GTP-off model's weight (the padded full weight) and every other parameter
all of it, collecting every parameter whose size does not fit instead of stopping at the first.
"""

from __future__ import annotations

import contextlib
import importlib.util

import pytest
import torch
import torch.nn.functional as F

GPU_ONLY = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (TE GPT under GTP)"),
    pytest.mark.skipif(
        importlib.util.find_spec("transformer_engine") is None,
        reason="needs TransformerEngine >= 2.19 (megatron-core's GTP is built on it)",
    ),
]


def assert_gtp_at_its_defaults() -> None:
    """In a rank: megatron-core has GTP, and GTP's config is what NeMo-RL and Bridge run (weight
    prefetch and asynchronous reduce-scatter on). Asserted, never set."""
    from megatron.core.tensor_parallel.generalized_tensor_parallelism import GTP_CONFIG
    from megatron.core.tensor_parallel.gtp_api import HAVE_GTP

    assert HAVE_GTP, "megatron-core reports HAVE_GTP False: GTP needs TransformerEngine >= 2.19"
    assert GTP_CONFIG.weight_prefetch and GTP_CONFIG.async_reduction, f"GTP defaults changed: {GTP_CONFIG}"


@contextlib.contextmanager
def model_parallel(gtp: int, seed: int = 1234, expert_gtp: int = 1):
    """In a rank: TP 1 with GTP off (gtp 1) or gtp_remat_size gtp (and expert_gtp_remat_size
    expert_gtp), the CUDA RNG seeded; destroyed after."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    sizes = {"gtp_remat_size": gtp} if gtp > 1 else {}
    if expert_gtp > 1:
        sizes["expert_gtp_remat_size"] = expert_gtp
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, **sizes)
    try:
        model_parallel_cuda_manual_seed(seed)
        yield
    finally:
        parallel_state.destroy_model_parallel()


def fixed_tokens(vocab: int, batch: int, seq: int, count: int = 1):
    """``count`` token batches drawn from seed 0, and their positions, on the current device."""
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, vocab, (batch, seq), generator=gen).cuda() for _ in range(count)]
    positions = torch.arange(seq).unsqueeze(0).expand(batch, seq).contiguous().cuda()
    return batches, positions


def build(gtp: int, *, vocab: int, seq: int, tied: bool, position: str = "learned_absolute",
          pg_collection=None, **config):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    config.setdefault("params_dtype", torch.float32)
    experts = config.get("num_moe_experts")
    spec = (get_gpt_layer_with_transformer_engine_spec(num_experts=experts, moe_grouped_gemm=True)
            if experts else get_gpt_layer_with_transformer_engine_spec())
    model = GPTModel(
        config=TransformerConfig(
            hidden_dropout=0.0, attention_dropout=0.0, tensor_parallel_num_weight_shards=gtp, **config
        ),
        transformer_layer_spec=spec,
        **({"pg_collection": pg_collection} if pg_collection is not None else {}),
        vocab_size=vocab,
        max_sequence_length=seq,
        share_embeddings_and_output_weights=tied,
        position_embedding_type=position,
    )
    # As megatron.training's get_model does; the learned position embedding starts on the CPU.
    return model.cuda(torch.cuda.current_device())


def build_qwen_like(gtp: int, *, vocab: int, seq: int, hidden: int, ffn: int, qkv_bias: bool):
    """Qwen2.5's shape in small: tied embeddings, rope, RMSNorm, SwiGLU, GQA (4 heads, 2 groups), fp32."""
    return build(gtp, vocab=vocab, seq=seq, tied=True, position="rope", num_layers=2,
                 hidden_size=hidden, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=ffn,
                 normalization="RMSNorm", gated_linear_unit=True, activation_func=F.silu,
                 add_bias_linear=False, add_qkv_bias=qkv_bias)


def build_moe_like(gtp: int, expert_gtp: int, *, vocab: int, seq: int, hidden: int, ffn: int, pg_collection=None):
    """Qwen3-MoE's layout in small: untied, rope, RMSNorm, GQA, QKV bias, every MLP 4 routed SwiGLU
    experts (top-2) on TE's grouped GEMM (TEGroupedMLP), their weights over expert_gtp shards."""
    return build(gtp, vocab=vocab, seq=seq, tied=False, position="rope", num_layers=2,
                 hidden_size=hidden, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=ffn,
                 normalization="RMSNorm", gated_linear_unit=True, activation_func=F.silu,
                 add_bias_linear=False, add_qkv_bias=True, num_moe_experts=4, moe_router_topk=2,
                 moe_ffn_hidden_size=ffn, moe_grouped_gemm=True, moe_token_dispatcher_type="alltoall",
                 expert_tensor_parallel_num_weight_shards=expert_gtp, pg_collection=pg_collection)


def gtp_rows(param, full: torch.Tensor) -> torch.Tensor:
    """This rank's rows of ``full`` for the GTP shard ``param`` (full padded like GTP pads it)."""
    rows, rank = param.shape[0], param.group.rank()
    return F.pad(full, (0, 0, 0, param.pad_length))[rank * rows : (rank + 1) * rows]


def load_gtp_off_params(model, full_params: dict) -> None:
    from megatron.core.tensor_parallel.gtp_api import is_gtp_param

    params = dict(model.named_parameters())
    assert params.keys() == full_params.keys(), sorted(set(params) ^ set(full_params))
    misfits = []
    with torch.no_grad():
        for name, param in params.items():
            full = full_params[name]
            if is_gtp_param(param):
                ranks = param.group.size()
                if (param.shape[0] * ranks - param.pad_length, *param.shape[1:]) != tuple(full.shape):
                    misfits.append(
                        f"{name}: GTP shard {tuple(param.shape)} x {ranks} (pad "
                        f"{param.pad_length}) does not tile the GTP-off {tuple(full.shape)}"
                    )
                    continue
                param.copy_(gtp_rows(param, full))
            elif param.shape != full.shape:
                misfits.append(f"{name}: {tuple(param.shape)} with GTP, {tuple(full.shape)} without")
            else:
                param.copy_(full)
    assert not misfits, "parameters sized differently under GTP:\n" + "\n".join(misfits)
