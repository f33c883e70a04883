"""How a night's cells sit on GPUs, and the shared-GPU mode.

A cell needs the GPUs its test names (``gpus``), else its image's on a local launcher. In the
shared-GPU mode (``tools/nightly.py --shared-gpu``) a cell whose ranks would take one GPU each
runs them all on one: the cell's environment gets ``CARRY_SHARED_GPU=1``, which the mini test
(``--backend nccl``) and the NeMo-RL harness (``run-on-gpu-host``) read; each rank's process then
gets a ``NCCL_HOSTID`` of its own and NCCL joins them over its socket transport. What is exact
there is exact, and per-rank memory still counts (each process has its own allocator); times
and bandwidths are not GTP's price, and every output that holds a time says so.
"""

from __future__ import annotations

from ..errors import CarryError
from ..runner import run

SHARED_GPU_ENV = "CARRY_SHARED_GPU"
SHARED_GPU = "shared-gpu"
TIMING_NOTE = ("shared-gpu: the ranks shared one GPU (NCCL over its socket transport); times and bandwidths "
               "are not GTP's price, per-rank memory is")


def needs_gpus(cell) -> int:
    """The GPUs the cell's ranks take one each (0: a CPU cell, or a proof, which picks its own)."""
    if cell.spec.kind == "proof":
        return 0
    return cell.spec.gpus or (cell.image.gpus if cell.launcher == "local" else 0)


def visible_gpus() -> int:
    try:
        res = run(["nvidia-smi", "-L"], check=False, timeout=60)
    except CarryError:
        return 0
    return sum(1 for line in res.stdout.splitlines() if line.startswith("GPU ")) if res.ok else 0


def gpu_mode(cell, shared: bool) -> str | None:
    """The label a cell's run.json and history carry: None for a cell without GPUs."""
    need = needs_gpus(cell)
    if not need:
        return None
    if shared and need > 1:
        return SHARED_GPU
    return "one-gpu" if need == 1 else "gpu-per-rank"


def shortfall(cell, shared: bool, have: int) -> str | None:
    """Why a local cell cannot run on ``have`` visible GPUs, or None. The reason names the mode."""
    need = needs_gpus(cell)
    if not need or cell.launcher != "local":
        return None
    if shared:
        return None if have >= 1 else f"needs a GPU for its {need} rank(s) to share, {have} visible (nvidia-smi)"
    if have >= need:
        return None
    more = (f"; --shared-gpu runs its {need} ranks on one GPU ({SHARED_GPU_ENV}=1, integration/README.md)"
            if need > 1 and have >= 1 else "")
    return f"needs {need} GPU(s), {have} visible (nvidia-smi){more}"
