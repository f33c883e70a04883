"""Bridge's checkpointing counts GTP peers as distinct data-parallel replicas.

Bug (megatron-bridge 0.6.2, ``training/checkpointing.py``): every place that derives a replica
id, gathers RNG state, records the data group in the sharded-state-dict metadata, or hands a
group to ``FullyParallel{Save,Load}StrategyWrapper`` uses ``pg_collection.dp_cp``. That group
leaves out the gtp_remat axis, so the two GTP peers of a TP1 x GTP2 run are each rank 0 of a
one-rank group: both claim replica 0 of every object GTP does not shard (the RNG state, norm
weights) and megatron-core's sharding validation refuses the save. The full data group is
``dp_cp_gtp_remat``; it equals ``dp_cp`` when GTP is off.

How: two gloo ranks on CPU, ``initialize_model_parallel(tensor_model_parallel_size=1,
gtp_remat_size=2)``, Bridge's own functions on real megatron-core, no GTP-sharded parameters
(a small module stands in for the GTP layer's per-peer shard by declaring it with
``ShardedTensor`` offsets, as the GTP layers do).

- ``test_rng_state_replica_ids``: ``get_rng_state`` must give the two peers different replica
  ids and, with ``data_parallel_random_init``, gather both peers' states.
- ``test_rng_state_expert_parallel_shards``: with EP 2 the RNG state is sharded by the data
  rank instead; the two peers must get different shards.
- ``test_save_load_round_trip``: ``save_checkpoint`` (fully parallel save) of a model with a
  GTP-replicated norm weight and a GTP-split weight, then ``load_checkpoint`` into a zeroed
  model. Pristine: the save fails validation ("Invalid access pattern", "Duplicate
  ShardedObject keys"); patched: values and step come back and the save strategy spans both
  peers. Load validates too, so the metadata group on the load side is checked as well.
- ``test_fully_parallel_loads_span_gtp_peers``: a checkpoint both trees can write (only per-peer
  shards, no RNG) is read back through ``load_checkpoint`` and
  ``_load_model_weights_from_checkpoint`` with ``fully_parallel_load``; each load wrapper's group
  must span both peers, so megatron-core really distributes the load.

Python 3.11 and a CPU-only torch need three narrow aids, each a no-op where the real thing
exists: ``typing.override`` (3.12+, used by megatron-core's ``megatron.training``) comes from
``typing_extensions``; Bridge's ``peft/lora_layers.py`` imports ``transformer_engine.pytorch``
unconditionally, and TE only exists for CUDA, so that one module (and nothing else) is handed an
inert placeholder it only touches in annotations; and in the ranks the CUDA-only calls that the
save and load make on a CPU build (``torch.cuda.get_rng_state``, ``synchronize``,
``current_device``) get their CPU meaning. Models here hold no tensor that two ranks of a
fully parallel load both need: megatron-core exchanges those through CUDA. Not exercised: the two
local (non-persistent) checkpoint sites, which need nvidia-resiliency-ext and a CUDA exchange.
"""

from __future__ import annotations

import importlib.util
import logging
import random
import sys
import typing

import torch
import torch.distributed as dist
from _cpu import BridgeWithoutTE, allow_dist_checkpoints_without_cuda
from _world import spawn

STEP = 3
HIDDEN = 8


# ---------------------------------------------------------------------------------------------
# Importing Bridge's checkpointing module on a CPU-only Python 3.11 machine.


def _import_bridge_checkpointing():
    if not hasattr(typing, "override"):
        import typing_extensions

        typing.override = typing_extensions.override
    hook = None
    if importlib.util.find_spec("transformer_engine") is None:
        hook = BridgeWithoutTE()
        sys.meta_path.insert(0, hook)
    try:
        import megatron.bridge.training.checkpointing as checkpointing
    finally:
        if hook is not None:
            sys.meta_path.remove(hook)
    return checkpointing


# Imported once here; the forked ranks inherit it (it takes ~20 s).
ckpt = _import_bridge_checkpointing()

from megatron.core import parallel_state, tensor_parallel  # noqa: E402
from megatron.core.num_microbatches_calculator import init_num_microbatches_calculator  # noqa: E402
from megatron.core.dist_checkpointing.mapping import ShardedTensor  # noqa: E402
from megatron.core.process_groups_config import ProcessGroupCollection  # noqa: E402
from megatron.core.transformer.module import MegatronModule  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402
from megatron.bridge.training import config as bridge_config  # noqa: E402
from megatron.bridge.training.state import GlobalState  # noqa: E402

# What this proof fails with on the pristine base (tools' prove checks it): both GTP peers claim replica 0.
PRISTINE_FAILS = r"GTP peers (claim the same replica|write the same RNG shard)|fully parallel load left out a GTP peer|Invalid access pattern for ShardedTensor"


# ---------------------------------------------------------------------------------------------
# Per-rank setup.


def _cpu_meaning_of_cuda_calls() -> None:
    """A CPU build of torch raises on these; here they mean what they mean without a GPU."""
    if torch.cuda.is_available():
        return
    empty_generator_state = torch.zeros(16, dtype=torch.uint8)
    torch.cuda.get_rng_state = lambda device="cuda": empty_generator_state.clone()
    allow_dist_checkpoints_without_cuda()


def _setup_rank(expert_model_parallel_size: int = 1) -> ProcessGroupCollection:
    _cpu_meaning_of_cuda_calls()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=1,
        gtp_remat_size=2,
        expert_model_parallel_size=expert_model_parallel_size,
    )
    pgc = ProcessGroupCollection.use_mpu_process_groups()
    # The layout the bug needs: GTP peers share dp_cp rank 0 of a one-rank group.
    assert pgc.gtp_remat.size() == 2 and pgc.dp_cp.size() == 1, pgc
    assert pgc.dp_cp_gtp_remat.size() == 2, pgc
    # What the training loop sets up before it saves or resumes: the seeds (the model-parallel
    # RNG tracker is part of the saved RNG state) and the microbatch calculator a resume updates.
    random.seed(1234)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    init_num_microbatches_calculator(
        dist.get_rank(), global_batch_size=2, micro_batch_size=1, data_parallel_size=2
    )
    return pgc


def _transformer_config() -> TransformerConfig:
    return TransformerConfig(num_layers=1, hidden_size=HIDDEN, num_attention_heads=1)


class _GtpReplicated(MegatronModule):
    """A weight GTP does not shard (like a norm weight): every GTP peer holds all of it."""

    def __init__(self, config):
        super().__init__(config)
        self.weight = torch.nn.Parameter(torch.arange(HIDDEN, dtype=torch.float32) + 1)


class _GtpSplit(MegatronModule):
    """A weight GTP shards along dim 0: each peer holds its own half, declared with offsets."""

    def __init__(self, config):
        super().__init__(config)
        rank = parallel_state.get_gtp_weight_remat_rank()
        self.weight = torch.nn.Parameter(torch.full((2, HIDDEN), 10.0 * (rank + 1)))

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        group = parallel_state.get_gtp_weight_remat_group()
        key = f"{prefix}weight"
        return {
            key: ShardedTensor.from_rank_offsets(
                key, self.weight, *sharded_offsets, (0, group.rank(), group.size()), replica_id=0
            )
        }


class _Model(MegatronModule):
    def __init__(self, config, replicated: bool = True):
        super().__init__(config)
        if replicated:
            self.norm = _GtpReplicated(config)
        self.proj = _GtpSplit(config)


def _state(save_dir: str, **checkpoint) -> GlobalState:
    config = bridge_config.ConfigContainer(
        train=bridge_config.TrainingConfig(),
        model=_transformer_config(),
        optimizer=bridge_config.OptimizerConfig(),
        scheduler=bridge_config.SchedulerConfig(),
        dataset=None,
        logger=bridge_config.LoggerConfig(),
        tokenizer=bridge_config.TokenizerConfig(),
        checkpoint=bridge_config.CheckpointConfig(
            save=save_dir,
            load=save_dir,
            ckpt_format="torch_dist",
            async_save=False,
            save_optim=False,
            load_optim=False,
            **checkpoint,
        ),
    )
    state = GlobalState()
    state.cfg = config
    state.train_state.step = STEP
    return state


def _gather(value):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


# ---------------------------------------------------------------------------------------------
# Rank bodies.


def _rng_state(pgc, data_parallel_random_init=False):
    return ckpt.get_rng_state(
        data_parallel_random_init=data_parallel_random_init,
        ckpt_format="torch_dist",
        pg_collection=pgc,
    )


def _rng_state_replica_ids(rank, world_size):
    pgc = _setup_rank()
    rng = _rng_state(pgc)
    ids = _gather((rng.key, rng.global_offset, rng.replica_id))
    assert len(set(ids)) == world_size, (
        f"GTP peers claim the same replica of {rng.key}: (key, offset, replica_id) per rank = "
        f"{ids}"
    )
    rng = _rng_state(pgc, data_parallel_random_init=True)
    assert len(rng.data) == world_size, (
        f"RNG state gathered from {len(rng.data)} rank(s), not from both GTP peers"
    )


def _rng_state_expert_parallel_shards(rank, world_size):
    pgc = _setup_rank(expert_model_parallel_size=2)
    assert pgc.ep.size() == 2, pgc
    rng = _rng_state(pgc)
    ids = _gather((rng.key, rng.global_shape, rng.global_offset, rng.replica_id))
    assert len(set(ids)) == world_size, (
        f"GTP peers write the same RNG shard under EP: (key, shape, offset, replica_id) per "
        f"rank = {ids}"
    )


def _ranks(group) -> list[int]:
    return dist.get_process_group_ranks(group)


def _save_load_round_trip(rank, world_size, save_dir):
    pgc = _setup_rank()
    state = _state(save_dir, fully_parallel_save=True)
    model = _Model(_transformer_config())
    expected = {k: v.detach().clone() for k, v in model.state_dict().items()}
    saved_random_state = random.getstate()
    context = {}
    # Pristine: megatron-core rejects the save ("Invalid access pattern"), both peers replica 0.
    ckpt.save_checkpoint(
        state, [model], None, None, 0, checkpointing_context=context, pg_collection=pgc
    )
    save_group = context["save_strategy"].parallelization_group
    assert _ranks(save_group) == [0, 1], "fully parallel save left out a GTP peer"

    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    state.train_state.step = 0
    random.random()
    step, _ = ckpt.load_checkpoint(state, [model], None, None, pg_collection=pgc)
    assert step == STEP
    for key, value in model.state_dict().items():
        assert torch.equal(value, expected[key]), (key, value, expected[key])
    assert random.getstate() == saved_random_state, "RNG state did not round-trip"


def _fully_parallel_loads(rank, world_size, save_dir):
    pgc = _setup_rank()
    model = _Model(_transformer_config(), replicated=False)
    expected = model.proj.weight.detach().clone()
    state = _state(save_dir, save_rng=False, load_rng=False, fully_parallel_load=True)
    ckpt.save_checkpoint(state, [model], None, None, 0, pg_collection=pgc)

    # Through load_checkpoint -> _load_global_dist_base_checkpoint.
    with torch.no_grad():
        model.proj.weight.zero_()
    context = {}
    step, _ = ckpt.load_checkpoint(
        state, [model], None, None, checkpointing_context=context, pg_collection=pgc
    )
    assert step == STEP and torch.equal(model.proj.weight, expected)
    load_group = context["load_strategy"].parallelization_group
    assert _ranks(load_group) == [0, 1], "fully parallel load left out a GTP peer"

    # Through _load_model_weights_from_checkpoint, whose wrapper is not returned: megatron-core
    # logs "Apply load parallelization" only when the wrapper's group has more than one rank.
    with torch.no_grad():
        model.proj.weight.zero_()
    records = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = lambda record: records.append(record.getMessage())
    fp_logger = logging.getLogger("megatron.core.dist_checkpointing.strategies.fully_parallel")
    fp_logger.addHandler(handler)
    fp_logger.setLevel(logging.DEBUG)
    try:
        iter_dir = ckpt.get_checkpoint_name(save_dir, STEP, release=False)
        ckpt._load_model_weights_from_checkpoint(iter_dir, [model], fully_parallel_load=True)
    finally:
        fp_logger.removeHandler(handler)
    assert torch.equal(model.proj.weight, expected)
    assert "Apply load parallelization" in records, (
        "_load_model_weights_from_checkpoint did not distribute the load over the GTP peers: "
        f"{records}"
    )


# ---------------------------------------------------------------------------------------------


def test_rng_state_replica_ids():
    spawn(_rng_state_replica_ids, 2)


def test_rng_state_expert_parallel_shards():
    spawn(_rng_state_expert_parallel_shards, 2)


def test_save_load_round_trip(tmp_path):
    spawn(_save_load_round_trip, 2, str(tmp_path))


def test_fully_parallel_loads_span_gtp_peers(tmp_path):
    spawn(_fully_parallel_loads, 2, str(tmp_path))
