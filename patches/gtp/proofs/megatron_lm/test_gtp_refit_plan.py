"""Megatron-core's refit moves GTP weight-remat shards into a whole-weight model, and back.

Bug (megatron-core 0.19.2): the resharding planner (``resharding/planner.py``,
``_build_descriptors_for_param``) reads a parameter's shape as its TP-local shape. A GTP shard
is a dim-0 slice of that: the planner's size check refuses it. Seen on two H200s in NeMo-RL's
GRPO run, at the first refit into the dedicated inference model (``refit.py
prepare_swap_model_weights``, from NeMo-RL's ``_reshard_into_inference_model``):
"Cannot build TP descriptor for embedding.word_embeddings.weight dim0: src_world*src_local=
1*512 != 1*1024". Megatron-LM main of 2026-08-22 has nothing GTP-aware in ``resharding/``.

How: two gloo ranks on CPU. A GPT model with SwiGLU, QKV bias and tied embeddings, TP 1 x
gtp_remat 2, its values moved off their initial ones, and a whole-weight model built the way
NeMo-RL builds its dedicated inference model (``build_inference_pg_collection``, no GTP axis).
Then the calls NeMo-RL makes: ``prepare_swap_model_weights`` and ``swap_model_weights`` (gloo
copy service; on a CPU its CUDA streams are inert, ``_cpu.allow_refit_without_cuda``). Every
whole-weight tensor must equal the gathered GTP weight exactly, on both
ranks. Twice: without padding (every GTP weight divides evenly) and with GTP's default
alignment padding (ffn 200: the fused fc1's 400 rows padded to 416, padding never sent). The
reverse direction (whole weights into GTP shards) is checked too: every shard must get its
rows, its padding rows untouched. A model that shards a weight over TP and GTP at once is
refused with a message naming the parameter (planned from metadata alone, no ranks).
"""

from __future__ import annotations

import pytest
import torch
from _layouts import run_refit
from _world import spawn

# What this proof fails with on the pristine base (tools' prove checks it): the planner reads a GTP shard as the TP-local tensor.
PRISTINE_FAILS = {
    "test_refit_between_gtp_shards_and_whole_weights": r"Cannot build TP descriptor for .* dim0",
    # Refusing TP and GTP at once is what the patch adds (its metadata field gtp_group_ranks): no proof
    # of the bug, it must pass patched.
    "test_tp_and_gtp_at_once_is_refused_by_name": None,
}


@pytest.mark.parametrize("ffn", [64, 200], ids=["no-padding", "alignment-padding"])
def test_refit_between_gtp_shards_and_whole_weights(ffn):
    results = spawn(run_refit, 2, ffn)
    for rank, res in enumerate(results):
        assert res["gtp shards"] > 0, f"rank {rank}: the GTP model has no GTP shards"
        assert res["whole shards"] == 0, f"rank {rank}: the whole-weight model is GTP-sharded"
        assert bool(res["padded"]) == (ffn == 200), f"rank {rank}: padded weights {res['padded']}"
        assert res["differs before"] > 0, f"rank {rank}: the models agreed before the refit"
        assert res["gtp->whole"] == [], f"rank {rank}, GTP -> whole weights: {res['gtp->whole']}"
        assert res["whole->gtp"] == [], f"rank {rank}, whole weights -> GTP: {res['whole->gtp']}"
        assert res["padding zero"], f"rank {rank}: the refit wrote into GTP padding rows"


def _meta(name, rank, shape, **kw):
    from megatron.core.resharding.utils import ParameterMetadata

    return ParameterMetadata(name=name, shape=shape, dtype=torch.bfloat16, element_size=2,
                             owner_rank=rank, resolved_name=name, **kw)


def test_tp_and_gtp_at_once_is_refused_by_name():
    """TP 2 x gtp 2 on four ranks into a TP 1 model: not planned, and the message says why."""
    from megatron.core.resharding.planner import build_plan_from_rosters

    name = "decoder.layers.0.mlp.linear_fc1.weight"
    tp = {0: [0, 2], 1: [1, 3], 2: [0, 2], 3: [1, 3]}
    gtp = {0: [0, 1], 1: [0, 1], 2: [2, 3], 3: [2, 3]}
    src = {name: [_meta(name, r, (64, 32), is_tp=True, tensor_parallel_group_ranks=tp[r],
                        gtp_group_ranks=gtp[r], data_parallel_group_ranks=gtp[r]) for r in range(4)]}
    dst = {r: {name: _meta(name, r, (256, 32), is_tp=True, tensor_parallel_group_ranks=[r],
                           data_parallel_group_ranks=[0, 1, 2, 3])} for r in range(4)}
    with pytest.raises(NotImplementedError, match=r"linear_fc1.*tensor parallelism.*GTP"):
        build_plan_from_rosters(dst, src, my_global_rank=0)
