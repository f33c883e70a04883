"""The mini test's settings: its command line (a named shape, the flags that win over it, the
combinations that cannot work), how its ranks sit on GPUs, and its exit codes."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import sharedgpu

# The first paragraph of run.py's docstring: --help's description.
DESCRIPTION = "GTP GRPO training + refit + checkpoints, end to end, on megatron-core and TransformerEngine alone."
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BUG = 0, 1, 2, 3


@dataclass(frozen=True)
class Settings:
    nproc: int = 2
    backend: str = "gloo"
    gtp: int = 2
    dtype: str = "fp32"
    vocab: int = 512
    hidden: int = 128
    layers: int = 2
    heads: int = 4
    query_groups: int = 2
    ffn: int = 192
    seq: int = 32
    prompts: int = 2
    generations: int = 4
    prompt_len: int = 12
    new_tokens: int = 8
    temperature: float = 1.0
    clip: float = 0.2
    steps: int = 2
    lr: float = 1e-4
    max_error: float = 1.05
    tied: bool = True
    experts: int = 0
    topk: int = 2
    moe_ffn: int = 0
    expert_gtp: int = 1
    compare_gtp_off: bool = False
    precision_aware_optimizer: bool = True
    seed: int = 1234
    timeout: float = 900.0
    shared_gpu: bool = False
    out: str | None = None
    ckpt_dir: str | None = None


# Model shapes by name (--shape); explicit size flags still win over the shape's values.
SHAPES = {
    "qwen2.5-0.5b": dict(vocab=151936, hidden=896, layers=24, heads=14, query_groups=2, ffn=4864, seq=128,
                         prompt_len=32, new_tokens=16),
    # Qwen3-MoE's layout in small: routed SwiGLU experts (TE grouped GEMM), top-2, untied, QKV bias;
    # GTP on both axes.
    "moe-tiny": {"experts": 4, "topk": 2, "moe_ffn": 128, "expert_gtp": 2, "tied": False},
}


def parse_args(argv: list[str]) -> tuple[Settings, bool]:
    """The settings and whether --dry-check was asked; bad usage exits 2 with every problem named."""
    p = _parser()
    shape = p.parse_known_args(argv)[0].shape
    if shape:
        p.set_defaults(**SHAPES[shape])
    a = p.parse_args(argv)
    if a.backend == "nccl" and sharedgpu.requested():
        a.shared_gpu = True   # the night's mode: every NCCL run shares the GPU; gloo ranks do anyway
    s = Settings(**{k: getattr(a, k) for k in Settings.__dataclass_fields__})
    problems = _problems(s)
    if problems:
        p.error("; ".join(problems))
    return s, a.dry_check


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=DESCRIPTION,
                                epilog="exit codes: 0 passed or skipped (SKIP line); 1 a check failed; "
                                       "2 bad usage; 3 a known bug of the gtp series was hit (BUG_HIT line)")
    d = Settings()
    p.add_argument("--nproc", type=int, default=d.nproc, help="ranks to spawn (a multiple of --gtp)")
    p.add_argument("--backend", choices=("gloo", "nccl"), default=d.backend,
                   help="gloo: every rank on cuda:0 (one GPU; plain SGD, as gloo allows); "
                        "nccl: rank r on cuda:r (Megatron DDP and distributed Adam)")
    p.add_argument("--gtp", type=int, default=d.gtp, help="gtp_remat_size of the training layout")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default=d.dtype, help="parameter and compute dtype")
    p.add_argument("--shape", choices=sorted(SHAPES),
                   help="a named model shape (qwen2.5-0.5b: the series' target, its sequence sizes too; "
                        "moe-tiny: routed experts with GTP on both axes)")
    p.add_argument("--vocab", type=int, default=d.vocab)
    p.add_argument("--hidden", type=int, default=d.hidden)
    p.add_argument("--layers", type=int, default=d.layers)
    p.add_argument("--heads", type=int, default=d.heads)
    p.add_argument("--query-groups", type=int, default=d.query_groups)
    p.add_argument("--ffn", type=int, default=d.ffn,
                   help="FFN hidden size; 200 makes fc1 (400 rows) carry GTP padding rows")
    p.add_argument("--seq", type=int, default=d.seq, help="max sequence length")
    p.add_argument("--tied", action=argparse.BooleanOptionalAction, default=d.tied,
                   help="share the embedding and output weights")
    p.add_argument("--experts", type=int, default=d.experts, help="routed experts per MLP (0: dense MLPs)")
    p.add_argument("--topk", type=int, default=d.topk, help="experts per token")
    p.add_argument("--moe-ffn", type=int, default=d.moe_ffn, help="each expert's FFN size (0: --ffn)")
    p.add_argument("--expert-gtp", type=int, default=d.expert_gtp,
                   help="expert_gtp_remat_size of the training layout (1: the expert axis unsharded)")
    p.add_argument("--prompts", type=int, default=d.prompts, help="prompts per rank")
    p.add_argument("--generations", type=int, default=d.generations, help="samples per prompt (GRPO group)")
    p.add_argument("--prompt-len", type=int, default=d.prompt_len)
    p.add_argument("--new-tokens", type=int, default=d.new_tokens)
    p.add_argument("--temperature", type=float, default=d.temperature)
    p.add_argument("--clip", type=float, default=d.clip, help="PPO/GRPO ratio clip epsilon")
    p.add_argument("--steps", type=int, default=d.steps, help="GRPO iterations (refit, sample, train step)")
    p.add_argument("--lr", type=float, default=d.lr, help="learning rate")
    p.add_argument("--max-error", type=float, default=d.max_error,
                   help="gate on token_mult_prob_error and ckpt_token_mult_prob_error")
    p.add_argument("--compare-gtp-off", action="store_true",
                   help="also train with GTP off and report both arms' memory, step and refit cost")
    p.add_argument("--no-precision-aware-optimizer", dest="precision_aware_optimizer", action="store_false",
                   help="bf16 only: Megatron's distributed Adam without TE's precision-aware mode (NeMo-RL "
                        "turns it on; this is for narrowing down a failure, not for a green run)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--timeout", type=float, default=d.timeout, help="seconds before the ranks count as hung")
    p.add_argument("--shared-gpu", action="store_true",
                   help="NCCL ranks all on cuda:0, each process its own NCCL_HOSTID (also on for --backend nccl "
                        f"when {sharedgpu.ENV}=1); times in this mode are not GTP's price, per-rank memory is")
    p.add_argument("--out", help="also write the result JSON to OUT/result.json")
    p.add_argument("--ckpt-dir", help="where the checkpoints go (default: a temporary folder, removed)")
    p.add_argument("--dry-check", action="store_true",
                   help="validate arguments, imports and the megatron-core APIs used; needs no CUDA")
    return p


def _problems(s: Settings) -> list[str]:
    """What in these settings cannot work (each a usage error)."""
    problems = []
    if s.gtp < 2:
        problems.append("--gtp must be at least 2 (GTP off tests nothing; --compare-gtp-off adds that arm)")
    if s.nproc < s.gtp or s.nproc % s.gtp:
        problems.append(f"--nproc {s.nproc} must be a positive multiple of --gtp {s.gtp}")
    if s.experts < 0 or s.expert_gtp < 1 or s.moe_ffn < 0:
        problems.append("--experts, --moe-ffn must be >= 0 and --expert-gtp >= 1")
    elif s.experts:
        if not 1 <= s.topk <= s.experts:
            problems.append(f"--topk {s.topk} must be between 1 and --experts {s.experts}")
        if s.nproc < s.expert_gtp or s.nproc % s.expert_gtp:
            problems.append(f"--nproc {s.nproc} must be a positive multiple of --expert-gtp {s.expert_gtp}")
    elif s.expert_gtp > 1:
        problems.append("--expert-gtp needs --experts (a dense model has no expert axis)")
    if s.compare_gtp_off and s.backend == "gloo" and s.experts and s.expert_gtp > 1:
        problems.append("--compare-gtp-off compares trained arms: expert GTP over gloo skips its train step")
    if s.prompt_len + s.new_tokens > s.seq:
        problems.append(f"--prompt-len + --new-tokens ({s.prompt_len + s.new_tokens}) exceeds --seq {s.seq}")
    if s.hidden % s.heads or s.heads % s.query_groups:
        problems.append("--hidden must be divisible by --heads, and --heads by --query-groups")
    if s.generations < 2:
        problems.append("--generations must be at least 2 (GRPO advantages compare samples of a prompt)")
    if s.temperature <= 0:
        problems.append("--temperature must be positive (greedy samples give a GRPO group no signal)")
    if s.steps < 2:
        problems.append("--steps must be at least 2 (a refit after an optimiser step is the point)")
    if s.lr <= 0:
        problems.append("--lr must be positive")
    if s.shared_gpu and s.backend != "nccl":
        problems.append("--shared-gpu is for --backend nccl (gloo ranks share cuda:0 already)")
    return problems


def gpu_mode(s: Settings) -> str:
    """How the ranks sit on GPUs: ``gloo-one-gpu``, ``gpu-per-rank`` (NCCL) or ``shared-gpu`` (NCCL)."""
    if s.backend == "gloo":
        return "gloo-one-gpu"
    return "shared-gpu" if s.shared_gpu else "gpu-per-rank"
