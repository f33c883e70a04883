"""Runs at the start of every Python whose PYTHONPATH has this folder: run-on-gpu-host puts it there for
the cases that check their refit and in the shared-GPU mode (the Ray workers inherit PYTHONPATH, and with
NEMO_RL_PY_EXECUTABLES_SYSTEM=1 they run the case's venv Python). With CARRY_SHARED_GPU=1 it installs
carry_shared_gpu (this process's own NCCL_HOSTID, Ray's GPU ids on GPU 0); with CARRY_REFIT_CHECK=1 it installs carry_refit_check's import hook; it
then runs the sitecustomize this one shadows, if any (Ubuntu's)."""

import importlib.machinery
import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
if os.environ.get("CARRY_SHARED_GPU") == "1":
    import carry_shared_gpu

    carry_shared_gpu.install()
if os.environ.get("CARRY_REFIT_CHECK") == "1":
    import carry_refit_check

    carry_refit_check.install()
if os.environ.get("CARRY_GREEDY_VALIDATION") == "1" or os.environ.get("CARRY_LEARNING_MUTATION"):
    import carry_learning

    carry_learning.install()

_rest = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _spec is not None and _spec.loader is not None and os.path.dirname(os.path.abspath(_spec.origin)) != _here:
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
