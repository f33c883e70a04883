"""integration/nemo_rl_gtp's MoE case (issue 23), on the CPU: the tiny Qwen3-MoE model made from its
config and seed as the GPU host makes it, what transformers and Megatron-Bridge 0.6.2 read from it,
and the case's arguments and model choice. The GRPO run itself is the two-GPU run's."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, tool

NRL = ROOT / "integration" / "nemo_rl_gtp"
sys.path.insert(0, str(NRL))

from carry.errors import UsageError
from harness.host import cases as casing
from harness.host import caserun
from harness.host import setup as hostsetup
from harness.models import fixtures, moe_fixtures


@pytest.fixture(scope="module")
def staged(tmp_path_factory) -> Path:
    """fixtures/ as the stage writes it: the dense model's tokenizer and config, then the MoE config."""
    dest = tmp_path_factory.mktemp("fixtures")
    fixtures.build_all(dest, 7)
    doc = moe_fixtures.stage(dest)
    assert doc["moe_model"] == "fixtures/moe-model"
    return dest


@pytest.fixture(scope="module")
def built(staged, tmp_path_factory) -> Path:
    """The MoE weights, built by the GPU host's setup's own step (hostsetup.build_weights_from_stage:
    the staged folder copied, the script run in a fresh Python, its report logged)."""
    host = tmp_path_factory.mktemp("host")
    model = host / moe_fixtures.DIR
    with open(host / "setup.log", "w") as log:
        built = hostsetup.build_weights_from_stage(log, staged / moe_fixtures.DIR, model,
                                                   NRL / "harness" / "models" / "moe_fixtures.py", 7, "MoE model", sys.executable)
    assert built["seed"] == 7 and not built["reused"], built
    assert f"[run-on-gpu-host] MoE model {model}: seed 7" in (host / "setup.log").read_text()
    return model


def test_the_staged_config_is_qwen3_moe_in_small(staged):
    from transformers import AutoConfig, AutoTokenizer

    model = staged / moe_fixtures.DIR
    assert not list(model.glob("*.safetensors")), "the ferry carries no weights: they are built there"
    cfg = AutoConfig.from_pretrained(model)
    assert cfg.model_type == "qwen3_moe" and cfg.architectures == ["Qwen3MoeForCausalLM"]
    experts = getattr(cfg, "num_experts", None) or cfg.num_local_experts
    assert (experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, cfg.decoder_sparse_step) == (8, 2, 128, 1)
    assert cfg.tie_word_embeddings is False and cfg.attention_bias is False and cfg.mlp_only_layers == []
    # KV cache per token as Qwen2.5-0.5B's (the script's generation buffer is sized for it).
    assert (cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim) == (24, 2, 64)
    assert moe_fixtures.check_shape(model) == moe_fixtures.SHAPE
    tok = AutoTokenizer.from_pretrained(model)
    assert (tok.eos_token, tok.pad_token) == ("<|im_end|>", "<|endoftext|>") and len(tok) < cfg.vocab_size
    assert (cfg.eos_token_id, cfg.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)


def test_a_config_of_another_shape_is_refused(staged, tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    cfg = json.loads((staged / moe_fixtures.DIR / "config.json").read_text())
    cfg["num_experts_per_tok"] = 1
    (model / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"not the tiny Qwen3-MoE shape.*num_experts_per_tok.*\(1, 2\)"):
        moe_fixtures.build_weights(model, 7)
    assert not list(model.glob("*.safetensors"))


def test_weights_repeat_with_the_seed_and_load_in_transformers_without_a_missing_key(built):
    from safetensors import safe_open
    from transformers import Qwen3MoeForCausalLM

    stamp = json.loads((built / moe_fixtures.WEIGHTS_STAMP).read_text())
    assert stamp["seed"] == 7 and stamp["parameters"] == 101_448_960
    assert stamp["files"]["model.safetensors"] == hashlib.sha256((built / "model.safetensors").read_bytes()).hexdigest()
    with safe_open(str(built / "model.safetensors"), "pt") as f:
        names = list(f.keys())
        assert tuple(f.get_slice("model.layers.23.mlp.experts.7.gate_proj.weight").get_shape()) == (128, 256)
        assert tuple(f.get_slice("lm_head.weight").get_shape()) == (151936, 256)  # untied
    assert sorted(names) == sorted(moe_fixtures.weight_shapes())
    model, info = Qwen3MoeForCausalLM.from_pretrained(str(built), output_loading_info=True)
    assert {k: list(v) for k, v in info.items() if v} == {}, "the checkpoint's names are not Qwen3-MoE's"
    assert sum(p.numel() for p in model.parameters()) == stamp["parameters"]
    again = moe_fixtures.build_weights(built, 7)
    assert again["reused"] and again["files"] == stamp["files"], "a second setup keeps the built weights"
    other = built.parent / "seed8"
    other.mkdir()
    (other / "config.json").write_bytes((built / "config.json").read_bytes())
    assert moe_fixtures.build_weights(other, 8)["files"] != stamp["files"]


BRIDGE_PROBE = r'''
import json, sys, typing
from _cpu import BridgeWithoutTE
if not hasattr(typing, "override"):
    import typing_extensions
    typing.override = typing_extensions.override
hook = BridgeWithoutTE()
sys.meta_path.insert(0, hook)
from megatron.bridge import AutoBridge
sys.meta_path.remove(hook)
from safetensors import safe_open
bridge = AutoBridge.from_hf_pretrained(sys.argv[1])
p = bridge.to_megatron_provider(load_weights=False)
registry = bridge._model_bridge.mapping_registry()
names = list(safe_open(sys.argv[1] + "/model.safetensors", "pt").keys())
keys = ("num_layers", "hidden_size", "num_query_groups", "kv_channels", "num_moe_experts", "moe_router_topk",
        "moe_ffn_hidden_size", "moe_grouped_gemm", "qk_layernorm", "add_qkv_bias", "gated_linear_unit",
        "share_embeddings_and_output_weights", "moe_token_dispatcher_type", "vocab_size")
print(json.dumps({"bridge": type(bridge._model_bridge).__name__, "provider": {k: getattr(p, k) for k in keys},
                  "unmapped": [n for n in names if registry.hf_to_megatron_lookup(n) is None]}))
'''


def test_bridge_converts_it_as_qwen3_moe_with_every_tensor_mapped(built, pin_cache, tmp_path):
    """Megatron-Bridge 0.6.2 picks its Qwen3MoEBridge for the config, makes a provider with grouped
    experts, and has a mapping for every tensor of the checkpoint (the names TEGroupedMLP's
    linear_fc1.weight<i> / linear_fc2.weight<i> are read from)."""
    work = tmp_path / "work"
    tool("apply", "--series", "gtp", "--workdir", work, "--cache", pin_cache,
         "--only", "megatron-lm,megatron-bridge", check=0)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "patches" / "gtp" / "proofs"), str(work / "megatron-lm"), str(work / "megatron-bridge" / "src")])}
    res = subprocess.run([sys.executable, "-c", BRIDGE_PROBE, str(built)], env=env, capture_output=True, text=True,
                         timeout=900, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert doc["bridge"] == "Qwen3MoEBridge"
    assert doc["provider"] == {
        "num_layers": 24, "hidden_size": 256, "num_query_groups": 2, "kv_channels": 64, "num_moe_experts": 8,
        "moe_router_topk": 2, "moe_ffn_hidden_size": 128, "moe_grouped_gemm": True, "qk_layernorm": True,
        "add_qkv_bias": False, "gated_linear_unit": True, "share_embeddings_and_output_weights": False,
        "moe_token_dispatcher_type": "alltoall", "vocab_size": 151936}
    assert doc["unmapped"] == []


def test_the_moe_case_asks_for_both_axes_on_its_own_model(built, tmp_path):
    case = casing.CASES["moe"]
    assert (case.expect, case.nemo_rl, case.megatron_core, case.shape) == ("green", "patched", "patched", "qwen3-moe")
    args = casing.script_args(case, "/m", "/d.jsonl", "/ck")
    assert args[0] == "policy.model_name=/m"
    assert args[-1] == "policy.megatron_cfg.expert_tensor_parallel_num_weight_shards=2"
    assert not [a for a in args if "tensor_parallel_num_weight_shards=" in a and "expert" not in a], \
        "the dense axis stays the script's own (2)"
    assert case.markers == ("[gtp] enabling GTP weight rematerialization (gtp_remat_size=2 expert_gtp_remat_size=2)",)
    assert all(c.shape == "dense" for n, c in casing.CASES.items() if n != "moe")
    # The model a case runs on: the MoE case's beside the dense one, and only once it is built.
    lay = hostsetup.Layout(parts=tmp_path / "parts", root=tmp_path / "root", te=tmp_path / "te",
                         model_dir=built.parent / "model")
    assert hostsetup.model_for(lay, case) == built
    with pytest.raises(UsageError, match="no built model"):
        hostsetup.model_for(lay, casing.CASES["patched"])
    lay = hostsetup.Layout(parts=tmp_path / "parts", root=tmp_path / "root", te=tmp_path / "te")
    with pytest.raises(UsageError, match="no built MoE model"):
        hostsetup.model_for(lay, case)


def test_the_moe_case_is_judged_with_the_expert_marker_too(tmp_path):
    """A run that logged the script's markers but built no expert GTP groups is red."""
    case = casing.CASES["moe"]
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.json").write_text(json.dumps({"train/token_mult_prob_error": {"1": 1.01, "2": 1.01},
                                                  "train/grad_norm": {"1": 0.5, "2": 0.4}}))
    base = "[colocated-reshard] building dedicated inference model (...)\n========= Step 1/2 =========\n"
    (out / "run.log").write_text(base + "[gtp] enabling GTP weight rematerialization "
                                 "(gtp_remat_size=2 expert_gtp_remat_size=1)\n")
    assert caserun.summarize(case, out, 0)["observed"] == "red"
    (out / "run.log").write_text(base + "[gtp] enabling GTP weight rematerialization "
                                 "(gtp_remat_size=2 expert_gtp_remat_size=2)\n")
    assert caserun.summarize(case, out, 0)["observed"] == "green"
