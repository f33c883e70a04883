"""A model built on build_inference_pg_collection() holds whole, unsharded weights.

Bug (megatron-core 0.19.2): ``megatron.core.inference.shards.build_inference_pg_collection``
leaves ``gtp_remat``, ``expt_gtp_remat``, ``dp_cp_gtp_remat``, ``expt_dp_gtp_remat`` and
``tp_ep_pp_with_egtp_remat`` unset, and the layers look the GTP group up in the global MPU
state anyway. When training initialised MPU with gtp_remat_size > 1, a dedicated inference
model built on that collection comes out GTP-sharded along the training layout, although
inference expects whole weights (and refit fills it as such).

How: two gloo ranks on CPU, MPU initialised with gtp_remat_size=2 and expert_gtp_remat_size=2
(as training would), then ``build_inference_pg_collection(world_size=2)`` and a small GPTModel
(local layer spec, one dense and one MoE layer with routed and shared experts, untied output
layer) on that collection. No parameter anywhere may be GTP-sharded, and the collection's
GTP-inclusive data groups must be the plain ones (no GTP axis at inference).
"""

from __future__ import annotations

import torch.distributed as dist
from _cpu import allow_gtp_shards_without_cuda
from _world import spawn

from megatron.core import parallel_state
from megatron.core.inference.shards import build_inference_pg_collection
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.transformer.transformer_config import TransformerConfig

# What this proof fails with on the pristine base (tools' prove checks it): the inference collection leaves the GTP axes unset.
PRISTINE_FAILS = r"^AssertionError: the inference model built on build_inference_pg_collection\(\) is GTP-sharded"

VOCAB, HIDDEN = 512, 128


def _inference_model_is_unsharded(rank, world_size):
    allow_gtp_shards_without_cuda()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=1, gtp_remat_size=2, expert_gtp_remat_size=2
    )

    pgs = build_inference_pg_collection(world_size)

    config = TransformerConfig(
        num_layers=2,
        hidden_size=HIDDEN,
        num_attention_heads=4,
        ffn_hidden_size=2 * HIDDEN,
        add_bias_linear=False,
        num_moe_experts=2,
        moe_layer_freq=[0, 1],
        moe_ffn_hidden_size=HIDDEN,
        moe_shared_expert_intermediate_size=HIDDEN,
        moe_router_topk=1,
        moe_router_pre_softmax=True,
        use_cpu_initialization=True,
    )
    model = GPTModel(
        config,
        get_gpt_decoder_block_spec(config, use_transformer_engine=False),
        vocab_size=VOCAB,
        max_sequence_length=64,
        share_embeddings_and_output_weights=False,
        pg_collection=pgs,
    )

    names = [n for n, _ in model.named_parameters()]
    # The model really has every kind of linear the check is meant to cover.
    for part in ("linear_qkv", "linear_proj", "mlp.linear_fc1", "local_experts.1.linear_fc2",
                 "shared_experts.linear_fc1", "output_layer", "word_embeddings"):
        assert any(part in n for n in names), f"test model lacks {part}"

    sharded = {
        n: tuple(p.shape)
        for n, p in model.named_parameters()
        if getattr(p, "is_gtp_weight_remat", False)
    }
    assert not sharded, (
        "the inference model built on build_inference_pg_collection() is GTP-sharded along the "
        f"training's MPU layout (gtp_remat_size=2): {sharded}"
    )
    assert tuple(model.embedding.word_embeddings.weight.shape) == (VOCAB, HIDDEN)
    assert tuple(model.output_layer.weight.shape) == (VOCAB, HIDDEN)

    ranks = dist.get_process_group_ranks
    for inclusive, plain in (
        ("dp_cp_gtp_remat", "dp_cp"),
        ("expt_dp_gtp_remat", "expt_dp"),
        ("tp_ep_pp_with_egtp_remat", "tp_ep_pp"),
    ):
        group = getattr(pgs, inclusive)
        assert group is not None, f"build_inference_pg_collection() leaves {inclusive} unset"
        assert ranks(group) == ranks(getattr(pgs, plain)), f"{inclusive} differs from {plain}"


def test_inference_model_is_unsharded():
    spawn(_inference_model_is_unsharded, 2)
