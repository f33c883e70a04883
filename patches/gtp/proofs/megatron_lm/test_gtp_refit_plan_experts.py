"""Megatron-core's refit moves expert GTP shards into a whole-weight MoE model, and back.

The planner bug of test_gtp_refit_plan.py on the expert axis: with ``expert_gtp_remat_size``
> 1 every routed expert's weights are GTP shards, dim-0 slices of the expert-TP-local weight,
and the planner (``resharding/planner.py``) takes their shape for the whole TP-local one.
Issue 23's first look, pristine 0.19.2 with TE on one H200 (TEGroupedMLP, expert GTP only):
"Cannot build TP descriptor for decoder.layers.0.mlp.experts.linear_fc1.weight0 dim0:
src_world*src_local=1*128 != 1*256". Measured here on the CPU, the series without this patch
(0001-0007), expert GTP only: the local spec's SequentialMLP meets the same check, "Cannot build
TP descriptor for decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight dim0:
src_world*src_local=1*64 != 1*128", both directions. On the pristine base the whole-weight model
comes out GTP-sharded first (mlm-pg-collection, mlm-inference-pg), as in test_gtp_refit_plan.py.

How (``_layouts.run_refit`` with ``expert_gtp``): two gloo ranks on CPU, the local spec, a small
untied MoE GPT (4 routed experts, top-2, SwiGLU experts, QKV bias), values moved off their
initial ones, and a whole-weight model on ``build_inference_pg_collection`` as NeMo-RL builds
its dedicated inference model; ``prepare_swap_model_weights`` + ``swap_model_weights`` both
ways. Every tensor must be exact, expert shards included, padding rows never written. Arms:
both axes at 2, both with alignment padding (ffn 200), and the expert axis alone (dense GTP
off: only expert weights are GTP shards, so the planner meets an expert first). The TE form:
test_te_grouped_experts.py.
"""

from __future__ import annotations

import pytest
from _layouts import run_refit
from _world import spawn

# What this proof fails with on the pristine base (tools' prove checks it): the planner reads a GTP shard as the TP-local tensor.
PRISTINE_FAILS = r"Cannot build TP descriptor for .* dim0"


@pytest.mark.parametrize(
    "ffn,gtp_size",
    [(64, 2), (200, 2), (64, 1)],
    ids=["both-axes", "both-axes-padding", "experts-only"],
)
def test_refit_expert_gtp_shards_and_whole_weights(ffn, gtp_size):
    results = spawn(run_refit, 2, ffn, gtp_size, 2)
    for rank, res in enumerate(results):
        assert res["expert shards"] > 0, f"rank {rank}: no expert weight is GTP-sharded"
        assert res["whole shards"] == 0, f"rank {rank}: the whole-weight model is GTP-sharded"
        assert any(".experts." in n for n in res["padded"]) == (ffn == 200), \
            f"rank {rank}: padded weights {res['padded']}"
        assert res["differs before"] > 0, f"rank {rank}: the models agreed before the refit"
        assert res["gtp->whole"] == [], f"rank {rank}, GTP -> whole weights: {res['gtp->whole']}"
        assert res["whole->gtp"] == [], f"rank {rank}, whole weights -> GTP: {res['whole->gtp']}"
        assert res["padding zero"], f"rank {rank}: the refit wrote into GTP padding rows"
