"""The output layer accepts the tied embedding weight when that weight is a GTP shard.

Bug (megatron-core 0.19.2): with ``share_embeddings_and_output_weights=True`` GPTModel hands its
output layer (a ColumnParallelLinear built with ``skip_weight_param_allocation``) the embedding
weight at every forward. Under GTP weight rematerialization that weight is this rank's GTP
shard, and ``ColumnParallelLinear.forward`` compares the shard's local shape with the logical
one: "supplied weight's shape is (256, 128), not (512, 128) as expected", although the forward
would all-gather the shard to (512, 128) right after the check. Any GTP run with tied
embeddings stops at its first forward.

How: two gloo ranks on CPU, MPU initialised with gtp_remat_size=2, a small GPTModel (local layer
spec) with tied embeddings. The real output layer is called the way GPTModel calls it, with
``shared_embedding_or_output_weight()`` (a real GTP shard); it must accept it, also for a
vocabulary that needs GTP alignment padding (500 rows, shards of 256, pad_length 12). The guard
must still reject a plain tensor of the wrong shape, a plain tensor that merely has the shard's
local shape, and a real GTP shard whose logical row count is wrong.

The all-gather and matmul behind the guard need CUDA streams and TransformerEngine, so the
output layer's ``_forward_impl`` (the step after the guard) is replaced on that one instance by
a recorder; everything up to it, the guard included, is the real code.
"""

from __future__ import annotations

import pytest
import torch
from _cpu import allow_gtp_shards_without_cuda
from _world import spawn

from megatron.core import parallel_state
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.tensor_parallel.layers import VocabParallelEmbedding
from megatron.core.transformer.transformer_config import TransformerConfig

# What this proof fails with on the pristine base (tools' prove checks it): the guard compares the GTP shard's local shape with the logical one.
PRISTINE_FAILS = r"^RuntimeError: supplied weight's shape is \(\d+, \d+\), not \(\d+, \d+\) as expected"

HIDDEN = 128


def _config() -> TransformerConfig:
    return TransformerConfig(
        num_layers=1,
        hidden_size=HIDDEN,
        num_attention_heads=4,
        ffn_hidden_size=2 * HIDDEN,
        use_cpu_initialization=True,
    )


def _tied_model(vocab: int) -> GPTModel:
    return GPTModel(
        _config(),
        get_gpt_layer_local_spec(),
        vocab_size=vocab,
        max_sequence_length=64,
        share_embeddings_and_output_weights=True,
    )


def _record_matmul_inputs(layer) -> list:
    """Replace the GTP all-gather + matmul after the guard (CUDA/TE only) with a recorder."""
    seen = []

    def forward_impl(input, weight, *args, **kwargs):
        seen.append(weight)
        return input.new_zeros(*input.shape[:-1], layer.output_size_per_partition)

    layer._forward_impl = forward_impl
    return seen


def _guard(rank, world_size):
    allow_gtp_shards_without_cuda()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, gtp_remat_size=2)
    hidden = torch.zeros(4, 1, HIDDEN)

    for vocab, shard_rows, pad_length in ((512, 256, 0), (500, 256, 12)):
        model = _tied_model(vocab)
        output_layer = model.output_layer
        assert output_layer.weight is None and output_layer.gtp_remat_size == world_size
        tied = model.shared_embedding_or_output_weight()
        assert getattr(tied, "is_gtp_weight_remat", False)
        assert tuple(tied.shape) == (shard_rows, HIDDEN) and tied.pad_length == pad_length

        seen = _record_matmul_inputs(output_layer)
        # As GPTModel's _postprocess does; unpatched this raises
        # "supplied weight's shape is (256, 128), not (512, 128) as expected".
        logits, _ = output_layer(hidden, weight=tied)
        assert len(seen) == 1 and seen[0] is tied
        assert tuple(logits.shape) == (4, 1, vocab)

    # Still rejected: wrong shapes, also ones that only look like the shard.
    model = _tied_model(512)
    output_layer = model.output_layer
    _record_matmul_inputs(output_layer)
    for wrong in (torch.zeros(300, HIDDEN), torch.zeros(256, HIDDEN), torch.zeros(512, 64)):
        with pytest.raises(RuntimeError, match="supplied weight's shape"):
            output_layer(hidden, weight=wrong)
    # A real GTP shard of a 256-row vocabulary gathers to 256 rows, not 512.
    small = VocabParallelEmbedding(256, HIDDEN, init_method=torch.nn.init.zeros_, config=_config())
    assert getattr(small.weight, "is_gtp_weight_remat", False)
    with pytest.raises(RuntimeError, match="supplied weight's shape"):
        output_layer(hidden, weight=small.weight)


def test_tied_gtp_weight_passes_shape_guard():
    spawn(_guard, 2)
