"""A tiny TE GPT with linear biases computes the same logits with GTP on as with GTP off.

Bugs (megatron-core 0.19.2), in the order a pristine tree meets them: under GTP the TE linear
wrappers get GEMM biases 1/gtp_remat too short (TE sizes them from the pre-sharded
out_features; megatron-lm patch 0004), so a GPT with ``add_bias_linear`` dies in
bias-dropout-add ("The size of tensor a (128) must match the size of tensor b (64)"). With tied
embeddings the output layer then rejects the embedding's GTP shard ("supplied weight's shape is
(256, 128), not (512, 128)"; patch 0003), and the first backward stops in GTP's weight
prefetch (``KeyError: None`` in ``_get_prefetched_weight``; patch 0005, mlm-gtp-tied-prefetch).

How: in each of two processes on one GPU (gloo), first build the model with GTP off
(tp 1, gtp_remat 1): TE layer spec, vocab 512, hidden 128, 2 layers, linear and QKV biases,
fp32. Run forward and backward on fixed tokens and keep its logits, bias gradients and
parameters. Then re-initialise model parallelism with gtp_remat 2, build the same model
GTP-sharded and load the GTP-off parameters into it: each GTP weight gets its rows of the
padded full weight, every other parameter is copied whole, so a bias of the wrong length
fails here (pristine fails this way). Forward must then give the GTP-off logits (fp32,
atol = rtol = 1e-4) and backward the GTP-off bias gradients.

GTP runs with its defaults (weight prefetch and asynchronous reduce-scatter on), as NeMo-RL and
Megatron-Bridge run it: the proof asserts them rather than setting them. Two variants: tied
embeddings (``share_embeddings_and_output_weights``; needs patches 0003 and 0005 as well as
0004) and untied (0004 alone). Nothing here depends on patches 0001-0002: the GTP-off model is
built under its own model-parallel state, not through a pg_collection.
"""

from __future__ import annotations

import pytest
import torch
from _te_gpt import GPU_ONLY, assert_gtp_at_its_defaults, build, fixed_tokens, load_gtp_off_params, model_parallel
from _world import spawn

# What this proof fails with on the pristine base (tools' prove checks it): with the patches it requires, the first backward's prefetch (GPU).
PRISTINE_FAILS = r"KeyError: None"

pytestmark = GPU_ONLY

GTP = 2
VOCAB, HIDDEN, LAYERS = 512, 128, 2
# Distinct from VOCAB so that no decoder weight has the embedding's gathered shape: GTP's
# gather buffers are keyed by shape.
FFN = 256
BATCH, SEQ = 2, 16
LOGITS_TOL = dict(atol=1e-4, rtol=1e-4)
GRAD_TOL = dict(atol=1e-4, rtol=1e-3)


def _build(tied, gtp):
    return build(gtp, vocab=VOCAB, seq=SEQ, tied=tied, num_layers=LAYERS, hidden_size=HIDDEN,
                 num_attention_heads=4, ffn_hidden_size=FFN, add_bias_linear=True, add_qkv_bias=True)


def _gpt(rank, world_size, tied):
    torch.cuda.set_device(0)
    from megatron.core.tensor_parallel.gtp_api import (
        classify_gtp_remat_chains,
        is_gtp_param,
    )

    assert_gtp_at_its_defaults()
    (tokens,), positions = fixed_tokens(VOCAB, BATCH, SEQ)

    # GTP off: the reference.
    with model_parallel(gtp=1):
        ref = _build(tied, gtp=1)
        ref_logits = ref(tokens, positions, None)
        (ref_logits.float() ** 2).sum().backward()
        ref_logits = ref_logits.detach().clone()
        full_params = {n: p.detach().clone() for n, p in ref.named_parameters()}
        ref_bias_grads = {
            n: p.grad.detach().clone() for n, p in ref.named_parameters() if n.endswith(".bias")
        }
        torch.cuda.synchronize()
    del ref
    assert any(".linear_qkv.bias" in n for n in ref_bias_grads), sorted(ref_bias_grads)

    # GTP on, same parameters.
    with model_parallel(gtp=GTP):
        model = _build(tied, gtp=GTP)
        classify_gtp_remat_chains(model)
        gtp_params = [p for p in model.parameters() if is_gtp_param(p)]
        assert gtp_params, "nothing in the GTP model is GTP-sharded"
        load_gtp_off_params(model, full_params)

        logits = model(tokens, positions, None)
        assert logits.shape == ref_logits.shape, (tuple(logits.shape), tuple(ref_logits.shape))
        torch.testing.assert_close(
            logits.detach(), ref_logits, **LOGITS_TOL, msg=lambda m: f"GTP vs GTP-off logits: {m}"
        )

        for p in gtp_params:
            p.main_grad = torch.zeros(p.shape, dtype=p.dtype, device=p.device)
        (logits.float() ** 2).sum().backward()
        torch.cuda.synchronize()

        params = dict(model.named_parameters())
        for name, ref_grad in ref_bias_grads.items():
            grad = params[name].grad
            assert grad is not None, f"{name}: no gradient under GTP"
            torch.testing.assert_close(
                grad, ref_grad, **GRAD_TOL, msg=lambda m, n=name: f"{n} gradient: {m}"
            )
        for p in gtp_params:
            assert torch.isfinite(p.main_grad).all(), f"{p._debug_name}: non-finite main_grad"


@pytest.mark.parametrize("tied", [True, False], ids=["tied-embeddings", "untied"])
def test_te_gpt_with_biases_matches_gtp_off(tied):
    spawn(_gpt, 2, tied)
