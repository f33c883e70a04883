"""torch_dist checkpoints across layouts: GTP off -> GTP at the start, GTP -> whole weights at the end.

A run that starts from a converted checkpoint loads a checkpoint written without GTP into the
GTP-sharded training model; export and evaluation load the GTP model's checkpoint into a
whole-weight model. Both must give every tensor exactly. The known way this goes wrong (the
fused SwiGLU fc1 mislabelled, patch mlm-gtp-swiglu-ckpt) shows as fc1 alone differing.
"""

from __future__ import annotations

import os
import re

import torch
from bugs import CheckFailed, KnownBug
from model import tensor_mismatches, whole_weights


def save(model, path: str) -> None:
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    os.makedirs(path, exist_ok=True)
    dist.barrier()
    dist_checkpointing.save(model.sharded_state_dict(), path)
    dist.barrier()


def load(model, path: str) -> None:
    from megatron.core import dist_checkpointing

    model.load_state_dict(dist_checkpointing.load(model.sharded_state_dict(), path))


# The fused SwiGLU fc1 of a dense MLP or of the routed experts (TEGroupedMLP's weight<i>).
_FC1 = re.compile(r"\.mlp\.(experts\.)?linear_fc1\.weight\d*:")


def check_loaded(model, expected: dict, s, what: str) -> int:
    """Every parameter of ``model`` (GTP shards gathered) equals ``expected``, bit for bit; returns
    how many tensors were compared."""
    got = whole_weights(model, s.backend)
    bad = tensor_mismatches(expected, got)
    if not bad:
        return len(expected)
    if all(_FC1.search(b) for b in bad):
        raise KnownBug("mlm-gtp-swiglu-ckpt",
                       f"{what}: every tensor exact but the fused SwiGLU fc1 ({len(bad)} tensor(s); {bad[0]}): "
                       "the GTP shard's rows are recorded as this rank's [W; V] halves")
    raise CheckFailed(f"{what}: {len(bad)} tensor(s) differ: {'; '.join(bad[:4])}")


@torch.no_grad()
def logprobs_of(model, tokens, s) -> torch.Tensor:
    from grpo import positions, token_logprobs

    model.eval()
    logits = model(tokens, positions(tokens), None)
    return token_logprobs(logits, tokens, s.prompt_len, s.temperature)
