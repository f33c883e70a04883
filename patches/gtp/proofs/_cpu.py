"""What the CPU proofs need to build GTP-sharded layers on a CPU-only torch.

Creating a GTP shard (GTPShardedParam) allocates CUDA events for the all-gathers
it will run later, and a CPU build of torch refuses to instantiate
``torch.cuda.Event`` at all: without a stand-in the pristine tree would die
inside its GTP code instead of reaching a proof's assertion. The CPU proofs only
inspect what layers allocate and never run a GTP collective, so an event that
does nothing is enough. Nothing else is replaced, and nothing at all where CUDA
is available.
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
