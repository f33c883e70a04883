"""Colocated Megatron generation must not generate on a GTP-sharded training model.

Bug (NeMo-RL 7ea279ab): ``dedicated_inference_megatron_cfg`` in
``nemo_rl/models/generation/megatron/config.py`` decides whether colocated Megatron
generation may run on the training model itself. It compares TP, PP, EP, expert TP, CP and
``transformer_impl``, but not the GTP weight-shard counts, so a TP1 training model whose
weights are split over two ranks (``tensor_parallel_num_weight_shards=2``) matches the TP1
inference layout: it returns None, no dedicated inference model is built, no refit happens,
and generation runs on GTP-sharded weights without a word.

How: call the real function from the NeMo-RL tree on PYTHONPATH (CPU only, no model) with
small policy configs. Pristine returns None for TP1 x 2 weight shards (and for expert GTP);
patched returns a dedicated config whose shard counts are pinned to its TP degrees, while
null and an explicit TP-equal shard count keep sharing the training model.
"""

from __future__ import annotations

import os

import pytest

# What this proof fails with on the pristine base (tools' prove checks it): generation shares the GTP-sharded training model.
PRISTINE_FAILS = r"shares its (expert-)?GTP-sharded model with generation|shares the GTP-sharded model|^AssertionError: assert None is not None"

_UNSET = object()


def _dedicated_inference_megatron_cfg():
    tree = os.environ.get("CARRY_TREE_NEMO_RL")
    if not tree or not os.path.isdir(os.path.join(tree, "nemo_rl")):
        pytest.skip("no NeMo-RL tree: run tools/prove.py with --source nemo-rl=PATH "
                    "(it sets CARRY_TREE_NEMO_RL and puts the tree on PYTHONPATH)")
    try:
        from nemo_rl.models.generation.megatron.config import dedicated_inference_megatron_cfg
    except ImportError as exc:
        if (exc.name or "").split(".")[0] == "nemo_rl":
            pytest.skip(f"nemo_rl is not importable from PYTHONPATH ({exc}); put the tree "
                        f"CARRY_TREE_NEMO_RL={tree} on PYTHONPATH (tools/prove.py --source nemo-rl=PATH)")
        pytest.skip(f"NeMo-RL's import-time dependency {exc.name!r} is missing ({exc}); "
                    "install the packages NeMo-RL needs to import its generation config")
    return dedicated_inference_megatron_cfg


def _policy_config(tp=1, shards=_UNSET, etp=1, expert_shards=_UNSET):
    megatron_cfg = {
        "tensor_model_parallel_size": tp,
        "pipeline_model_parallel_size": 1,
        "expert_model_parallel_size": 1,
        "expert_tensor_parallel_size": etp,
        "context_parallel_size": 1,
        "sequence_parallel": False,
    }
    if shards is not _UNSET:
        megatron_cfg["tensor_parallel_num_weight_shards"] = shards
    if expert_shards is not _UNSET:
        megatron_cfg["expert_tensor_parallel_num_weight_shards"] = expert_shards
    return {
        "megatron_cfg": megatron_cfg,
        "generation": {"backend": "megatron", "colocated": {"enabled": True},
                       "mcore_generation_config": {}},
    }


def test_gtp_sharded_training_gets_a_gtp_free_dedicated_model():
    dedicated = _dedicated_inference_megatron_cfg()
    inference = dedicated(_policy_config(tp=1, shards=2))
    assert inference is not None, (
        "TP1 training with tensor_parallel_num_weight_shards=2 shares its GTP-sharded model "
        "with generation: no dedicated inference model, no refit")
    assert inference["tensor_model_parallel_size"] == 1
    assert inference["tensor_parallel_num_weight_shards"] == 1


def test_expert_gtp_sharded_training_gets_a_dedicated_model():
    dedicated = _dedicated_inference_megatron_cfg()
    inference = dedicated(_policy_config(etp=1, expert_shards=2))
    assert inference is not None, (
        "expert_tensor_parallel_num_weight_shards=2 over ETP1 shares the GTP-sharded model")
    assert inference["expert_tensor_parallel_num_weight_shards"] == 1


@pytest.mark.parametrize("tp, shards", [(1, _UNSET), (1, None), (1, 1), (2, None), (2, 2)])
def test_unsharded_training_keeps_sharing_the_model(tp, shards):
    dedicated = _dedicated_inference_megatron_cfg()
    assert dedicated(_policy_config(tp=tp, shards=shards)) is None


@pytest.mark.parametrize("etp, expert_shards", [(1, 2), (2, 4), (1, 4)])
def test_a_differing_expert_shard_count_is_a_different_layout(etp, expert_shards):
    """Expert GTP alone (the dense axis unsharded) is a GTP-sharded layout: the inference model is
    dedicated, its expert shard count pinned to its expert TP degree, the dense one untouched."""
    dedicated = _dedicated_inference_megatron_cfg()
    inference = dedicated(_policy_config(tp=1, shards=None, etp=etp, expert_shards=expert_shards))
    assert inference is not None, (
        f"ETP{etp} training with expert_tensor_parallel_num_weight_shards={expert_shards} shares its "
        "expert-GTP-sharded model with generation: no dedicated inference model, no refit")
    assert inference["expert_tensor_parallel_size"] == etp
    assert inference["expert_tensor_parallel_num_weight_shards"] == etp
    assert inference["tensor_parallel_num_weight_shards"] == 1


def test_both_axes_sharded_get_a_gtp_free_dedicated_model():
    dedicated = _dedicated_inference_megatron_cfg()
    inference = dedicated(_policy_config(tp=1, shards=2, etp=1, expert_shards=2))
    assert inference is not None
    assert (inference["tensor_parallel_num_weight_shards"], inference["expert_tensor_parallel_num_weight_shards"]) == (1, 1)


@pytest.mark.parametrize("etp, expert_shards", [(1, _UNSET), (1, None), (1, 1), (2, None), (2, 2)])
def test_unsharded_experts_keep_sharing_the_model(etp, expert_shards):
    """Null and an explicit shard count equal to the expert TP degree are the same unsharded layout."""
    dedicated = _dedicated_inference_megatron_cfg()
    assert dedicated(_policy_config(tp=1, shards=None, etp=etp, expert_shards=expert_shards)) is None
