"""One GRPO iteration's pieces: sampling, log-probs, the clipped loss, the optimiser step.

``Trainer`` is the training side as NeMo-RL's Megatron policy worker runs it over NCCL: Megatron
DDP (overlapped gradient reduce and parameter gather) and Megatron's distributed Adam, the
settings of NeMo-RL's grpo_math_1B_megatron.yaml; before refit and sampling the parameter
all-gather is forced and the forward pre-hook turned off, as that worker does. On gloo Megatron
DDP cannot reduce CUDA gradients (allreduce_coalesced), so there the step is plain SGD on the
same gradients: GTP's reduce-scatter mean for GTP shards, an all-reduce mean for the rest.
"""

from __future__ import annotations

import math
import time

import torch
from bugs import check
from model import all_reduce_sum, for_comm


def positions(tokens: torch.Tensor) -> torch.Tensor:
    return torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0).expand_as(tokens).contiguous()


@torch.no_grad()
def generate(model, prompts: torch.Tensor, s, gen: torch.Generator):
    """Sample ``new_tokens`` tokens (full recompute each step); return tokens and their log-probs."""
    model.eval()
    tokens, lps = prompts, []
    for _ in range(s.new_tokens):
        logits = model(tokens, positions(tokens), None)
        check(tuple(logits.shape) == (tokens.shape[0], tokens.shape[1], s.vocab),
              f"inference logits have shape {tuple(logits.shape)}")
        logp = torch.log_softmax(logits[:, -1, :].float() / s.temperature, dim=-1)
        nxt = torch.multinomial(logp.exp(), 1, generator=gen)
        lps.append(logp.gather(-1, nxt))
        tokens = torch.cat([tokens, nxt], dim=1)
    return tokens, torch.cat(lps, dim=1)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, start: int, temperature: float) -> torch.Tensor:
    """log p(tokens[:, t]) for t >= start, from logits at t - 1."""
    logp = torch.log_softmax(logits[:, start - 1 : -1, :].float() / temperature, dim=-1)
    return logp.gather(-1, tokens[:, start:].unsqueeze(-1)).squeeze(-1)


def mult_prob_error(lp_a: torch.Tensor, lp_b: torch.Tensor, mask: torch.Tensor) -> tuple[float, float, float]:
    """(sum of exp|lp_a - lp_b| over the mask, token count, max |lp_a - lp_b|), NeMo-RL's metric."""
    diff = (lp_a - lp_b).abs()
    return float((torch.exp(diff) * mask).sum()), float(mask.sum()), float((diff * mask).max())


def grpo_loss(lp, lp_old, advantages, mask, clip: float) -> torch.Tensor:
    ratio = torch.exp(lp - lp_old)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip, 1.0 + clip) * advantages
    return -(torch.minimum(unclipped, clipped) * mask).sum() / mask.sum()


def advantages(tokens: torch.Tensor, s) -> torch.Tensor:
    """A toy reward (prefer high token ids), normalised within each prompt's group of samples."""
    rewards = tokens[:, s.prompt_len:].float().mean(dim=1) / s.vocab
    grouped = rewards.view(-1, s.generations)
    return ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)).view(-1, 1)


class Trainer:
    def __init__(self, module, config, s, gtp: int):
        self.module, self.s, self.gtp = module, s, gtp
        self.ddp = s.backend == "nccl"
        if self.ddp:
            from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
            from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

            bf16 = s.dtype == "bf16"
            ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=False, overlap_grad_reduce=True,
                                                       overlap_param_gather=True, use_distributed_optimizer=True)
            self.model = DistributedDataParallel(config=config, ddp_config=ddp_config, module=module)
            self.optimizer = get_megatron_optimizer(
                OptimizerConfig(optimizer="adam", lr=s.lr, min_lr=s.lr, weight_decay=0.01, bf16=bf16,
                                params_dtype=torch.float32, adam_beta1=0.9, adam_beta2=0.999, adam_eps=1e-8,
                                use_distributed_optimizer=True,
                                use_precision_aware_optimizer=bf16 and s.precision_aware_optimizer,
                                clip_grad=1.0),
                [self.model])
        else:
            from megatron.core.tensor_parallel.gtp_api import is_gtp_param

            self.model = module
            for p in module.parameters():
                if is_gtp_param(p):
                    p.main_grad = torch.zeros(p.shape, dtype=p.dtype, device=p.device)

    def for_inference(self) -> None:
        """Parameters current everywhere, no pending gather: what refit and sampling read."""
        if self.ddp:
            self.model.disable_forward_pre_hook(param_sync=True)

    def for_training(self) -> None:
        if self.ddp:
            self.model.enable_forward_pre_hook()
            self.model.zero_grad_buffer()
            self.optimizer.zero_grad()

    def step(self, loss: torch.Tensor) -> dict:
        """Backward, gradient checks, reduction, update. Returns the seconds and the grad norm."""
        from megatron.core.tensor_parallel.gtp_api import is_gtp_param

        t0 = time.perf_counter()
        loss.backward()
        if self.ddp:
            from megatron.core.distributed import finalize_model_grads

            finalize_model_grads([self.model])
        torch.cuda.synchronize()
        # One float64 norm per gradient says it all: bf16/fp32 squares cannot overflow float64, so the
        # norm is finite exactly when every element is, and 0 exactly when all are.
        names, norms = [], []
        for name, p in self.module.named_parameters():
            g = getattr(p, "main_grad", None) if (self.ddp or is_gtp_param(p)) else p.grad
            if g is None:
                continue
            names.append((name, is_gtp_param(p)))
            norms.append(torch.linalg.vector_norm(g, dtype=torch.float64))
        norms = torch.stack(norms).tolist()
        bad = [n for (n, _), v in zip(names, norms) if not math.isfinite(v)]
        check(not bad, f"non-finite gradients: {bad[:5]}")
        zero = [n for (n, gtp), v in zip(names, norms) if gtp and v == 0]
        check(not zero, f"GTP-sharded weights with an all-zero gradient: {zero[:5]}")
        if self.ddp:
            ok, grad_norm, _ = self.optimizer.step()
            check(ok, "the optimizer skipped its update (found inf/nan)")
        else:
            grad_norm = self._sgd()
        # Every element finite, the norm not: gradients so large that their squares overflow.
        # Name the largest, as measured before the optimizer clips them (by an infinite norm: to 0).
        if not math.isfinite(float(grad_norm)):
            ranked = sorted(zip(norms, names), key=lambda r: -r[0])[:4]
            check(False, f"the gradient norm is {float(grad_norm)} although every gradient element is "
                         "finite; largest gradient norms before clipping: " + "; ".join(
                             f"{n}{' (GTP)' if gtp else ''} {v:.3g}" for v, (n, gtp) in ranked))
        torch.cuda.synchronize()
        return {"step_seconds": time.perf_counter() - t0, "grad_norm": float(grad_norm)}

    @torch.no_grad()
    def _sgd(self) -> float:
        import torch.distributed as dist
        from megatron.core.tensor_parallel.gtp_api import is_gtp_param

        world = dist.get_world_size()
        gtp_sq = other_sq = 0.0
        for p in self.module.parameters():
            if is_gtp_param(p):
                g = p.main_grad  # already GTP's reduce-scatter mean
                gtp_sq += float(g.double().pow(2).sum())
            else:
                if p.grad is None:
                    continue
                flat = for_comm(p.grad, self.s.backend)
                dist.all_reduce(flat)
                g = flat.to(p.device) / world
                other_sq += float(g.double().pow(2).sum())
            p.add_(g.to(p.dtype), alpha=-self.s.lr)
            p.grad = None
            if is_gtp_param(p):
                p.main_grad.zero_()
        (gtp_sq,) = all_reduce_sum([gtp_sq], self.s.backend)  # shards: the sum over peers is the whole
        return math.sqrt(gtp_sq / (world // self.gtp) + other_sq)
