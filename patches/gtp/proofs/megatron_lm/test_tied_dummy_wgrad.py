"""A tied embedding's gradient under GTP holds its gradient and nothing else, at every microbatch.

Bug (megatron-core 0.19.2): GTP adds a weight's reduced gradient to ``main_grad`` itself
(``GTPShardedParam._handle_megatron_grad_accum``) and gives autograd a dummy wgrad from TE's
``get_dummy_wgrad`` cache, a ``torch.empty`` buffer. The embedding, head of GTP's chain, takes
the synchronous path, so autograd keeps that dummy as ``param.grad``. GPTModel marks a tied
embedding ``zero_out_wgrad`` at pipeline size 1, and for such a weight Megatron DDP's grad hook
adds ``param.grad`` to ``main_grad`` whatever ``grad_added_to_main_grad`` says. The next time
the hook runs for the embedding, ``param.grad`` still holds the dummy, so whatever its memory
held lands in the gradient:

- the next microbatch of the same step (gradient accumulation, as NeMo-RL trains);
- the next step, when the distributed optimizer runs precision-aware (NeMo-RL's default): its
  ``zero_grad`` clears ``decoupled_grad`` only, never ``.grad``.

On two H200s (Qwen2.5-0.5B shape, bf16, NeMo-RL's optimizer settings) step 2's embedding
gradient had norm 1.5e23 and the total norm was inf.

How: two processes on one GPU (gloo). The Qwen2.5 shape in small (TE spec, tied embeddings,
SwiGLU, RMSNorm, rope, GQA; fp32) runs two microbatches with GTP off; its embedding gradients
are the reference. The same model with gtp_remat 2 and GTP's defaults (asserted, not set),
wrapped in Megatron DDP, starts from the same weights and runs the same two microbatches; its
embedding ``main_grad`` must then hold its rows of the GTP-off gradient (atol 1e-4, rtol 1e-3).
Nothing reduces over data-parallel ranks here (none needed: gloo cannot reduce CUDA tensors),
so ``main_grad`` is read as the hooks left it. What an uninitialised buffer holds depends on
what the allocator handed out before; the proof fills TE's cached dummy with NaN before
training so that the result does not depend on it. Variants:

- ``microbatches``: both microbatches accumulate into one step's gradient;
- ``next-step``: between them the step ends as NeMo-RL's does, DDP's ``zero_grad_buffer`` and
  Megatron's optimizer ``zero_grad`` helper in its precision-aware form, and the second
  microbatch's gradient alone must be there.
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

# What this proof fails with on the pristine base (tools' prove checks it): the tied embedding's gradient holds the dummy wgrad (GPU).
PRISTINE_FAILS = r"word_embeddings\.weight(: \d+ of \d+ main_grad elements are not finite| main_grad vs its GTP-off rows)"

pytestmark = GPU_ONLY

GTP = 2
VOCAB, HIDDEN, FFN = 512, 128, 192
BATCH, SEQ = 2, 16
GRAD_TOL = dict(atol=1e-4, rtol=1e-3)
EMBEDDING = "embedding.word_embeddings.weight"


def _build(gtp):
    return build_qwen_like(gtp, vocab=VOCAB, seq=SEQ, hidden=HIDDEN, ffn=FFN, qkv_bias=False)


def _loss(model, tokens, positions):
    return (model(tokens, positions, None).float() ** 2).mean()


def _microbatches(rank, world_size, next_step):
    torch.cuda.set_device(0)
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer.optimizer import _zero_grad_group_helper
    from megatron.core.tensor_parallel.gtp_api import (
        is_gtp_param,
        wait_for_gtp_grad_reduction_on_current_stream,
    )

    assert_gtp_at_its_defaults()
    batches, positions = fixed_tokens(VOCAB, BATCH, SEQ, count=2)

    # GTP off: the embedding gradient of each microbatch.
    with model_parallel(gtp=1):
        ref = _build(gtp=1)
        full_params = {n: p.detach().clone() for n, p in ref.named_parameters()}
        ref_grads = []
        for tokens in batches:
            ref.zero_grad(set_to_none=True)
            _loss(ref, tokens, positions).backward()
            ref_grads.append(dict(ref.named_parameters())[EMBEDDING].grad.detach().clone())
        torch.cuda.synchronize()
    del ref
    expected_full = ref_grads[1] if next_step else ref_grads[0] + ref_grads[1]

    with model_parallel(gtp=GTP):
        module = _build(gtp=GTP)
        load_gtp_off_params(module, full_params)
        ddp = DistributedDataParallel(
            config=module.config,
            ddp_config=DistributedDataParallelConfig(grad_reduce_in_fp32=False, overlap_grad_reduce=False),
            module=module,
        )
        emb = dict(module.named_parameters())[EMBEDDING]
        assert is_gtp_param(emb), f"{EMBEDDING} is not GTP-sharded"
        assert getattr(emb, "zero_out_wgrad", False), (
            "GPTModel no longer marks the tied embedding zero_out_wgrad: this proof tests nothing"
        )
        # TE's cached dummy for the embedding's shape, as memory used before would leave it.
        from transformer_engine.pytorch.module import base as te_base

        shape = list(emb.main_grad.shape)
        te_base._dummy_wgrads[(*shape, emb.dtype)] = torch.full(shape, float("nan"), device="cuda")

        ddp.zero_grad_buffer()
        for i, tokens in enumerate(batches):
            if i and next_step:
                # The end of a step as NeMo-RL runs it: DDP's buffers, then the precision-aware
                # distributed optimizer's zero_grad, which clears decoupled_grad only.
                ddp.zero_grad_buffer()
                _zero_grad_group_helper(list(module.parameters()), set_to_none=True, use_decoupled_grad=True)
            _loss(ddp, tokens, positions).backward()
            # What finalize_model_grads does before the data-parallel gradient sync.
            wait_for_gtp_grad_reduction_on_current_stream()
        torch.cuda.synchronize()

        expected = gtp_rows(emb, expected_full)
        got = emb.main_grad
        bad = int((~torch.isfinite(got)).sum())
        assert not bad, (
            f"{EMBEDDING}: {bad} of {got.numel()} main_grad elements are not finite after the second "
            "microbatch: the dummy wgrad left in param.grad was added to the gradient"
        )
        torch.testing.assert_close(got, expected, **GRAD_TOL,
                                   msg=lambda m: f"{EMBEDDING} main_grad vs its GTP-off rows: {m}")


@pytest.mark.parametrize("next_step", [False, True], ids=["microbatches", "next-step"])
def test_tied_embedding_gradient_holds_no_dummy(next_step):
    spawn(_microbatches, 2, next_step)
