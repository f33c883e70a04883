"""A GTP config must build GTP process groups of the configured size, through Megatron-Bridge.

Bug (NeMo-RL 7ea279ab + Megatron-Bridge 0.6.2): NeMo-RL has no way to ask for GTP, and
Bridge's ``initialize_megatron`` calls ``parallel_state.initialize_model_parallel`` without
``gtp_remat_size`` / ``expert_gtp_remat_size``, so a config with two weight shards would train
with GTP off, its GTP peers turned into data-parallel replicas, without a word. The patch adds
``nemo_rl/models/megatron/gtp.py``: ``gtp_remat_sizes`` (the sizes from the config keys, as
megatron-core resolves them), ``initialize_model_parallel_with_gtp`` (a shim around Bridge's
call that hands it the sizes) and ``check_gtp_available`` (a named error when megatron-core
has no GTP).

How: load that module from the NeMo-RL tree under test (CARRY_TREE_NEMO_RL) by its path,
without importing the rest of NeMo-RL, and run it against the real megatron-core on
PYTHONPATH (the megatron-lm tree): the call Bridge makes, through the module attribute and
without GTP sizes, on two gloo ranks, must build GTP groups of the requested size.

Where the pristine tree meets the bug: ``test_setup_hands_bridge_the_gtp_sizes`` reads
``setup_model_and_optimizer`` (``nemo_rl/models/megatron/setup.py``: running it needs GPUs and the
whole stack, and its module does not import on this Python), which must call Bridge's
``initialize_megatron`` inside the shim, given the sizes from the policy's config. Pristine calls it
bare: its body fails there, for the bug. The other tests need the module the patch adds; on the
pristine tree their fixture cannot load it, an error of setup that is no red (tools' prove).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import io
import os
import types
from pathlib import Path

import pytest

from _world import spawn

GTP_MODULE = "nemo_rl/models/megatron/gtp.py"
SETUP = "nemo_rl/models/megatron/setup.py"
# What this proof fails with on the pristine base (tools' prove checks it): NeMo-RL's setup builds the
# process groups through Bridge without the GTP sizes. The shim's own tests need the module the patch adds.
PRISTINE_FAILS = {"test_setup_hands_bridge_the_gtp_sizes": r"^AssertionError: setup_model_and_optimizer calls "
                                                           r"Megatron-Bridge's initialize_megatron outside the GTP shim"}


@functools.cache
def _load_gtp() -> types.ModuleType:
    tree = os.environ.get("CARRY_TREE_NEMO_RL")
    if not tree:
        pytest.skip("no NeMo-RL tree: run tools/prove.py (it sets CARRY_TREE_NEMO_RL)")
    if importlib.util.find_spec("megatron.core") is None:
        pytest.skip("megatron-core is not on PYTHONPATH: apply megatron-lm in the same work directory "
                    "(tools/prove.py puts its tree there)")
    path = Path(tree) / GTP_MODULE
    assert path.is_file(), (f"the NeMo-RL tree has no {GTP_MODULE}: nothing hands Megatron-Bridge's "
                            "initialize_model_parallel the GTP sizes")
    spec = importlib.util.spec_from_file_location("nemo_rl_gtp_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gtp() -> types.ModuleType:
    module = _load_gtp()
    # Imported before the ranks fork, so they do not each pay for it.
    importlib.import_module("megatron.core.parallel_state")
    return module


@pytest.fixture
def parallel_state(gtp):
    from megatron.core import parallel_state

    return parallel_state


def _init_under_shim(rank, world_size, sizes, explicit):
    from megatron.core import parallel_state

    gtp = _load_gtp()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), gtp.initialize_model_parallel_with_gtp(*sizes):
        # The call Megatron-Bridge makes: through the module attribute, no GTP sizes.
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, **explicit)
    try:
        return (parallel_state.get_gtp_weight_remat_world_size(),
                parallel_state.get_expert_gtp_weight_remat_world_size(),
                parallel_state.get_data_parallel_world_size(with_gtp_remat=False),
                printed.getvalue())
    finally:
        parallel_state.destroy_model_parallel()


def test_shim_injects_gtp_sizes_into_initialize_model_parallel(gtp):
    results = spawn(_init_under_shim, 2, (2, 2), {})
    for rank, (gtp_size, expert_gtp_size, replicate_dp, printed) in enumerate(results):
        assert (gtp_size, expert_gtp_size) == (2, 2), (
            f"rank {rank}: initialize_model_parallel built GTP groups of {gtp_size}/{expert_gtp_size}, "
            "not the 2/2 the shim was given")
        assert replicate_dp == 1, f"rank {rank}: the GTP peers became data-parallel replicas"
        assert ("[gtp] enabling GTP weight rematerialization "
                "(gtp_remat_size=2 expert_gtp_remat_size=2)") in printed


def test_shim_leaves_sizes_the_caller_passes(gtp):
    explicit = {"gtp_remat_size": 1, "expert_gtp_remat_size": 1}
    results = spawn(_init_under_shim, 2, (2, 2), explicit)
    for rank, (gtp_size, expert_gtp_size, replicate_dp, printed) in enumerate(results):
        assert (gtp_size, expert_gtp_size) == (1, 1), f"rank {rank}: the shim overrode explicit sizes"
        assert replicate_dp == 2
        assert "(gtp_remat_size=1 expert_gtp_remat_size=1)" in printed


def test_shim_keeps_the_signature_bridge_inspects(gtp, parallel_state):
    original = parallel_state.initialize_model_parallel
    with gtp.initialize_model_parallel_with_gtp(2, 1):
        wrapped = parallel_state.initialize_model_parallel
        assert wrapped is not original
        assert inspect.signature(wrapped) == inspect.signature(original)
        assert {"gtp_remat_size", "expert_gtp_remat_size"} <= set(inspect.signature(wrapped).parameters)
        assert (wrapped.__name__, wrapped.__doc__) == (original.__name__, original.__doc__)
    assert parallel_state.initialize_model_parallel is original


def test_shim_restores_the_original_when_the_call_raises(gtp, parallel_state, capsys):
    import torch.distributed as dist

    assert not dist.is_initialized(), "this test needs the real call to fail: no process group"
    original = parallel_state.initialize_model_parallel
    with pytest.raises(AssertionError):
        with gtp.initialize_model_parallel_with_gtp(2, 1):
            parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    assert "[gtp] enabling GTP weight rematerialization" in capsys.readouterr().out, (
        "the failure did not come from the wrapped call")
    assert parallel_state.initialize_model_parallel is original

    with pytest.raises(RuntimeError):
        with gtp.initialize_model_parallel_with_gtp(2, 1):
            raise RuntimeError("the Bridge initialisation failed")
    assert parallel_state.initialize_model_parallel is original


def test_shim_stays_out_of_the_way_without_gtp(gtp, parallel_state):
    original = parallel_state.initialize_model_parallel
    with gtp.initialize_model_parallel_with_gtp(1, 1):
        assert parallel_state.initialize_model_parallel is original


def test_gtp_remat_sizes_follow_megatron_core(gtp):
    assert gtp.gtp_remat_sizes({"tensor_model_parallel_size": 2, "expert_tensor_parallel_size": 1}) == (1, 1)
    assert gtp.gtp_remat_sizes({
        "tensor_model_parallel_size": 2, "tensor_parallel_num_weight_shards": 4,
        "expert_tensor_parallel_size": 1, "expert_tensor_parallel_num_weight_shards": None,
    }) == (2, 1)
    assert gtp.gtp_remat_sizes({
        "tensor_model_parallel_size": 1, "tensor_parallel_num_weight_shards": 1,
        "expert_tensor_parallel_size": 2, "expert_tensor_parallel_num_weight_shards": 4,
    }) == (1, 2)
    with pytest.raises(ValueError, match="policy.megatron_cfg.tensor_parallel_num_weight_shards"):
        gtp.gtp_remat_sizes({"tensor_model_parallel_size": 2, "tensor_parallel_num_weight_shards": 3,
                             "expert_tensor_parallel_size": 1})


def test_gtp_remat_sizes_read_no_parallel_size_when_gtp_is_off(gtp):
    """A config that asks for no GTP is not read for GTP: NeMo-RL's own unit test
    (tests/unit/models/megatron/test_megatron_setup.py::TestSetupModelAndOptimizer::
    test_setup_with_param_sync_and_frozen_moe_router) runs setup_model_and_optimizer with a policy
    megatron_cfg that names no parallel size, and passed on the pristine tree; the patched setup
    failed it with KeyError 'tensor_model_parallel_size' (one H200, 2026-12-04)."""
    assert gtp.gtp_remat_sizes({"freeze_moe_router": True}) == (1, 1)
    assert gtp.gtp_remat_sizes({"tensor_parallel_num_weight_shards": None,
                                "expert_tensor_parallel_num_weight_shards": None}) == (1, 1)
    # GTP asked for on one axis only: the other axis needs no size either.
    assert gtp.gtp_remat_sizes({"tensor_model_parallel_size": 1, "tensor_parallel_num_weight_shards": 2}) == (2, 1)
    with pytest.raises(KeyError, match="expert_tensor_parallel_size"):
        gtp.gtp_remat_sizes({"expert_tensor_parallel_num_weight_shards": 2})


def test_preflight_names_the_requirement_when_gtp_is_unavailable(gtp):
    from megatron.core.tensor_parallel.gtp_api import HAVE_GTP

    if HAVE_GTP:
        pytest.skip("megatron-core has GTP here (TransformerEngine >= 2.19): nothing to refuse")
    with pytest.raises(gtp.GTPUnavailableError) as info:
        gtp.check_gtp_available(2, 1)
    assert isinstance(info.value, RuntimeError)
    message = str(info.value)
    assert "HAVE_GTP=False" in message
    assert "TransformerEngine >= 2.19" in message
    if importlib.util.find_spec("transformer_engine") is None:
        assert "TransformerEngine found: not installed" in message
    else:
        assert "TransformerEngine found: " in message
    for key in ("tensor_parallel_num_weight_shards", "expert_tensor_parallel_num_weight_shards"):
        assert f"policy.megatron_cfg.{key}" in message
    assert "null" in message


def test_preflight_passes_when_gtp_is_off(gtp):
    assert gtp.check_gtp_available(1, 1) is None


def test_setup_hands_bridge_the_gtp_sizes():
    """NeMo-RL's setup_model_and_optimizer calls Bridge's initialize_megatron inside
    initialize_model_parallel_with_gtp (imported from nemo_rl.models.megatron.gtp), given the sizes
    gtp_remat_sizes reads from the policy's megatron_cfg."""
    import ast

    tree = os.environ.get("CARRY_TREE_NEMO_RL")
    if not tree:
        pytest.skip("no NeMo-RL tree: run tools/prove.py (it sets CARRY_TREE_NEMO_RL)")
    module = ast.parse((Path(tree) / SETUP).read_text(encoding="utf-8"))
    imported = {a.asname or a.name for n in ast.walk(module) if isinstance(n, ast.ImportFrom)
                and n.module == "nemo_rl.models.megatron.gtp" for a in n.names}
    setup = next(n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "setup_model_and_optimizer")

    def shimmed(node, inside):
        if isinstance(node, ast.With):
            inside = inside or any(isinstance(i.context_expr, ast.Call) and isinstance(i.context_expr.func, ast.Name)
                                   and i.context_expr.func.id == "initialize_model_parallel_with_gtp"
                                   and i.context_expr.args for i in node.items)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "initialize_megatron":
            return [inside]
        return [r for child in ast.iter_child_nodes(node) for r in shimmed(child, inside)]

    calls = shimmed(setup, False)
    assert calls, "setup_model_and_optimizer no longer calls initialize_megatron: read it again"
    assert all(calls) and "initialize_model_parallel_with_gtp" in imported, (
        "setup_model_and_optimizer calls Megatron-Bridge's initialize_megatron outside the GTP shim: Bridge "
        "builds the process groups without gtp_remat_size, so a config with two weight shards trains with GTP "
        "off, its GTP peers data-parallel replicas")
    sizes = [n for n in ast.walk(setup) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id == "gtp_remat_sizes"]
    assert sizes and "gtp_remat_sizes" in imported, "the shim is not given the sizes from the policy's config"
