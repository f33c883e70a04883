"""What the CPU proofs need to build GTP-sharded layers on a CPU-only torch.

Creating a GTP shard (GTPShardedParam) allocates CUDA events for the all-gathers
it will run later, and a CPU build of torch refuses to instantiate
``torch.cuda.Event`` at all: without a stand-in the pristine tree would die
inside its GTP code instead of reaching a proof's assertion. The CPU proofs only
inspect what layers allocate and never run a GTP collective, so an event that
does nothing is enough.

A torch_dist save or load calls ``torch.cuda.synchronize`` and puts a status flag
on ``torch.cuda.current_device()``; on a CPU build both raise, so they get their
CPU meaning (nothing to wait for; the flag lives on the CPU). Megatron-core's refit
(resharding/execution.py and its gloo copy service) orders its copies on CUDA streams
and synchronizes the device, and its gloo copy service stages through pinned host
buffers: on a CPU there is one stream and nothing to wait for, so streams become inert
and ``torch.cuda.stream`` a plain context, and ``torch.empty(..., pin_memory=True)``
(which a CPU build refuses) gives the same buffer unpinned.

Megatron-Bridge's ``peft/lora_layers.py`` imports ``transformer_engine.pytorch``
unconditionally, and TE only exists for CUDA: ``BridgeWithoutTE`` hands that module (and no
other) an inert placeholder for its own import statements. sys.modules never holds it, so
megatron-core keeps seeing TE as absent. The NeMo-RL dry-run's import probe
(integration/nemo_rl_gtp/harness) uses the same finder.

Nothing else is replaced, and nothing at all where CUDA is available.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib.abc
import importlib.machinery

import torch


class InertEvent:
    def __init__(self, *args, **kwargs):
        pass


def allow_gtp_shards_without_cuda() -> None:
    """Call in each rank before building layers."""
    if not torch.cuda.is_available():
        torch.cuda.Event = InertEvent


def allow_dist_checkpoints_without_cuda() -> None:
    """Call in each rank before a torch_dist save or load."""
    if not torch.cuda.is_available():
        torch.cuda.synchronize = lambda device=None: None
        torch.cuda.current_device = lambda: "cpu"


class InertStream:
    def __init__(self, *args, **kwargs):
        pass

    def synchronize(self):
        pass

    def wait_stream(self, stream):
        pass

    def wait_event(self, event):
        pass


def allow_refit_without_cuda() -> None:
    """Call in each rank before megatron-core's swap_model_weights."""
    allow_dist_checkpoints_without_cuda()
    if not torch.cuda.is_available():
        torch.cuda.Stream = InertStream
        torch.cuda.stream = lambda stream=None: contextlib.nullcontext()
        torch.cuda.current_stream = lambda device=None: InertStream()
        empty = torch.empty

        def empty_unpinned(*args, pin_memory=False, **kwargs):
            return empty(*args, **kwargs)

        torch.empty = empty_unpinned


class _InertTE(type):
    """A placeholder TE: attribute lookups give further placeholders (so annotations such as
    ``te.ops.Sequential`` evaluate); using one as a real layer raises."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _InertTE(name, (), {})

    def __call__(cls, *args, **kwargs):
        raise RuntimeError("TransformerEngine placeholder: no TE code can run here")


class BridgeWithoutTE(importlib.abc.MetaPathFinder):
    """Insert into sys.meta_path (where TE is absent) before importing Megatron-Bridge.

    ``used`` lists the modules that really imported the placeholder.
    """

    MODULES = ("megatron.bridge.peft.lora_layers",)

    def __init__(self):
        self.used: list[str] = []

    def find_spec(self, name, path, target=None):
        if name not in self.MODULES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        real_exec = spec.loader.exec_module

        def local_import(mod, globals=None, locals=None, fromlist=(), level=0):
            if level == 0 and mod.split(".")[0] == "transformer_engine":
                self.used.append(name)
                return _InertTE("transformer_engine", (), {})
            return builtins.__import__(mod, globals, locals, fromlist, level)

        def exec_module(module):
            module.__dict__["__builtins__"] = dict(vars(builtins), __import__=local_import)
            real_exec(module)

        spec.loader.exec_module = exec_module
        return spec
