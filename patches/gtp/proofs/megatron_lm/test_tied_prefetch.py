"""A tied-embedding GPT trains under GTP's defaults (weight prefetch, asynchronous reduce-scatter).

Bug (megatron-core 0.19.2): GTP's prefetch chain links the GTP weights in first-use order and
assumes each is used once per pass. With ``share_embeddings_and_output_weights`` the embedding
weight, the head of the chain, is used again by the output layer, last in forward and so first
in backward. There its backward gather takes the "prefetched" path because the weight has a
chain successor, although nothing prefetched it: ``KeyError: None`` in ``_get_prefetched_weight``
(``cache.get(ticket)``) at the first backward, whether or not ``classify_gtp_remat_chains`` ran.
Its reduce-scatter then also "finalizes" its successor (the first decoder weight), which has not
reduce-scattered in this backward yet: a ticket that is not reserved (``KeyError: None``), or in
later steps the previous step's gradient added a second time. NeMo-RL and Megatron-Bridge never
change GTP's config, and Qwen2.5-0.5B is tied.

How: two processes on one GPU (gloo). The Qwen2.5 shape in small (TE spec, tied embeddings,
SwiGLU, QKV bias, RMSNorm, rope, GQA; fp32) is built with GTP off and run for three steps on fixed
tokens: forward, backward, then every weight moves by a fixed pseudo-random step. The same model
with gtp_remat 2 and GTP's defaults (asserted, not set) starts from the same weights and takes
the same steps: at every step its logits and every gradient (a GTP weight's ``main_grad`` after
the end-of-backward drain that Megatron's finalize_model_grads does, against its rows of the
GTP-off gradient) must match the GTP-off model (atol 1e-4, rtol 1e-3). Moving the weights
between steps makes a stale gather or a gradient counted twice visible. Variants: with
``classify_gtp_remat_chains`` (Megatron-LM's training loop) and without (Bridge and NeMo-RL).
"""

from __future__ import annotations

import pytest
import torch
from _te_gpt import (
    GPU_ONLY,
    assert_gtp_at_its_defaults,
    build_qwen_like,
    fixed_tokens,
    gtp_rows,
    load_gtp_off_params,
    model_parallel,
)
from _world import spawn

# What this proof fails with on the pristine base (tools' prove checks it): GTP's prefetch of the tied embedding (GPU; the base has the patches it requires).
PRISTINE_FAILS = r"KeyError: None"

pytestmark = GPU_ONLY

GTP = 2
VOCAB, HIDDEN, FFN = 512, 128, 192
BATCH, SEQ, STEPS = 2, 16, 3
LOGITS_TOL = dict(atol=1e-4, rtol=1e-4)
GRAD_TOL = dict(atol=1e-4, rtol=1e-3)


def _build(gtp):
    return build_qwen_like(gtp, vocab=VOCAB, seq=SEQ, hidden=HIDDEN, ffn=FFN, qkv_bias=True)


def _step_delta(step: int, name: str, shape) -> torch.Tensor:
    """The same weight move for a parameter in both models (the GTP one takes its rows)."""
    seed = 7919 * (step + 1) + sum(map(ord, name))
    return 0.02 * torch.randn(shape, generator=torch.Generator().manual_seed(seed)).cuda()


def _train(rank, world_size, classify):
    torch.cuda.set_device(0)
    from megatron.core.tensor_parallel.gtp_api import (
        classify_gtp_remat_chains,
        is_gtp_param,
        wait_for_gtp_grad_reduction_on_current_stream,
    )

    assert_gtp_at_its_defaults()
    (tokens,), positions = fixed_tokens(VOCAB, BATCH, SEQ)

    # GTP off: logits and gradients of every step.
    with model_parallel(gtp=1):
        ref = _build(gtp=1)
        start = {n: p.detach().clone() for n, p in ref.named_parameters()}
        ref_logits, ref_grads = [], []
        for step in range(STEPS):
            logits = ref(tokens, positions, None)
            (logits.float() ** 2).mean().backward()
            ref_logits.append(logits.detach().clone())
            ref_grads.append({n: p.grad.detach().clone() for n, p in ref.named_parameters()})
            with torch.no_grad():
                for n, p in ref.named_parameters():
                    p.grad = None
                    p.add_(_step_delta(step, n, p.shape))
        torch.cuda.synchronize()
    del ref

    with model_parallel(gtp=GTP):
        model = _build(gtp=GTP)
        if classify:
            classify_gtp_remat_chains(model)
        load_gtp_off_params(model, start)
        params = dict(model.named_parameters())
        assert is_gtp_param(params["embedding.word_embeddings.weight"]), "the tied embedding is not GTP-sharded"
        for p in params.values():
            if is_gtp_param(p):
                p.main_grad = torch.zeros(p.shape, dtype=p.dtype, device=p.device)
        for step in range(STEPS):
            logits = model(tokens, positions, None)
            torch.testing.assert_close(logits.detach(), ref_logits[step], **LOGITS_TOL,
                                       msg=lambda m, s=step: f"step {s}: GTP vs GTP-off logits: {m}")
            (logits.float() ** 2).mean().backward()
            # What finalize_model_grads does before the data-parallel gradient sync.
            wait_for_gtp_grad_reduction_on_current_stream()
            torch.cuda.synchronize()
            for name, p in params.items():
                want = ref_grads[step][name]
                got = p.main_grad if is_gtp_param(p) else p.grad
                assert got is not None, f"step {step}: {name} has no gradient under GTP"
                if is_gtp_param(p):
                    want = gtp_rows(p, want)
                torch.testing.assert_close(got, want, **GRAD_TOL,
                                           msg=lambda m, n=name, s=step: f"step {s}: {n} gradient: {m}")
            with torch.no_grad():
                for name, p in params.items():
                    delta = _step_delta(step, name, start[name].shape)
                    if is_gtp_param(p):
                        p.main_grad.zero_()
                        delta = gtp_rows(p, delta)
                    p.grad = None
                    p.add_(delta)


@pytest.mark.parametrize("classify", [False, True], ids=["as-bridge-and-nemo-rl", "classified-chains"])
def test_tied_embeddings_train_under_gtp_defaults(classify):
    spawn(_train, 2, classify)
