"""The refit checked directly, after every refit, in NeMo-RL's own run: harness code, not a patch.

What is wrapped (nothing in NeMo-RL or megatron-core is edited): megatron-core's
``megatron.core.resharding.refit.swap_model_weights`` as NeMo-RL's
``nemo_rl.models.generation.megatron.megatron_worker`` module binds it, i.e. the call in
``MegatronGenerationMixin._reshard_into_inference_model`` that copies the training model into the
dedicated inference model (colocated Megatron generation, the functional script's path). The
module's global name is replaced when the module is imported (``sitecustomize`` in this folder puts
an import hook in place in every Python of the case, Ray's workers included, when
``CARRY_REFIT_CHECK=1``). Calls with one side ``None`` (the non-colocated sender or receiver,
``swap_weights_via_reshard``) go through untouched.

After each colocated refit, on every rank: each training tensor, gathered over its GTP group
independently of the refit (a GTP weight is this rank's contiguous dim-0 rows of the padded
tensor: all-gather, concatenate in group-rank order, drop the last ``pad_length`` rows; it carries
``group``, ``gtp_remat_size`` and ``pad_length``, megatron-core's
``generalized_tensor_parallelism._gtp_attach_attrs``), compared exactly with the inference model's
tensor of the same name. The rank prints::

    [refit-check] step 2: 170 of 170 tensors equal on rank 0

("step k" is the k-th swap, not GRPO step k: NeMo-RL swaps each time it prepares generation, before the
start validation, before each step's generation and before the end validation, 8 swaps for 6 steps,
h100/2026-12-05-learning-passed; learning.harness_metrics judges every one), and the relative
L2 change of the training weights since the first refit::

    [weight-change] step 2: rel_l2 3.1e-04, changed 2.5e-01 of 494032768 elements on rank 0

Mutations, to show the check and the gates go red (``CARRY_REFIT_MUTATION``):
``stale-refit`` skips every refit after the first; ``corrupt-tensor`` negates rank 0's GTP shard of
one tensor (``decoder.layers.0.mlp.linear_fc1.weight``) while it is sent, and restores it after;
``frozen-weights`` puts every training tensor back to what it was at the first refit before each
later one (the optimizer's updates never reach what is sent: every refit is exact, and only the
drift, the ``changed`` figure above, shows it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from carry_after_import import after_import

TARGET = "nemo_rl.models.generation.megatron.megatron_worker"
WRAPPED = "swap_model_weights"
MUTATIONS = ("stale-refit", "corrupt-tensor", "frozen-weights")
CORRUPT_PREFERRED = "linear_fc1.weight"


# -- the comparison (pure: tested on the CPU) -----------------------------------------------------
def gtp_of(param):
    """(group, size, pad_length) for a GTP-sharded weight, else None."""
    size = getattr(param, "gtp_remat_size", 1) or 1
    group = getattr(param, "group", None)
    if size > 1 and group is not None:
        return group, size, int(getattr(param, "pad_length", 0) or 0)
    return None


def dist_all_gather(tensor, group):
    import torch
    import torch.distributed as dist

    out = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, tensor, group=group)
    return out


def full_tensor(param, all_gather=dist_all_gather):
    """The whole logical tensor of a training parameter: a GTP shard gathered over its group, padding cut."""
    import torch

    local = param.detach()
    if type(local) is not torch.Tensor:
        # GTPShardedParam keeps its class through detach (its __torch_function__): collectives and the
        # comparison see the plain tensor of this rank's rows.
        local = local.as_subclass(torch.Tensor)
    info = gtp_of(param)
    if info is None:
        return local
    group, _, pad = info
    whole = torch.cat(all_gather(local.contiguous(), group), dim=0)
    return whole[: whole.shape[0] - pad] if pad else whole


@dataclass
class Report:
    step: int
    rank: int
    equal: int = 0
    total: int = 0
    differ: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.total > 0 and self.equal == self.total

    def line(self) -> str:
        return f"[refit-check] step {self.step}: {self.equal} of {self.total} tensors equal on rank {self.rank}"


def compare(step: int, rank: int, train_named, infer_named: dict, all_gather=dist_all_gather,
            drift: Drift | None = None) -> Report:
    """Every training tensor (sorted by name: every rank gathers in the same order) against the inference one."""
    import torch

    rep = Report(step, rank)
    train = dict(train_named)
    for name in sorted(set(train) | set(infer_named)):
        rep.total += 1
        if name not in train:
            rep.differ.append(f"{name}: only in the inference model")
            continue
        full = full_tensor(train[name], all_gather)
        if drift is not None:
            drift.add(name, full)
        dst = infer_named.get(name)
        if dst is None:
            rep.differ.append(f"{name}: absent from the inference model")
            continue
        dst = dst.detach()
        if tuple(full.shape) != tuple(dst.shape):
            rep.differ.append(f"{name}: shape {tuple(full.shape)} trained, {tuple(dst.shape)} in the inference model")
            continue
        got = full.to(device=dst.device, dtype=dst.dtype)
        if torch.equal(got, dst):
            rep.equal += 1
        else:
            diff = (got.float() - dst.float()).abs()
            rep.differ.append(f"{name}: {int((diff > 0).sum())} of {diff.numel()} elements differ, "
                              f"max |diff| {float(diff.max()):.3g}")
    return rep


class Drift:
    """How far the training weights have moved since the first refit: relative L2 and changed elements."""

    def __init__(self):
        self.start: dict = {}
        self._reset()

    def _reset(self):
        self.diff_sq = self.start_sq = 0.0
        self.changed = self.elements = 0

    def add(self, name: str, full) -> None:
        first = self.start.get(name)
        if first is None:
            self.start[name] = full.detach().to("cpu", copy=True)   # kept on the host: ~1 GB for 0.5B in bf16
            first = self.start[name]
        ref = first.to(full.device)
        self.diff_sq += float((full.float() - ref.float()).pow(2).sum())
        self.start_sq += float(ref.float().pow(2).sum())
        self.changed += int((full != ref).sum())
        self.elements += full.numel()

    def finish(self) -> tuple[float, float, int]:
        out = ((self.diff_sq / self.start_sq) ** 0.5 if self.start_sq else 0.0,
               self.changed / self.elements if self.elements else 0.0, self.elements)
        self._reset()
        return out


# -- the mutations (pure: tested on the CPU) --------------------------------------------------------
def mutation() -> str:
    m = os.environ.get("CARRY_REFIT_MUTATION", "")
    if m and m not in MUTATIONS:
        raise ValueError(f"CARRY_REFIT_MUTATION={m!r} is not one of {', '.join(MUTATIONS)}")
    return m


def transfers(step: int, mode: str) -> bool:
    """Whether refit STEP moves any weights: a stale refit sends only the first."""
    return not (mode == "stale-refit" and step > 1)


def corrupt(train_named, rank: int):
    """Negate rank 0's shard of one GTP-sharded tensor; returns (name, restore) (restore is exact)."""
    gtp = [(n, p) for n, p in sorted(train_named) if gtp_of(p) is not None]
    if not gtp:
        raise RuntimeError("corrupt-tensor: the training model has no GTP-sharded tensor")
    name, param = next(((n, p) for n, p in gtp if n.endswith(CORRUPT_PREFERRED)), gtp[0])
    if rank != 0:
        return name, lambda: None
    param.data.mul_(-1)
    return name, lambda: param.data.mul_(-1)


class Frozen:
    """frozen-weights: each rank keeps its own shards as the first refit saw them (on the host) and
    copies them back in place before every later refit, bit for bit."""

    def __init__(self):
        self.first: dict = {}

    def hold(self, train_named) -> int:
        """Record at the first call; later, put every recorded tensor back. Returns how many were put back."""
        import torch

        held = 0
        with torch.no_grad():
            for name, param in train_named:
                local = param.data
                first = self.first.get(name)
                if first is None:
                    self.first[name] = local.detach().to("cpu", copy=True)
                else:
                    local.copy_(first.to(local.device))
                    held += 1
        return held


# -- the wrapper ---------------------------------------------------------------------------------------
def _named(model):
    from megatron.core.utils import unwrap_model

    chunks = unwrap_model(model)
    chunks = chunks if isinstance(chunks, (list, tuple)) else [chunks]
    if len(chunks) == 1:
        return list(chunks[0].named_parameters())
    return [(f"{i}.{n}", p) for i, c in enumerate(chunks) for n, p in c.named_parameters()]


def _say(text: str) -> None:
    print(text, flush=True)


class _State:
    refits = 0
    drift = Drift()
    frozen = Frozen()


def wrap(original):
    def swap_model_weights(src_model, target_model, *args, **kwargs):
        if src_model is None or target_model is None:
            return original(src_model, target_model, *args, **kwargs)
        import torch
        import torch.distributed as dist

        _State.refits += 1
        step = _State.refits
        rank = dist.get_rank() if dist.is_initialized() else 0
        mode = mutation()
        result = None
        if not transfers(step, mode):
            _say(f"[refit-mutation] stale-refit: step {step}: refit skipped on rank {rank}")
        elif mode == "corrupt-tensor":
            name, restore = corrupt(_named(src_model), rank)
            _say(f"[refit-mutation] corrupt-tensor: step {step}: rank 0's GTP shard of {name} negated in transit")
            try:
                result = original(src_model, target_model, *args, **kwargs)
            finally:
                restore()
        else:
            if mode == "frozen-weights":
                held = _State.frozen.hold(_named(src_model))
                if held:
                    _say(f"[refit-mutation] frozen-weights: step {step}: {held} training tensors put back to the "
                         f"first refit's on rank {rank}")
            result = original(src_model, target_model, *args, **kwargs)
        try:
            with torch.no_grad():
                rep = compare(step, rank, _named(src_model), dict(_named(target_model)), drift=_State.drift)
            _say(rep.line())
            for d in rep.differ[:8]:
                _say(f"[refit-check] detail: step {step}: rank {rank}: {d}")
            rel, frac, n = _State.drift.finish()
            _say(f"[weight-change] step {step}: rel_l2 {rel:.6e}, changed {frac:.6e} of {n} elements on rank {rank}")
        except Exception as exc:  # noqa: BLE001 - said in the log; the step's marker is then missing
            _say(f"[refit-check] error: step {step}: rank {rank}: {type(exc).__name__}: {exc}")
        return result

    swap_model_weights.__wrapped__ = original
    swap_model_weights.carry_refit_check = True
    return swap_model_weights


def patch(module) -> None:
    fn = getattr(module, WRAPPED)
    if not getattr(fn, "carry_refit_check", False):
        setattr(module, WRAPPED, wrap(fn))
        module.CARRY_REFIT_CHECK_WRAPPED = True   # for the dry-run's probe (probe_imports.py --flag)
        _say(f"[refit-check] wrapping {module.__name__}.{WRAPPED} (megatron.core.resharding.refit) in pid "
             f"{os.getpid()}" + (f", mutation {mutation()}" if mutation() else ""))


def install() -> None:
    mutation()   # an unknown mutation stops the process at start, loudly
    after_import(TARGET, patch)
