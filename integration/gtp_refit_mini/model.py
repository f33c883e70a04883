"""The models of the mini test: a Qwen2-shaped GPT on TransformerEngine, with or without GTP.

The shape is Qwen2.5's in small: TE layer spec, RMSNorm, SwiGLU, rotary positions, QKV biases,
grouped-query attention, tied embeddings. ``gtp`` is the number of weight shards per TP rank
(``tensor_parallel_num_weight_shards`` with TP 1); 1 builds the whole-weight model. With
``s.experts`` every MLP is a mixture of experts instead (Qwen3-MoE's layout in small: routed
SwiGLU experts, top-``s.topk``, TE's grouped GEMM, usually untied), whose weights GTP shards over
``expert_gtp`` (``expert_tensor_parallel_num_weight_shards`` with expert TP 1).
"""

from __future__ import annotations

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def model_config(s, gtp: int, expert_gtp: int = 1):
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    dtype = DTYPES[s.dtype]
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
        # TE refuses fp32 activations against bf16 weights outside autocast: bf16 all the way.
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        tensor_parallel_num_weight_shards=gtp,
        **_moe_config(s, expert_gtp),
    )


def _moe_config(s, expert_gtp: int) -> dict:
    if not s.experts:
        return {}
    return {
        "num_moe_experts": s.experts,
        "moe_router_topk": s.topk,
        "moe_ffn_hidden_size": s.moe_ffn or s.ffn,
        "moe_grouped_gemm": True,
        "moe_token_dispatcher_type": "alltoall",
        "expert_tensor_parallel_num_weight_shards": expert_gtp,
    }


def build_gpt(s, config, pg_collection=None):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    from megatron.core.models.gpt.gpt_model import GPTModel

    kwargs = {} if pg_collection is None else {"pg_collection": pg_collection}
    spec = (get_gpt_layer_with_transformer_engine_spec(num_experts=s.experts, moe_grouped_gemm=True)
            if s.experts else get_gpt_layer_with_transformer_engine_spec())
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=s.vocab,
        max_sequence_length=s.seq,
        share_embeddings_and_output_weights=s.tied,
        position_embedding_type="rope",
        rotary_base=1000000,
        **kwargs,
    )
    return model.cuda(torch.cuda.current_device())


def gtp_sharded(model) -> list[str]:
    from megatron.core.tensor_parallel.gtp_api import is_gtp_param

    return [n for n, p in model.named_parameters() if is_gtp_param(p)]


def expert_gtp_sharded(model) -> list[str]:
    """The routed experts' GTP-sharded weights (TEGroupedMLP's ``experts.linear_fc*.weight<i>``)."""
    return [n for n in gtp_sharded(model) if ".mlp.experts." in n]


def plain_copy(param) -> torch.Tensor:
    """The values of a (possibly GTP subclass) parameter as a plain tensor."""
    out = torch.empty(param.shape, dtype=param.dtype, device=param.device)
    out.copy_(param.detach())
    return out


# -- collectives (gloo gets CPU copies: it is only trusted with those here) ------------------
def for_comm(t: torch.Tensor, backend: str) -> torch.Tensor:
    return t.detach().cpu() if backend == "gloo" else t.detach().contiguous()


def all_gather_rows(t: torch.Tensor, group, backend: str) -> torch.Tensor:
    import torch.distributed as dist

    src = for_comm(t, backend)
    parts = [torch.empty_like(src) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, src, group=group)
    return torch.cat(parts, 0).to(t.device)


def all_reduce_sum(values: list[float], backend: str, group=None) -> list[float]:
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device="cpu" if backend == "gloo" else "cuda")
    dist.all_reduce(t, group=group)
    return t.tolist()


def whole_weights(model, backend: str) -> dict[str, torch.Tensor]:
    """Every parameter as a whole-weight model holds it: GTP shards gathered, padding cut."""
    from megatron.core.tensor_parallel.gtp_api import is_gtp_param

    out = {}
    for name, param in model.named_parameters():
        value = plain_copy(param)
        if is_gtp_param(param):
            value = all_gather_rows(value, param.group, backend)
            value = value[: value.shape[0] - param.pad_length]
        out[name] = value
    return out


def replicas_disagree(weights: dict[str, torch.Tensor], backend: str) -> list[str]:
    """The tensors of ``weights`` (whole, one dict per rank) that are not the same on every rank."""
    import torch.distributed as dist

    bad = []
    for name, value in weights.items():
        src = for_comm(value.contiguous(), backend)
        parts = [torch.empty_like(src) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, src)
        spread = max(float((p.float() - parts[0].float()).abs().max()) for p in parts)
        if spread:
            bad.append(f"{name}: max |diff| across ranks {spread:.4g}")
    return bad


def tensor_mismatches(expected: dict, got: dict) -> list[str]:
    bad = []
    for name, want in expected.items():
        have = got.get(name)
        if have is None or have.shape != want.shape:
            bad.append(f"{name}: shape {None if have is None else tuple(have.shape)}, not {tuple(want.shape)}")
        elif not torch.equal(have, want):
            bad.append(f"{name}: max |diff| {float((have.float() - want.float()).abs().max()):.4g}")
    return bad
