"""A tiny Qwen3-MoE-shaped model for the MoE case, made like fixtures.py makes the dense one.

Megatron-Bridge 0.6.2 converts Qwen3-MoE (``models/qwen/qwen3_moe_bridge.py``: TEGroupedMLP
experts, QK layernorm, no QKV bias, untied, alltoall dispatch, router pre-softmax from
``norm_topk_prob``). The model here has that architecture in small, with GTP on both axes in
mind: every layer MoE (``decoder_sparse_step`` 1), 8 routed SwiGLU experts of 128 rows, top-2.
Its attention is sized like Qwen2.5-0.5B's per token of KV cache (24 layers, 2 KV heads, head dim
64), because the functional script's generation buffer and ``max_tokens`` are sized for that
model (a smaller KV cache makes megatron-core's dynamic context hold more requests than
``max_tokens`` allows). The vocabulary is Qwen3's; the tokenizer is the dense model's (same
ChatML markers, ids far below the vocabulary).

The weights travel as a recipe, like the dense model's: the stage writes the config (and the
tokenizer) into ``fixtures/moe-model``; the GPU host's setup and the dry-run build the weights
from it with :func:`build_weights` and the seed. They are written directly as safetensors under
the names of the published Qwen3-MoE checkpoints (``model.layers.N.mlp.experts.E.gate_proj``
...), which Bridge's mapping reads; no HF model is instantiated, so the bytes do not depend on a
transformers version. Initialisation as HF's: normal(0, initializer_range) for matrices, ones
for the norms; everything from one seed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

try:
    from . import fixtures
except ImportError:   # run as a script: harness/models is sys.path[0]
    import fixtures  # type: ignore[no-redef]

MODEL = "qwen3-moe"            # cases.Case.shape of the MoE case
DIR = "moe-model"              # beside the dense model: ROOT/model, ROOT/moe-model; fixtures/moe-model
SHAPE = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 24, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 151936, "max_position_embeddings": 32768,
         "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
         "hidden_act": "silu", "attention_dropout": 0.0, "initializer_range": 0.02, "decoder_sparse_step": 1,
         "moe_intermediate_size": 128, "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True,
         "router_aux_loss_coef": 0.001, "mlp_only_layers": [], "use_sliding_window": False}
# transformers renamed num_experts to num_local_experts after 5.8: a config.json may say either.
_ALIASES = {"num_experts": ("num_experts", "num_local_experts")}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
WEIGHTS_STAMP = fixtures.WEIGHTS_STAMP


def write_model_config(out: Path, tokenizer_dir: Path) -> Path:
    """OUT: the dense model's tokenizer files and this model's config.json / generation_config.json."""
    from transformers import AutoTokenizer, GenerationConfig, Qwen3MoeConfig

    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy2(tokenizer_dir / name, out / name)
    tok = AutoTokenizer.from_pretrained(str(out))
    if len(tok) > SHAPE["vocab_size"]:
        raise ValueError(f"tokenizer has {len(tok)} tokens, more than the model's {SHAPE['vocab_size']}")
    cfg = Qwen3MoeConfig(**SHAPE, bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, torch_dtype="bfloat16")
    cfg.architectures = ["Qwen3MoeForCausalLM"]
    cfg.save_pretrained(str(out))
    GenerationConfig.from_model_config(cfg).save_pretrained(str(out))
    return out


def _config_value(raw: dict, key: str):
    if key == "rope_theta":
        return raw.get("rope_theta", (raw.get("rope_parameters") or {}).get("rope_theta"))
    for name in _ALIASES.get(key, (key,)):
        if name in raw:
            return raw[name]
    return None


def check_shape(model_dir: Path) -> dict:
    """The config in MODEL_DIR must be the shape above; returns what it says."""
    raw = json.loads((Path(model_dir) / "config.json").read_text())
    got = {k: _config_value(raw, k) for k in SHAPE}
    if raw.get("model_type") != "qwen3_moe" or got != SHAPE:
        diff = {k: (got[k], SHAPE[k]) for k in SHAPE if got[k] != SHAPE[k]}
        raise ValueError(f"{Path(model_dir) / 'config.json'} is not the tiny Qwen3-MoE shape: "
                         f"model_type {raw.get('model_type')!r}, (got, want) {diff}")
    return got


def weight_shapes(shape: dict = SHAPE) -> dict[str, tuple[int, ...]]:
    """Every tensor of the checkpoint, by its Qwen3-MoE name, in a fixed order."""
    h, v, hd = shape["hidden_size"], shape["vocab_size"], shape["head_dim"]
    q, kv, e, f = shape["num_attention_heads"] * hd, shape["num_key_value_heads"] * hd, shape["num_experts"], \
        shape["moe_intermediate_size"]
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h)}
    for i in range(shape["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                    p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
                    p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
                    p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
                    p + "mlp.gate.weight": (e, h)})
        for x in range(e):
            out.update({f"{p}mlp.experts.{x}.gate_proj.weight": (f, h), f"{p}mlp.experts.{x}.up_proj.weight": (f, h),
                        f"{p}mlp.experts.{x}.down_proj.weight": (h, f)})
    out.update({"model.norm.weight": (h,), "lm_head.weight": (v, h)})
    return out


def build_weights(model_dir: Path, seed: int) -> dict:
    """MODEL_DIR/model.safetensors from its config.json and SEED (CPU, bf16); kept when the stamp
    says the same config and seed built the same bytes. Returns what the stamp records."""
    model_dir = Path(model_dir)
    check_shape(model_dir)
    config_sha, kept = fixtures.kept_weights(model_dir, seed)
    if kept is not None:
        return kept
    stamp = model_dir / WEIGHTS_STAMP
    import torch
    from safetensors.torch import save_file

    t0 = time.monotonic()
    stamp.unlink(missing_ok=True)
    for old_file in fixtures.weight_files(model_dir):
        old_file.unlink()
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in weight_shapes().items():
        if len(shape) == 1:  # RMSNorm weights
            tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
        else:
            tensors[name] = (torch.randn(shape, generator=gen) * SHAPE["initializer_range"]).to(torch.bfloat16)
    params = sum(t.numel() for t in tensors.values())
    tmp = model_dir / ".model.safetensors.part"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.rename(model_dir / "model.safetensors")
    files = {p.name: fixtures.sha256(p) for p in fixtures.weight_files(model_dir)}
    doc = {"seed": seed, "config_sha256": config_sha, "files": files, "parameters": params,
           "bytes": sum((model_dir / n).stat().st_size for n in files), "torch": torch.__version__,
           "seconds": round(time.monotonic() - t0, 1)}
    stamp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return {**doc, "reused": False}


# -- what the stage writes (staging/stage.py; the host builds the weights: host/setup.py) ----------
def stage(dest: Path) -> dict:
    """fixtures/moe-model beside fixtures/model (fixtures.build_all first: its tokenizer is reused)."""
    write_model_config(dest / DIR, dest / "model")
    return {"moe_model": f"fixtures/{DIR}", "moe_shape": "Qwen3-MoE in small (qwen3_moe, 8 experts, top-2)"}


def main(argv: list[str]) -> int:
    """python3 harness/models/moe_fixtures.py weights MODEL_DIR --seed N [--json FILE]."""
    p = argparse.ArgumentParser(prog="moe_fixtures.py")
    p.add_argument("what", choices=["weights"])
    p.add_argument("model_dir", type=Path)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    return fixtures.print_report(build_weights(a.model_dir, a.seed), a.json)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
