"""Refit: the training model's weights into the whole-weight inference model.

The refit is megatron-core's own, the calls NeMo-RL's colocated Megatron generation makes
(``_reshard_into_inference_model``): ``prepare_swap_model_weights`` (the plan, built once and
cached) and ``swap_model_weights`` over the run's backend. Its result is checked against an
independent gather: every GTP shard all-gathered over its GTP group along dim 0, its padding rows
cut; every other parameter as it is. Shapes must match, the refitted weights must equal that
gather bit for bit and be identical on all ranks. Reports the bytes this rank receives from its
GTP peers (0 with GTP off) and the seconds megatron-core's refit took.
"""

from __future__ import annotations

import re
import time

import torch
from bugs import KnownBug, check
from model import all_gather_rows, plain_copy, tensor_mismatches


def _is_bias(name: str) -> bool:
    return re.search(r"(^|\.)bias\d*$", name) is not None


def new_model_pair() -> None:
    """Forget megatron-core's cached refit plans: it keys them by parallel sizes, not by model,
    so a plan made for the GTP arm would be reused for the GTP-off arm of the same process."""
    from megatron.core.resharding.refit import clear_all_caches

    clear_all_caches()


@torch.no_grad()
def refit(train, infer, s, gtp: int) -> dict:
    import torch.distributed as dist
    from megatron.core.resharding.refit import prepare_swap_model_weights, swap_model_weights

    expected, stats = _gathered(train, infer, s, gtp)
    dst = dict(infer.named_parameters())
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    prepare_swap_model_weights(train, infer, group=None)  # cached until new_model_pair()
    swap_model_weights(train, infer, refit_method=s.backend, group=None)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    wrong = tensor_mismatches(expected, {n: p.detach() for n, p in dst.items()})
    check(not wrong, f"megatron-core's refit left {len(wrong)} of {len(dst)} inference tensors unlike the "
                     f"gathered training weights: {'; '.join(wrong[:4])}")
    # Every rank must now hold the same whole weights: a shard in the wrong place differs.
    sums = [float(p.detach().double().sum()) for p in dst.values()]
    world = dist.get_world_size()
    device = next(iter(dst.values())).device
    rows = all_gather_rows(torch.tensor([sums], dtype=torch.float64, device=device), None, s.backend)
    check(all(torch.equal(rows[0], rows[r]) for r in range(world)),
          "refitted inference weights differ between ranks")
    return {**stats, "refit_tensors": len(dst), "refit_seconds": seconds}


def _gathered(train, infer, s, gtp: int) -> tuple[dict, dict]:
    """The whole weights the inference model must get, gathered independently of megatron-core."""
    import torch.distributed as dist
    from megatron.core.tensor_parallel.gtp_api import is_gtp_param

    src = dict(train.named_parameters())
    dst = dict(infer.named_parameters())
    check(src.keys() == dst.keys(),
          f"training and inference models name different parameters: {sorted(set(src) ^ set(dst))[:6]}")
    gathered = padded = received = experts = 0
    expected = {}
    for name, target in dst.items():
        param = src[name]
        if is_gtp_param(param):
            group_size = dist.get_world_size(param.group)
            check(param.gtp_remat_size == group_size,
                  f"{name}: gtp_remat_size {param.gtp_remat_size} but its group has {group_size} ranks")
            whole = all_gather_rows(plain_copy(param), param.group, s.backend)
            received += (group_size - 1) * param.numel() * param.element_size()
            if param.pad_length:
                whole = whole[: whole.shape[0] - param.pad_length]
                padded += 1
            gathered += 1
            experts += ".mlp.experts." in name
        else:
            whole = plain_copy(param)
            if (_is_bias(name) and whole.dim() == 1 and target.dim() == 1
                    and whole.shape[0] * gtp == target.shape[0] and gtp > 1):
                raise KnownBug("mlm-te-bias-sizing",
                               f"{name}: the GTP training model's bias has {whole.shape[0]} entries, the "
                               f"whole-weight model's {target.shape[0]}: TE sized a replicated bias from the "
                               f"pre-sharded out_features (1/{gtp} too short)")
        check(tuple(whole.shape) == tuple(target.shape),
              f"refit {name}: {'gathered' if is_gtp_param(param) else 'copied'} {tuple(whole.shape)} from the "
              f"training model, the inference model holds {tuple(target.shape)}")
        expected[name] = whole.to(target.dtype)
    return expected, {"refit_gathered": gathered, "refit_padded": padded, "refit_bytes_received": received,
                      "refit_expert_gathered": experts}
