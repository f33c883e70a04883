"""A GTP run must stop early without GTP support, and its inference model must not be GTP-sharded.

Bug (NeMo-RL 7ea279ab): below TransformerEngine 2.19 megatron-core swallows its TE import
error and only sets ``gtp_api.HAVE_GTP = False``; NeMo-RL never looks, so a GTP config dies
much later with an unrelated error. And ``merged_inference_megatron_cfg``, the config of the
dedicated inference model that refit fills with whole (TP-sharded only) weights, inherits the
training's weight-shard counts, so that model would be GTP-sharded too.

How:
- call the real ``merged_inference_megatron_cfg`` from the NeMo-RL tree on PYTHONPATH (CPU,
  no model) with a TP1 x 2-weight-shard training config: the inference config must ask for one
  weight shard per (expert) TP rank; pristine passes the training's 2 through;
- read ``nemo_rl/models/megatron/setup.py`` of the tree under test: ``setup_model_and_optimizer``
  must call ``check_gtp_available`` before it initialises the process groups, and
  ``build_inference_model`` must refuse a GTP-sharded inference provider. (What
  ``check_gtp_available`` itself does is proven with the shim, proofs/nemo_rl/test_gtp_shim.py;
  running setup.py needs GPUs and the whole stack, which the nightly's functional test has.)
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

# What this proof fails with on the pristine base (tools' prove checks it): no preflight, and the inference config inherits the shard counts.
PRISTINE_FAILS = r"never calls check_gtp_available|does not check that the inference provider is GTP-free|inference model inherits the training's weight shards"


def _tree() -> Path:
    tree = os.environ.get("CARRY_TREE_NEMO_RL")
    if not tree or not os.path.isdir(os.path.join(tree, "nemo_rl")):
        pytest.skip("no NeMo-RL tree: run tools/prove.py (it sets CARRY_TREE_NEMO_RL)")
    return Path(tree)


def _merged_inference_megatron_cfg():
    _tree()
    try:
        from nemo_rl.models.generation.megatron.config import merged_inference_megatron_cfg
    except ImportError as exc:
        if (exc.name or "").split(".")[0] == "nemo_rl":
            raise
        pytest.skip(f"NeMo-RL's import-time dependency {exc.name!r} is missing ({exc}); tools/prove.py "
                    "builds an environment for it from proofs/nemo_rl/requirements.txt")
    return merged_inference_megatron_cfg


def _policy(tp=1, shards=2, etp=1, expert_shards=2):
    return {
        "megatron_cfg": {
            "tensor_model_parallel_size": tp, "tensor_parallel_num_weight_shards": shards,
            "expert_tensor_parallel_size": etp, "expert_tensor_parallel_num_weight_shards": expert_shards,
            "pipeline_model_parallel_size": 1, "expert_model_parallel_size": 1, "context_parallel_size": 1,
            "sequence_parallel": False,
        },
        "generation": {"backend": "megatron", "colocated": {"enabled": True}, "mcore_generation_config": {}},
    }


def test_inference_config_has_one_weight_shard_per_tp_rank():
    merged = _merged_inference_megatron_cfg()(_policy(tp=1, shards=2, etp=1, expert_shards=2))
    assert merged.get("tensor_parallel_num_weight_shards") == 1, (
        "the inference model inherits the training's weight shards: "
        f"tensor_parallel_num_weight_shards={merged.get('tensor_parallel_num_weight_shards')}")
    assert merged.get("expert_tensor_parallel_num_weight_shards") == 1
    wider = _merged_inference_megatron_cfg()(_policy(tp=2, shards=4, etp=2, expert_shards=4))
    assert (wider["tensor_parallel_num_weight_shards"], wider["expert_tensor_parallel_num_weight_shards"]) == (2, 2)


def test_inference_config_reads_no_size_the_policy_may_leave_out():
    """NeMo-RL treats expert_tensor_parallel_size as optional on the path that merges the inference
    config (MegatronGeneration.nvlink_domain_span reads it with .get(..., 1), for a non-colocated
    run's merged_inference_megatron_cfg): the pin must not make it required (a KeyError)."""
    policy = _policy(tp=1, shards=None, etp=1, expert_shards=None)
    for key in ("expert_tensor_parallel_size", "expert_tensor_parallel_num_weight_shards"):
        del policy["megatron_cfg"][key]
    merged = _merged_inference_megatron_cfg()(policy)
    assert merged.get("expert_tensor_parallel_num_weight_shards") is None, merged   # null: one per expert TP rank
    assert "expert_tensor_parallel_size" not in merged


def _function(name: str) -> ast.FunctionDef:
    path = _tree() / "nemo_rl/models/megatron/setup.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    pytest.fail(f"{path} has no function {name}")


def _first_line(fn: ast.FunctionDef, called: str) -> int | None:
    lines = [n.lineno for n in ast.walk(fn) if isinstance(n, ast.Call)
             and getattr(n.func, "id", getattr(n.func, "attr", None)) == called]
    return min(lines) if lines else None


def test_setup_checks_gtp_before_building_process_groups():
    fn = _function("setup_model_and_optimizer")
    check = _first_line(fn, "check_gtp_available")
    init = _first_line(fn, "initialize_megatron")
    assert init is not None, "setup_model_and_optimizer no longer calls initialize_megatron: revisit this proof"
    assert check is not None, "setup_model_and_optimizer never calls check_gtp_available"
    assert check < init, "check_gtp_available runs after the process groups are built"


def test_inference_model_refuses_gtp_sharding():
    fn = _function("build_inference_model")
    guarded = [n for n in ast.walk(fn) if isinstance(n, ast.Assert)
               and "gtp_weight_remat_size" in ast.unparse(n.test)]
    assert guarded, "build_inference_model does not check that the inference provider is GTP-free"
