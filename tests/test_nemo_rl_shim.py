"""NeMo-RL's GTP module, read straight from its patch, against a real megatron-core.

The nemo-rl series adds ``nemo_rl/models/megatron/gtp.py`` whole. It imports only the
standard library and (lazily) megatron.core, so these tests execute its text as taken from
the patch file, without a NeMo-RL tree, against the megatron-core tree named by
CARRY_MEGATRON_CORE_TREE (a checkout or unpacked wheel holding ``megatron/core``):

- the init shim makes a real ``parallel_state.initialize_model_parallel`` call, made the way
  Megatron-Bridge makes it (through the module, without GTP sizes), build GTP groups of the
  requested size on two gloo ranks;
- sizes the caller passes win, the original is restored even when the call raises, and
  ``inspect.signature`` (which Bridge consults first) is unchanged;
- the preflight raises its named error when ``gtp_api.HAVE_GTP`` is False (it is, for real, on
  a machine without TransformerEngine >= 2.19) and says what is missing and how to opt out.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.util
import inspect
import io
import os
import sys
import types
from pathlib import Path

import pytest

from carry.errors import PatchFormatError
from carry.patchfile import new_file_text

ROOT = Path(__file__).resolve().parents[1]
NEMO_RL_PATCHES = ROOT / "patches" / "gtp" / "nemo-rl"
GTP_MODULE = "nemo_rl/models/megatron/gtp.py"

sys.path.insert(0, str(ROOT / "patches" / "gtp" / "proofs"))
from _world import spawn  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _megatron_core_from_pins(mcore_tree):
    """Without an explicit tree, use the pinned megatron-core that conftest materialises."""
    os.environ.setdefault("CARRY_MEGATRON_CORE_TREE", str(mcore_tree))


def megatron_core_tree() -> Path:
    """The megatron-core tree from CARRY_MEGATRON_CORE_TREE, put on sys.path; skip if unset."""
    tree = os.environ.get("CARRY_MEGATRON_CORE_TREE")
    if not tree:
        pytest.skip("CARRY_MEGATRON_CORE_TREE is unset: point it at a megatron-core 0.19.2 tree "
                    "(the directory that holds megatron/core)")
    path = Path(tree).resolve()
    if not (path / "megatron" / "core" / "parallel_state.py").is_file():
        pytest.fail(f"CARRY_MEGATRON_CORE_TREE={tree} holds no megatron/core/parallel_state.py")
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
    return path


def _module_text() -> str:
    for patch in sorted(NEMO_RL_PATCHES.glob("*.patch")):
        try:
            return new_file_text(patch, GTP_MODULE)
        except PatchFormatError:
            continue
    pytest.fail(f"no patch under {NEMO_RL_PATCHES.relative_to(ROOT)} adds {GTP_MODULE}")


@functools.cache
def _load_gtp() -> types.ModuleType:
    megatron_core_tree()
    module = types.ModuleType("nemo_rl_gtp_from_patch")
    module.__file__ = GTP_MODULE
    exec(compile(_module_text(), GTP_MODULE, "exec"), module.__dict__)
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


def test_module_imports_only_stdlib_and_megatron():
    tree = ast.parse(_module_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            roots.add((node.module or "").split(".")[0])
    foreign = roots - set(sys.stdlib_module_names) - {"megatron", "transformer_engine"}
    assert not foreign, f"{GTP_MODULE} imports {sorted(foreign)}: it must stay testable from its patch"


def test_shim_injects_gtp_sizes_into_initialize_model_parallel(gtp):
    results = spawn(_init_under_shim, 2, (2, 2), {}, method="fork")
    for rank, (gtp_size, expert_gtp_size, replicate_dp, printed) in enumerate(results):
        assert (gtp_size, expert_gtp_size) == (2, 2), (
            f"rank {rank}: initialize_model_parallel built GTP groups of {gtp_size}/{expert_gtp_size}, "
            "not the 2/2 the shim was given")
        assert replicate_dp == 1, f"rank {rank}: the GTP peers became data-parallel replicas"
        assert ("[gtp] enabling GTP weight rematerialization "
                "(gtp_remat_size=2 expert_gtp_remat_size=2)") in printed


def test_shim_leaves_sizes_the_caller_passes(gtp):
    explicit = {"gtp_remat_size": 1, "expert_gtp_remat_size": 1}
    results = spawn(_init_under_shim, 2, (2, 2), explicit, method="fork")
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
