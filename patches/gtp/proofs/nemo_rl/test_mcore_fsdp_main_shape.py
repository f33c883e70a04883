"""NeMo-RL's Megatron-FSDP check works on every shape megatron-core's adapter module has had.

Bug: the workers test ``isinstance(model, <Megatron-FSDP wrappers>)`` before offloading a
model's buffers. The names they take the wrappers from changed under them:

- megatron-core 0.19.2 (PyPI, the series' pin): one class, ``FullyShardedDataParallel``; the
  pristine workers' ``FullyShardedDataParallelV1``/``V2`` import fails there;
- Megatron-LM main (since NVIDIA/Megatron-LM#5865, 2026-07-31; so on the 2026-08-22 snapshot):
  classes ``FullyShardedDataParallelV1`` and ``FullyShardedDataParallelV2``, and
  ``FullyShardedDataParallel`` is a factory *function* that returns one of them;
- main's factory in front of a single implementation class (its docstring tells callers to
  type-check against "the explicit V1 or V2 implementation classes"): a fallback that takes
  ``FullyShardedDataParallel`` for a class hands ``isinstance`` a function, and the first
  offload raises ``TypeError: isinstance() arg 2 must be a type ...``.

How: stand-in ``megatron.core.distributed.fsdp.mcore_fsdp_adapter`` modules of those three
shapes (written here, nothing else of megatron-core); each worker's module-level statements
that import from megatron.core or define ``MCORE_FSDP_CLASSES`` run in a fresh interpreter that
sees only the stand-in; every wrapper class of the shape must then pass the workers' check, and a
plain module must not, without an exception.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# What this proof fails with on the pristine base (tools' prove checks it): NeMo-RL imports names megatron-core
# 0.19 lacks, on both shapes of megatron-core.
PRISTINE_FAILS = r"cannot import name 'FullyShardedDataParallelV1'"

WORKERS = ("nemo_rl/models/policy/workers/megatron_policy_worker.py",
           "nemo_rl/models/value/workers/megatron_value_worker.py")

_BASE = "class _BaseDataParallel:\n    pass\n\n\n"
SHAPES = {
    "mcore-0.19.2": (_BASE + "class FullyShardedDataParallel(_BaseDataParallel):\n    pass\n",
                     ["FullyShardedDataParallel"]),
    "main-2026-08-22": (_BASE + "class FullyShardedDataParallelV1(_BaseDataParallel):\n    pass\n\n\n"
                        "class FullyShardedDataParallelV2(_BaseDataParallel):\n    pass\n\n\n"
                        "def FullyShardedDataParallel(config, ddp_config, module, *args, **kwargs):\n"
                        "    cls = FullyShardedDataParallelV2 if getattr(ddp_config, 'megatron_fsdp_version', 1) == 2"
                        " else FullyShardedDataParallelV1\n"
                        "    return cls()\n",
                        ["FullyShardedDataParallelV1", "FullyShardedDataParallelV2"]),
    "main-factory-one-class": (_BASE + "class FullyShardedDataParallelV2(_BaseDataParallel):\n    pass\n\n\n"
                               "def FullyShardedDataParallel(config, ddp_config, module, *args, **kwargs):\n"
                               "    return FullyShardedDataParallelV2()\n",
                               ["FullyShardedDataParallelV2"]),
}

# Runs in the child: the workers' statements, then the check they make before offloading.
CHILD = r'''
import json, sys
import megatron.core.distributed.fsdp.mcore_fsdp_adapter as adapter

code, wrappers = sys.argv[1], json.loads(sys.argv[2])
names = {}
try:
    exec(compile(code, "worker", "exec"), names)
except Exception as exc:
    print(json.dumps({"error": f"import: {type(exc).__name__}: {exc}"})); sys.exit(0)
fsdp = names.get("MCORE_FSDP_CLASSES") or tuple(
    names[n] for n in ("FullyShardedDataParallelV1", "FullyShardedDataParallelV2") if n in names)
try:
    accepted = {w: isinstance(object.__new__(getattr(adapter, w)), fsdp) for w in wrappers}
    plain = isinstance(adapter, fsdp)
except Exception as exc:
    print(json.dumps({"error": f"isinstance: {type(exc).__name__}: {exc}"})); sys.exit(0)
print(json.dumps({"accepted": accepted, "plain": plain}))
'''


def _selected(node: ast.stmt) -> bool:
    """A module-level statement of the workers' Megatron-FSDP lookup."""
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").startswith("megatron.core.distributed")
    if isinstance(node, ast.Try):
        return any(_selected(n) for n in node.body)
    if isinstance(node, (ast.Assign, ast.If)):
        return any(isinstance(n, ast.Name) and n.id == "MCORE_FSDP_CLASSES" for n in ast.walk(node))
    return False


def _stand_in(root: Path, body: str) -> None:
    pkg = root / "megatron" / "core" / "distributed" / "fsdp"
    pkg.mkdir(parents=True)
    for d in (root / "megatron", root / "megatron" / "core", root / "megatron" / "core" / "distributed", pkg):
        (d / "__init__.py").write_text("")
    # What the workers import from megatron.core.distributed besides the adapter.
    (root / "megatron" / "core" / "distributed" / "__init__.py").write_text(
        "class DistributedDataParallel:\n    pass\n")
    (pkg / "mcore_fsdp_adapter.py").write_text(body)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("worker", WORKERS, ids=["policy", "value"])
def test_fsdp_check_on_adapter_shape(tmp_path, worker, shape):
    root = os.environ.get("CARRY_TREE_NEMO_RL")
    if not root:
        pytest.skip("needs the NeMo-RL tree (CARRY_TREE_NEMO_RL, set by tools/prove.py)")
    tree = ast.parse(Path(root, worker).read_text())
    block = ast.Module(body=[n for n in tree.body if _selected(n)], type_ignores=[])
    assert block.body, f"{worker} has no module-level Megatron-FSDP lookup"
    body, wrappers = SHAPES[shape]
    _stand_in(tmp_path / "site", body)
    res = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(tmp_path / 'site')!r})\n"
                          + CHILD, ast.unparse(block), json.dumps(wrappers)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert "error" not in out, f"{worker} on {shape}: {out['error']}"
    assert all(out["accepted"].values()), f"{worker} on {shape}: a Megatron-FSDP model is not recognised: {out}"
    assert out["plain"] is False, f"{worker} on {shape}: a plain module passes the Megatron-FSDP check"
