"""The shared-GPU mode in every Python of a NeMo-RL case (sitecustomize.py installs it when
CARRY_SHARED_GPU=1): the case's Megatron workers all run on the one physical GPU 0.

Two things, each before anything reads it:

- **NCCL_HOSTID**: this process's own (host and pid). NCCL refuses two ranks on one device
  ("Duplicate GPU detected") unless it takes them for two hosts. Ray copies the driver's environment
  into every worker, so an inherited value is overwritten here, at interpreter start.
- **Ray's GPU ids**: ``ray start --num-gpus=N`` (N logical GPUs, CUDA_VISIBLE_DEVICES unset so Ray
  takes N over what it counts) hands each worker one of the ids 0..N-1, and NeMo-RL's Megatron worker
  does ``torch.cuda.set_device(int(ray.get_gpu_ids()[0]))``, then checks ``current_device() ==
  local_rank``. ``ray.get_gpu_ids()`` is made to answer the physical device each logical id sits on,
  GPU 0, so both hold unchanged, and the worker sees every physical GPU (NeMo-RL sets
  RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1 for it). Ray's own mapping (the i-th entry of the
  CUDA_VISIBLE_DEVICES ray start saw) cannot do this: CUDA refuses ``CUDA_VISIBLE_DEVICES=0,0``
  ("invalid device ordinal", seen on the H200), and a worker inherits that variable.
"""

from __future__ import annotations

import os
import socket

from carry_after_import import after_import

PHYSICAL = "0"     # the GPU every logical id sits on
TARGET = "ray"
MARK = "carry_shared_gpu"


def hostid() -> str:
    return f"{socket.gethostname()}-carry-shared-gpu-{os.getpid()}"


def wrap(get_gpu_ids):
    def get_gpu_ids_on_the_shared_gpu(*args, **kwargs):
        ids = get_gpu_ids(*args, **kwargs)
        return [type(ids[0])(PHYSICAL)] if ids else []   # Ray answers ints or strings: keep its kind

    get_gpu_ids_on_the_shared_gpu.carry_shared_gpu = True
    get_gpu_ids_on_the_shared_gpu.__wrapped__ = get_gpu_ids
    return get_gpu_ids_on_the_shared_gpu


def patch(module) -> None:
    fn = getattr(module, "get_gpu_ids", None)
    if fn is not None and not getattr(fn, MARK, False):
        module.get_gpu_ids = wrap(fn)


def install() -> None:
    os.environ["NCCL_HOSTID"] = hostid()
    after_import(TARGET, patch)
