"""GPTModel's layers take their GTP weight-remat group from the model's own pg_collection.

Bug (megatron-core 0.19.2): GPTModel hands LanguageModelEmbedding and the output layer only
``tp_group``, and no leaf layer accepts a ``pg_collection``: VocabParallelEmbedding,
ColumnParallelLinear and RowParallelLinear (and the TE wrappers) each look ``gtp_remat`` up in
the global MPU state, and the attention / MLP blocks pass their collection no further than the
TP group. A model built on a collection whose GTP group differs from MPU's is therefore
sharded along MPU's GTP axis, whatever the collection says.

How: two gloo ranks on CPU, a small GPTModel with the local (non-TE) layer spec.
``test_collection_without_gtp_wins_over_mpu`` initialises MPU with gtp_remat_size=2 and builds
the model on a copy of the MPU collection whose ``gtp_remat`` is a one-rank group: no weight may
come out GTP-sharded (pristine: every linear and the embedding are). The same test first checks
that a model built without a collection still follows MPU, i.e. is sharded as before.
``test_collection_gtp_group_is_used`` goes the other way: MPU at gtp_remat_size=1, collection
with a two-rank gtp group; the embedding and output layer must be sharded over exactly that group.
"""

from __future__ import annotations

import torch.distributed as dist
from _cpu import allow_gtp_shards_without_cuda
from _world import spawn

from megatron.core import parallel_state
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.transformer_config import TransformerConfig

# What this proof fails with on the pristine base (tools' prove checks it): the layers take the GTP group from MPU's state, not the model's pg_collection.
PRISTINE_FAILS = r"^AssertionError: the embedding is (not )?GTP-sharded although the model's pg_collection"

VOCAB, HIDDEN = 512, 128


def _setup_rank(gtp_remat_size: int) -> None:
    allow_gtp_shards_without_cuda()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=1, gtp_remat_size=gtp_remat_size
    )


def _build(pg_collection=None) -> GPTModel:
    config = TransformerConfig(
        num_layers=2,
        hidden_size=HIDDEN,
        num_attention_heads=4,
        ffn_hidden_size=2 * HIDDEN,
        use_cpu_initialization=True,
    )
    return GPTModel(
        config,
        get_gpt_layer_local_spec(),
        vocab_size=VOCAB,
        max_sequence_length=64,
        share_embeddings_and_output_weights=False,
        pg_collection=pg_collection,
    )


def _gtp_sharded(model) -> list[str]:
    return [n for n, p in model.named_parameters() if getattr(p, "is_gtp_weight_remat", False)]


def _group_per_rank(world_size: int, ranks_of) -> dist.ProcessGroup:
    """Every rank creates every group (new_group is collective) and keeps its own."""
    mine = None
    for ranks in ranks_of(world_size):
        group = dist.new_group(ranks)
        if dist.get_rank() in ranks:
            mine = group
    return mine


def _collection_without_gtp(rank, world_size):
    _setup_rank(gtp_remat_size=2)

    # Unchanged default: no collection given -> MPU's gtp_remat (2 ranks) shards the weights.
    default = _build()
    assert "embedding.word_embeddings.weight" in _gtp_sharded(default)
    assert "output_layer.weight" in _gtp_sharded(default)
    assert tuple(default.embedding.word_embeddings.weight.shape) == (VOCAB // 2, HIDDEN)

    pgs = ProcessGroupCollection.use_mpu_process_groups()
    pgs.gtp_remat = _group_per_rank(world_size, lambda n: [[r] for r in range(n)])
    assert pgs.gtp_remat.size() == 1

    model = _build(pgs)
    embedding = model.embedding.word_embeddings
    assert not getattr(embedding.weight, "is_gtp_weight_remat", False), (
        "the embedding is GTP-sharded although the model's pg_collection has a one-rank "
        "gtp_remat group: it took MPU's group"
    )
    assert tuple(embedding.weight.shape) == (VOCAB, HIDDEN)
    assert embedding.gtp_remat_size == 1
    assert not getattr(model.output_layer.weight, "is_gtp_weight_remat", False), (
        "the output layer is GTP-sharded although the model's pg_collection has a one-rank "
        "gtp_remat group: it took MPU's group"
    )
    assert tuple(model.output_layer.weight.shape) == (VOCAB, HIDDEN)
    assert model.output_layer.gtp_remat_size == 1
    leftover = _gtp_sharded(model)
    assert leftover == [], f"these weights followed MPU's gtp_remat, not the collection: {leftover}"


def _collection_gtp_group_is_used(rank, world_size):
    _setup_rank(gtp_remat_size=1)
    pgs = ProcessGroupCollection.use_mpu_process_groups()
    assert pgs.gtp_remat.size() == 1
    pgs.gtp_remat = _group_per_rank(world_size, lambda n: [list(range(n))])

    model = _build(pgs)
    for name, layer in (
        ("embedding", model.embedding.word_embeddings),
        ("output layer", model.output_layer),
    ):
        weight = layer.weight
        assert getattr(weight, "is_gtp_weight_remat", False), (
            f"the {name} is not GTP-sharded although the model's pg_collection has a "
            f"{world_size}-rank gtp_remat group: it took MPU's one-rank group"
        )
        assert weight.group is pgs.gtp_remat
        assert tuple(weight.shape) == (VOCAB // world_size, HIDDEN)
        assert layer.gtp_remat_size == world_size


def test_collection_without_gtp_wins_over_mpu():
    spawn(_collection_without_gtp, 2)


def test_collection_gtp_group_is_used():
    spawn(_collection_gtp_group_is_used, 2)
