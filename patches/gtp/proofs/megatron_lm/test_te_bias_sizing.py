"""The TE linear wrappers give GTP-sharded layers GEMM biases of their logical length.

Bug (megatron-core 0.19.2, megatron-lm patch 0004): under GTP the TE wrappers hand TE a
pre-sharded ``out_features`` so that it allocates only this rank's weight shard, and TE sizes
the GEMM biases from the same number. GTP shards weights only; a bias is replicated and is
added to the output of the GEMM on the gathered weight, so it comes out 1/gtp_remat too
short: ``TEColumnParallelLinear(64 -> 192, bias=True)`` at gtp_remat 2 has weight (96, 64)
and bias (96,) where (192,) is right.

How: two processes on one GPU joined with gloo, ``initialize_model_parallel`` with tp 1 and
gtp_remat 2 (dense and expert). Build TEColumnParallelLinear 64->192 and 64->80 (GTP pads 80
rows to 96, so each rank holds 48), TERowParallelLinear 192->64, TELayerNormColumnParallelLinear
64->192 and TEColumnParallelGroupedLinear 2 x 64->192, all with bias. Every GEMM bias must
have the logical length (``bias`` or ``bias0``/``bias1``), keep the attributes TE and Megatron
set on it, and ``layer_norm_bias`` must stay at the input width; pristine fails here, listing
each short bias. Then each dense layer runs forward and backward against a reference made
from its all-gathered weight: the whole bias must be applied and its gradient must be the
column sum of the output gradient. The grouped layer is only constructed: its forward would
gather the expert weights with a coalesced collective, which gloo is not relied on for here.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _te_gpt import GPU_ONLY
from _world import spawn

# What this proof fails with on the pristine base (tools' prove checks it): TE sizes the biases from the pre-sharded out_features (GPU).
PRISTINE_FAILS = r"^AssertionError: GEMM biases not at their logical length under GTP"

pytestmark = GPU_ONLY

GTP = 2
HIDDEN = 64
WIDE = 192
PADDED = 80  # not a multiple of pad_for_alignment (16) * GTP, so GTP pads it to 96
SEQ, BATCH = 8, 2
TOL = dict(atol=1e-3, rtol=1e-3)  # fp32; leaves room for TF32 GEMMs, a wrong bias is off by O(1)


def _full_weight(weight):
    """All-gather a GTP shard over its group on CPU and strip GTP's tail padding."""
    shard = weight.detach().float().cpu().contiguous()
    parts = [torch.empty_like(shard) for _ in range(weight.group.size())]
    dist.all_gather(parts, shard, group=weight.group)
    full = torch.cat(parts)
    return full[: full.shape[0] - weight.pad_length].cuda()


def _check_dense(name, layer, bias_size, config, rank, *, layernorm=False, returns_bias=False):
    from megatron.core.tensor_parallel.gtp_api import classify_gtp_remat_chains

    # One module, one GTP prefetch chain: start it afresh as training does before its first step.
    classify_gtp_remat_chains(layer)
    with torch.no_grad():
        layer.bias.copy_(torch.randn(bias_size, generator=torch.Generator().manual_seed(7)))
    weight = layer.weight
    full = _full_weight(weight)
    assert full.shape == (bias_size, layer.in_features), (name, tuple(full.shape))
    weight.main_grad = torch.zeros(weight.shape, dtype=weight.dtype, device=weight.device)

    gen = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(SEQ, BATCH, layer.in_features, generator=gen).cuda().requires_grad_()
    out, out_bias = layer(x)
    if returns_bias:
        assert out_bias is not None and tuple(out_bias.shape) == (bias_size,), (
            f"{name}: returned bias {None if out_bias is None else tuple(out_bias.shape)}"
        )
        y = out + out_bias
    else:
        assert out_bias is None, f"{name}: bias was returned although skip_bias_add=False"
        y = out

    inp = x.detach()
    if layernorm:
        inp = F.layer_norm(
            inp,
            (layer.in_features,),
            layer.layer_norm_weight.detach(),
            layer.layer_norm_bias.detach(),
            config.layernorm_epsilon,
        )
    expected = inp @ full.t() + layer.bias.detach()
    torch.testing.assert_close(y.detach(), expected, **TOL, msg=lambda m: f"{name} forward: {m}")

    y.sum().backward()
    assert layer.bias.grad is not None, f"{name}: the bias got no gradient"
    torch.testing.assert_close(
        layer.bias.grad,
        torch.full((bias_size,), float(SEQ * BATCH), device=layer.bias.device),
        **TOL,
        msg=lambda m: f"{name} bias gradient: {m}",
    )
    assert torch.isfinite(weight.main_grad).all(), f"{name}: non-finite weight gradient"


def _layers(rank, world_size):
    torch.cuda.set_device(0)
    from megatron.core import parallel_state
    from megatron.core.extensions.transformer_engine import (
        TEColumnParallelGroupedLinear,
        TEColumnParallelLinear,
        TELayerNormColumnParallelLinear,
        TERowParallelLinear,
    )
    from megatron.core.tensor_parallel.gtp_api import HAVE_GTP, is_gtp_param
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.transformer_config import TransformerConfig

    assert HAVE_GTP, "megatron-core reports HAVE_GTP False: GTP needs TransformerEngine >= 2.19"
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=1, gtp_remat_size=GTP, expert_gtp_remat_size=GTP
    )
    try:
        model_parallel_cuda_manual_seed(1234)
        config = TransformerConfig(
            num_layers=1,
            hidden_size=HIDDEN,
            num_attention_heads=4,
            add_bias_linear=True,
            params_dtype=torch.float32,
            tensor_parallel_num_weight_shards=GTP,
        )
        common = dict(config=config, init_method=config.init_method, bias=True, is_expert=False)
        column = TEColumnParallelLinear(
            HIDDEN, WIDE, gather_output=False, skip_bias_add=False, **common
        )
        padded = TEColumnParallelLinear(
            HIDDEN, PADDED, gather_output=False, skip_bias_add=False, **common
        )
        row = TERowParallelLinear(
            WIDE, HIDDEN, input_is_parallel=True, skip_bias_add=True, **common
        )
        ln_column = TELayerNormColumnParallelLinear(
            HIDDEN, WIDE, gather_output=False, skip_bias_add=False, **common
        )
        grouped = TEColumnParallelGroupedLinear(
            2,
            HIDDEN,
            WIDE,
            config=config,
            init_method=config.init_method,
            bias=True,
            skip_bias_add=False,
            is_expert=True,
        )

        # Preconditions: the layers really are GTP-sharded, and the padded case is padded.
        for name, module, weight_names in (
            ("column", column, ["weight"]),
            ("padded column", padded, ["weight"]),
            ("row", row, ["weight"]),
            ("layernorm column", ln_column, ["weight"]),
            ("grouped", grouped, ["weight0", "weight1"]),
        ):
            for wname in weight_names:
                assert is_gtp_param(getattr(module, wname)), f"{name}.{wname} is not GTP-sharded"
        assert tuple(column.weight.shape) == (WIDE // GTP, HIDDEN), tuple(column.weight.shape)
        assert padded.weight.pad_length > 0, "the padded case is not padded"

        # The bug: every GEMM bias must have the logical (GTP-replicated) length.
        expected = [
            ("column", column, "bias", WIDE),
            ("padded column", padded, "bias", PADDED),
            ("row", row, "bias", HIDDEN),
            ("layernorm column", ln_column, "bias", WIDE),
            ("grouped", grouped, "bias0", WIDE),
            ("grouped", grouped, "bias1", WIDE),
        ]
        short = [
            f"{name}.{bname}: {tuple(getattr(m, bname).shape)}, expected ({size},) "
            f"(weight shard {tuple(getattr(m, 'weight' + bname[4:]).shape)})"
            for name, m, bname, size in expected
            if tuple(getattr(m, bname).shape) != (size,)
        ]
        assert not short, "GEMM biases not at their logical length under GTP:\n" + "\n".join(short)

        # The re-allocated biases are real, zero-initialised parameters of the module, with the
        # attributes TE (TP layout, sequence_parallel) and Megatron (allreduce) put on them.
        for name, m, bname, _ in expected:
            b = getattr(m, bname)
            assert dict(m.named_parameters())[bname] is b, f"{name}.{bname} is not registered"
            assert isinstance(b, torch.nn.Parameter) and b.requires_grad, f"{name}.{bname}"
            assert b.dtype == torch.float32 and b.is_cuda, f"{name}.{bname}: {b.dtype} {b.device}"
            assert not b.detach().any(), f"{name}.{bname} is not zero-initialised"
            # Megatron flags every parameter of the TELinear family allreduce=True after init;
            # LayerNormLinear's normal init path sets no such flag on anything. The resized bias
            # must carry whatever its weight carries.
            weight_flag = getattr(getattr(m, "weight" + bname[4:]), "allreduce", None)
            assert getattr(b, "allreduce", None) == weight_flag, f"{name}.{bname}: allreduce flag lost"
            assert not is_gtp_param(b), f"{name}.{bname} must stay replicated"
        for name, m in (("column", column), ("padded", padded), ("layernorm column", ln_column)):
            assert getattr(m.bias, "tensor_model_parallel", None) is True, f"{name}.bias TP flag"
            assert getattr(m.bias, "partition_dim", None) == 0, f"{name}.bias partition_dim"
        assert getattr(row.bias, "sequence_parallel", None) is False, "row.bias sequence_parallel"
        for i in range(2):
            b = getattr(grouped, f"bias{i}")
            assert getattr(b, "tensor_model_parallel", None) is True, f"grouped.bias{i} TP flag"
        assert tuple(ln_column.layer_norm_bias.shape) == (HIDDEN,), "layer_norm_bias changed"
        assert tuple(ln_column.layer_norm_weight.shape) == (HIDDEN,), "layer_norm_weight changed"

        _check_dense("column", column, WIDE, config, rank)
        _check_dense("padded column", padded, PADDED, config, rank)
        _check_dense("row", row, HIDDEN, config, rank, returns_bias=True)
        _check_dense("layernorm column", ln_column, WIDE, config, rank, layernorm=True)
        torch.cuda.synchronize()
    finally:
        parallel_state.destroy_model_parallel()


def test_te_layers_get_logical_length_biases_under_gtp():
    spawn(_layers, 2)
