"""NeMo-RL's Megatron workers import what they need from the pinned megatron-core.

Bug (NeMo-RL 7ea279ab with megatron-core 0.19.2): ``megatron_policy_worker.py`` and
``megatron_value_worker.py`` import ``FullyShardedDataParallelV1`` and
``FullyShardedDataParallelV2`` from ``megatron.core.distributed.fsdp.mcore_fsdp_adapter``. The
Megatron-LM of NeMo-RL's Bridge submodule has them; megatron-core 0.19.2, the release with GTP,
has one class, ``FullyShardedDataParallel``. The workers then fail at import, and a GRPO run with
the series' megatron-core never starts a Megatron worker.

How: every module-level statement of the two worker modules that imports from megatron.core
(including a try/except around such imports), or that defines MCORE_FSDP_CLASSES, is executed, in order, with the series'
megatron-core tree on the path; nothing else of NeMo-RL is imported, so the proof needs only
torch and the trees. The names the workers test Megatron-FSDP models against must then be
megatron-core classes.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

# What this proof fails with on the pristine base (tools' prove checks it): NeMo-RL imports names megatron-core 0.19 lacks.
PRISTINE_FAILS = r"cannot import name 'FullyShardedDataParallelV1'"

WORKERS = ("nemo_rl/models/policy/workers/megatron_policy_worker.py",
           "nemo_rl/models/value/workers/megatron_value_worker.py")


def _imports_megatron_core(node: ast.stmt) -> bool:
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").startswith("megatron.core")
    if isinstance(node, ast.Import):
        return any(a.name.startswith("megatron.core") for a in node.names)
    if isinstance(node, ast.Try):
        return any(_imports_megatron_core(n) for n in node.body)
    if isinstance(node, (ast.Assign, ast.If)):  # the wrapper classes picked from what was imported
        return any(isinstance(n, ast.Name) and n.id == "MCORE_FSDP_CLASSES" for n in ast.walk(node))
    return False


@pytest.mark.parametrize("worker", WORKERS, ids=["policy", "value"])
def test_worker_megatron_core_imports_resolve(worker):
    root = os.environ.get("CARRY_TREE_NEMO_RL")
    if not root:
        pytest.skip("needs the NeMo-RL tree (CARRY_TREE_NEMO_RL, set by tools/prove.py)")
    tree = ast.parse(Path(root, worker).read_text())
    block = ast.Module(body=[n for n in tree.body if _imports_megatron_core(n)], type_ignores=[])
    assert block.body, f"{worker} imports nothing from megatron.core at module level"
    names: dict = {}
    exec(compile(block, worker, "exec"), names)  # noqa: S102 - the worker's own import statements
    fsdp = names.get("MCORE_FSDP_CLASSES") or tuple(
        names[n] for n in ("FullyShardedDataParallelV1", "FullyShardedDataParallelV2") if n in names)
    assert fsdp and all(isinstance(c, type) and c.__module__.startswith("megatron.core") for c in fsdp), fsdp
