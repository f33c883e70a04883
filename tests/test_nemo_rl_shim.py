"""The proof of nrl-gtp-shim, run red/green here without a NeMo-RL checkout.

The shim's tests are its proof, proofs/nemo_rl/test_gtp_shim.py. The patch adds
``nemo_rl/models/megatron/gtp.py`` whole, and that module imports only the standard library
and megatron.core, so a NeMo-RL "tree" holding just that file (read from the patch) is enough
for the proof to go green against the real pinned megatron-core, and a tree without it must
make it go red: CI runs the proof for real although it cannot fetch NeMo-RL.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys

from carry.errors import PatchFormatError
from carry.evidence.pristine import red_for_its_reason
from carry.evidence.prove import run_proof
from carry.series.manifest import load
from carry.series.patchfile import new_file_text
from helpers import SERIES

GTP_MODULE = "nemo_rl/models/megatron/gtp.py"


def _module_text(series) -> str:
    patch = series.patch("nrl-gtp-shim")
    try:
        return new_file_text(series.patch_path(patch), GTP_MODULE)
    except PatchFormatError as exc:
        raise AssertionError(f"nrl-gtp-shim no longer adds {GTP_MODULE} whole: {exc.message}") from None


def test_module_imports_only_stdlib_and_megatron():
    """What lets CI run the proof from the patch alone: the module needs no other NeMo-RL code."""
    tree = ast.parse(_module_text(load(SERIES)))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            roots.add((node.module or "").split(".")[0])
    foreign = roots - set(sys.stdlib_module_names) - {"megatron", "transformer_engine"}
    assert not foreign, f"{GTP_MODULE} imports {sorted(foreign)}: it must stay testable from its patch"


def test_shim_proof_is_red_without_the_module_and_green_with_it(mcore_tree, tmp_path):
    series = load(SERIES)
    patch = series.patch("nrl-gtp-shim")
    assert patch.proofs == ("proofs/nemo_rl/test_gtp_shim.py",)
    # setup_model_and_optimizer's call of Bridge's initialize_megatron, as the pin has it and as the patch
    # leaves it (the whole setup.py needs NeMo-RL's checkout; prove runs the proof on the real trees).
    pristine = tmp_path / "pristine"
    (pristine / SETUP).parent.mkdir(parents=True)
    (pristine / SETUP).write_text(SETUP_PRISTINE)
    patched = tmp_path / "patched"
    (patched / GTP_MODULE).parent.mkdir(parents=True)
    (patched / GTP_MODULE).write_text(_module_text(series))
    (patched / SETUP).write_text(SETUP_PATCHED)
    logs = tmp_path / "logs"
    red = run_proof(series, patch, {"megatron-lm": mcore_tree, "nemo-rl": pristine}, 900, logs, "pristine")
    green = run_proof(series, patch, {"megatron-lm": mcore_tree, "nemo-rl": patched}, 900, logs, "patched")
    # Red in the body that meets the bug; the shim's own tests cannot load the module there (setup errors).
    assert red.result == "fail" and "outside the GTP shim" in red.detail, red
    assert [t.rsplit("::", 1)[-1] for t, _ in red.failures] == ["test_setup_hands_bridge_the_gtp_sizes"], red
    assert red_for_its_reason(red, series.root / patch.proofs[0]) == "", red
    assert green.result == "pass", (green, (logs / "nrl-gtp-shim.test_gtp_shim.patched.log").read_text()[-3000:])
    # every test of the proof ran and passed; only where TransformerEngine is installed (megatron-core may
    # then have GTP) may the one test that names the missing requirement skip
    n = len(re.findall(r"^def test_", (series.root / patch.proofs[0]).read_text(), re.M))
    allowed = {f"{n} passed"} | ({f"{n - 1} passed, 1 skipped"} if importlib.util.find_spec("transformer_engine") else set())
    assert green.detail.split(" in ")[0] in allowed, (n, allowed, green)


SETUP = "nemo_rl/models/megatron/setup.py"
SETUP_PRISTINE = """
def setup_model_and_optimizer(policy_cfg, megatron_cfg):
    initialize_megatron(cfg=megatron_cfg, get_embedding_ranks=None, get_position_embedding_ranks=None)
"""
SETUP_PATCHED = """
from nemo_rl.models.megatron.gtp import (
    gtp_remat_sizes,
    initialize_model_parallel_with_gtp,
)


def setup_model_and_optimizer(policy_cfg, megatron_cfg):
    gtp_sizes = gtp_remat_sizes(policy_cfg["megatron_cfg"])
    with initialize_model_parallel_with_gtp(*gtp_sizes):
        initialize_megatron(cfg=megatron_cfg, get_embedding_ranks=None, get_position_embedding_ranks=None)
"""


# -- the expert key, through Megatron-Bridge's own call ------------------------------------------
BRIDGE_CALL = r'''
import importlib.util, json, sys, typing
from _cpu import BridgeWithoutTE
from _world import spawn

GTP_PATH, CASES = sys.argv[1], json.loads(sys.argv[2])

if not hasattr(typing, "override"):  # megatron.training (3.12+) on this 3.11
    import typing_extensions
    typing.override = typing_extensions.override
hook = BridgeWithoutTE() if importlib.util.find_spec("transformer_engine") is None else None
if hook:
    sys.meta_path.insert(0, hook)
import megatron.bridge.training.initialize as bridge_initialize  # before the ranks fork
if hook:
    sys.meta_path.remove(hook)


def load_gtp():
    spec = importlib.util.spec_from_file_location("nemo_rl_gtp_under_test", GTP_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rank(rank, world, megatron_cfg, shim):
    from megatron.bridge.training.config import DistributedInitConfig
    from megatron.core import parallel_state
    from megatron.core.transformer.transformer_config import TransformerConfig

    gtp = load_gtp()
    sizes = gtp.gtp_remat_sizes(megatron_cfg)  # what NeMo-RL's setup hands the shim
    model_config = TransformerConfig(
        num_layers=1, hidden_size=16, num_attention_heads=2, num_moe_experts=2, moe_router_topk=2,
        tensor_model_parallel_size=megatron_cfg["tensor_model_parallel_size"],
        expert_tensor_parallel_size=megatron_cfg["expert_tensor_parallel_size"],
        tensor_parallel_num_weight_shards=megatron_cfg["tensor_parallel_num_weight_shards"],
        expert_tensor_parallel_num_weight_shards=megatron_cfg["expert_tensor_parallel_num_weight_shards"],
    )
    call = lambda: bridge_initialize._initialize_distributed(
        model_config, DistributedInitConfig(distributed_backend="gloo"), 1, None, None)
    if shim:
        with gtp.initialize_model_parallel_with_gtp(*sizes):
            call()
    else:
        call()
    try:
        return {"sizes": list(sizes),
                "gtp_remat": parallel_state.get_gtp_weight_remat_world_size(),
                "expert_gtp_remat": parallel_state.get_expert_gtp_weight_remat_world_size(),
                "expert_dp": parallel_state.get_expert_data_parallel_world_size(with_gtp_remat=False)}
    finally:
        parallel_state.destroy_model_parallel()


print(json.dumps([spawn(rank, 2, cfg, shim, method="fork") for cfg, shim in CASES]))
'''


def _megatron_cfg(shards, expert_shards):
    return {"tensor_model_parallel_size": 1, "tensor_parallel_num_weight_shards": shards,
            "expert_tensor_parallel_size": 1, "expert_tensor_parallel_num_weight_shards": expert_shards}


def test_expert_shard_key_reaches_initialize_model_parallel_through_bridge(pin_cache, tmp_path):
    """policy.megatron_cfg.expert_tensor_parallel_num_weight_shards = 2, resolved by the shim's
    gtp_remat_sizes and handed through the shim to Megatron-Bridge 0.6.2's own
    _initialize_distributed (which calls initialize_model_parallel without any GTP size), reaches
    megatron-core as expert_gtp_remat_size 2 on two gloo ranks: expert GTP groups of 2, the expert
    data-parallel replicas 1. With the dense axis off too (null), and with both axes on. Without
    the shim the same Bridge call builds expert GTP groups of 1: the key is dropped silently."""
    import json
    import os
    import subprocess

    from helpers import ROOT, tool

    work = tmp_path / "work"
    tool("apply", "--series", "gtp", "--workdir", work, "--cache", pin_cache,
         "--only", "megatron-lm,megatron-bridge", check=0)
    module = tmp_path / "gtp.py"
    module.write_text(_module_text(load(SERIES)))
    proofs = ROOT / "patches" / "gtp" / "proofs"
    cases = [(_megatron_cfg(None, 2), True), (_megatron_cfg(2, 2), True), (_megatron_cfg(None, 2), False)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(proofs), str(work / "megatron-lm"), str(work / "megatron-bridge" / "src")]),
        "PYTHONDONTWRITEBYTECODE": "1"}
    res = subprocess.run([sys.executable, "-c", BRIDGE_CALL, str(module), json.dumps(cases)], env=env,
                         capture_output=True, text=True, timeout=900, check=False)
    assert res.returncode == 0, res.stderr[-4000:]
    expert_only, both, without_shim = json.loads(res.stdout.strip().splitlines()[-1])
    for rank, got in enumerate(expert_only):
        assert got == {"sizes": [1, 2], "gtp_remat": 1, "expert_gtp_remat": 2, "expert_dp": 1}, (rank, got)
    for rank, got in enumerate(both):
        assert got == {"sizes": [2, 2], "gtp_remat": 2, "expert_gtp_remat": 2, "expert_dp": 1}, (rank, got)
    for rank, got in enumerate(without_shim):
        # Bridge alone: the GTP peers of the expert axis became expert data-parallel replicas.
        assert got == {"sizes": [1, 2], "gtp_remat": 1, "expert_gtp_remat": 1, "expert_dp": 2}, (rank, got)
