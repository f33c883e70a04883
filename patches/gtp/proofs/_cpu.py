"""What the CPU proofs need to build GTP-sharded layers on a CPU-only torch.

Creating a GTP shard (GTPShardedParam) allocates CUDA events for the all-gathers
it will run later, and a CPU build of torch refuses to instantiate
``torch.cuda.Event`` at all: without a stand-in the pristine tree would die
inside its GTP code instead of reaching a proof's assertion. The CPU proofs only
inspect what layers allocate and never run a GTP collective, so an event that
does nothing is enough.

A torch_dist save or load calls ``torch.cuda.synchronize`` and puts a status flag
on ``torch.cuda.current_device()``; on a CPU build both raise, so they get their
CPU meaning (nothing to wait for; the flag lives on the CPU).

Nothing else is replaced, and nothing at all where CUDA is available.
"""

from __future__ import annotations

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
