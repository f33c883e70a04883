#!/usr/bin/env python3
"""GTP GRPO training + refit + checkpoints, end to end, on megatron-core and TransformerEngine alone.

What a GRPO run with GTP does to a model, without NeMo-RL, Ray or vLLM (rank.py has the steps):
a torch_dist checkpoint written with GTP off is loaded into the GTP-sharded training model (every
tensor exact); ``--steps`` GRPO iterations refit a whole-weight inference model built on
``build_inference_pg_collection``, sample from it, compare the training model's log-probs of the
samples (``token_mult_prob_error`` below ``--max-error``, NeMo-RL's gate of 1.05) and take an
optimiser step (Megatron DDP and distributed Adam over NCCL; plain SGD on gloo); the trained
model writes a GTP checkpoint that a whole-weight model must read back exactly
(``ckpt_token_mult_prob_error``). GTP runs with its defaults. The model is Qwen2.5's shape in
small: TE spec, tied embeddings, SwiGLU, QKV bias, RMSNorm, rope, GQA; ``--dtype fp32`` or
``bf16``. ``--shape moe-tiny`` makes every MLP routed experts (grouped GEMM, top-2, untied) with GTP
on both axes; over gloo its training step is skipped by name (``train_step: skipped: gloo has
no coalesced collectives``) and the rest still runs. ``--compare-gtp-off`` then trains the same
way with GTP off and reports both arms'
cost per rank (memory of parameters, gradients and optimiser state; peak; step time; refit time
and bytes received) and their ratios.

The last line on stdout is one JSON object with the metrics (for tools/nightly.py's judge).
On a tree without the gtp series' fixes the run stops at the first known bug it meets and
prints ``BUG_HIT: <patch id>: <message>`` (ids as in patches/gtp/series.toml).
Without CUDA, or where megatron-core reports ``HAVE_GTP`` False, it prints ``SKIP: <reason>``
and exits 0: a skip, never a pass.

Run (one GPU, two gloo ranks on cuda:0; or two GPUs with NCCL, rank r on cuda:r; or, with
``--shared-gpu``, two NCCL ranks on one GPU):
    PYTHONPATH=<megatron-lm tree>:<TE site> python integration/gtp_refit_mini/run.py --nproc 2 --backend gloo
    PYTHONPATH=<megatron-lm tree>:<TE site> python integration/gtp_refit_mini/run.py --nproc 2 --backend nccl --dtype bf16
    PYTHONPATH=<megatron-lm tree>:<TE site> python integration/gtp_refit_mini/run.py --nproc 2 --backend nccl --shared-gpu

The shared-GPU mode (``--shared-gpu``, or ``CARRY_SHARED_GPU=1`` in the environment, which is how
tools/nightly.py --shared-gpu turns it on): every NCCL rank runs on cuda:0, each process with an
``NCCL_HOSTID`` of its own set before its process group exists, so NCCL takes the ranks for two hosts
and joins them over its socket transport instead of refusing a duplicate GPU. What is exact is
exact in that mode, and each process has its own allocator, so per-rank memory still counts; its
times and bandwidths are not GTP's price, and the result line says so (``gpu_mode``, ``timing_note``).
``--dry-check`` validates the arguments, the imports and the megatron-core APIs used, without CUDA.

The test is split by concept beside this launcher: settings (the command line), launcher (the
ranks spawned and watched, the verdict), report (metrics, problems, the result line), drycheck
(``--dry-check``), and what each rank does: bugs, model, refit, grpo, ckpt, rank. It stays
standalone: it imports nothing from the repository's tools, so it runs from a copy of this
folder inside any image.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bugs import CheckFailed  # noqa: E402
from drycheck import dry_check  # noqa: E402
from launcher import launch  # noqa: E402
from settings import EXIT_FAILED, EXIT_OK, EXIT_USAGE, parse_args  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    try:
        s, dry = parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:
        return EXIT_USAGE if exc.code else EXIT_OK
    if dry:
        return dry_check(s)
    try:
        return launch(s)
    except CheckFailed as exc:
        print(f"FAIL: {exc}", flush=True)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
