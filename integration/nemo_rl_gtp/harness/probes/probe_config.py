"""What examples/run_grpo.py does before it builds the policy, on the CPU: config, tokenizer, data.

    python probe_config.py --nemo-rl ROOT [--ray] -- RUN_GRPO_ARGS...

RUN_GRPO_ARGS are the arguments the functional script passes to examples/run_grpo.py (the
dry-run records them through the uv stand-in). In ROOT, with its nemo_rl on sys.path, this
loads the config with every override exactly as run_grpo.main does (load_config,
parse_hydra_overrides, OmegaConf.to_container(resolve=True), MasterConfig), reads the
model's config and its weights' shapes (built from it), loads the
tokenizer and renders a prompt with its chat template, configures generation, asks NeMo-RL
whether a dedicated inference model will be built, and with --ray attaches to a running Ray
(init_ray, as run_grpo does), runs a trivial actor and sets up the data and the math
environment actors (setup_response_data). Prints one JSON object; exit 1 on the first failure.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback


def _get(cfg: dict, dotted: str):
    cur = cfg
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return "<absent>"
        cur = cur[part]
    return cur


SHOWN = ("policy.model_name", "policy.tokenizer.name", "policy.generation.backend",
         "policy.generation.colocated.enabled", "policy.generation.mcore_generation_config.refit_backend",
         "cluster.gpus_per_node", "policy.megatron_cfg.enabled", "policy.megatron_cfg.tensor_model_parallel_size",
         "policy.megatron_cfg.tensor_parallel_num_weight_shards",
         "policy.megatron_cfg.expert_tensor_parallel_num_weight_shards", "grpo.max_num_steps", "grpo.num_prompts_per_step",
         "grpo.num_generations_per_prompt", "checkpointing.enabled", "checkpointing.checkpoint_dir",
         "checkpointing.save_period", "data.train.dataset_name", "data.train.data_path", "logger.tensorboard_enabled",
         "logger.wandb_enabled", "logger.mlflow_enabled", "logger.swanlab_enabled")


def probe(root: str, argv: list[str], with_ray: bool, out: dict) -> dict:

    def step(name: str, **info):
        out["steps"].append({"step": name, **info})

    os.chdir(root)
    sys.path.insert(0, root)
    from omegaconf import OmegaConf

    from nemo_rl.utils.config import load_config, parse_hydra_overrides, register_omegaconf_resolvers

    register_omegaconf_resolvers()
    p = argparse.ArgumentParser()
    p.add_argument("--config")
    args, overrides = p.parse_known_args(argv)
    config = load_config(args.config)
    config = parse_hydra_overrides(config, overrides)
    container = OmegaConf.to_container(config, resolve=True)
    from nemo_rl.algorithms.grpo import MasterConfig

    master = MasterConfig(**container)
    step("config", file=args.config, overrides=len(overrides), values={k: _get(container, k) for k in SHOWN})

    try:
        from nemo_rl.models.generation.megatron.config import dedicated_inference_megatron_cfg
    except ImportError as exc:
        step("dedicated-model", note=f"not asked: {exc}")
    else:
        ded = dedicated_inference_megatron_cfg(master.policy)
        step("dedicated-model", built=ded is not None,
             inference=None if ded is None else {k: ded.get(k) for k in (
                 "tensor_model_parallel_size", "tensor_parallel_num_weight_shards", "context_parallel_size",
                 "expert_tensor_parallel_size", "expert_tensor_parallel_num_weight_shards")})

    from transformers import AutoConfig

    from nemo_rl.algorithms.utils import get_tokenizer
    from nemo_rl.models.generation import configure_generation_config

    hf = AutoConfig.from_pretrained(master.policy["model_name"])
    step("model-config", model_type=hf.model_type, hidden=hf.hidden_size, layers=hf.num_hidden_layers,
         heads=hf.num_attention_heads, kv_heads=hf.num_key_value_heads, vocab=hf.vocab_size,
         tied=hf.tie_word_embeddings)
    from pathlib import Path

    from safetensors import safe_open

    shapes = {}
    for f in sorted(Path(master.policy["model_name"]).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            shapes.update({k: tuple(st.get_slice(k).get_shape()) for k in st.keys()})
    embed = shapes.get("model.embed_tokens.weight")
    # A tied model has no lm_head tensor; an untied one (the MoE case's) must have its own.
    if embed != (hf.vocab_size, hf.hidden_size) or ("lm_head.weight" in shapes) == bool(hf.tie_word_embeddings):
        raise ValueError(f"the weights in {master.policy['model_name']} do not fit its config: embedding {embed}, "
                         f"lm_head {'present' if 'lm_head.weight' in shapes else 'absent'}, "
                         f"tie_word_embeddings {hf.tie_word_embeddings}")
    step("model-weights", tensors=len(shapes), embedding=embed,
         parameters=sum(math.prod(s) for s in shapes.values()))
    tok = get_tokenizer(master.policy["tokenizer"])
    text = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], tokenize=False,
                                   add_generation_prompt=True)
    step("tokenizer", size=len(tok), eos=tok.eos_token, pad=tok.pad_token, prompt=text,
         prompt_tokens=len(tok(text, add_special_tokens=False)["input_ids"]))
    master.policy["generation"] = configure_generation_config(
        master.policy["generation"], tok, has_refit_draft_weights=bool(master.policy["draft"]["enabled"]),
        trains_mtp=bool((master.policy.get("megatron_cfg") or {}).get("mtp_num_layers")))
    gen = master.policy["generation"]
    step("generation-config", stop_token_ids=gen.get("stop_token_ids"), max_new_tokens=gen.get("max_new_tokens"))

    if with_ray:
        import ray

        from nemo_rl.data.utils import setup_response_data
        from nemo_rl.distributed.virtual_cluster import init_ray

        init_ray()

        @ray.remote(num_cpus=0)
        def where():
            import sys as s
            return s.executable

        step("ray", resources=ray.cluster_resources(), actor_python=ray.get(where.remote()))
        t0 = time.monotonic()
        train, val, task_to_env, _ = setup_response_data(tok, master.data, master.env)
        first = train[0]
        tokens = sum(len(m["token_ids"]) for m in first["message_log"])
        step("data", train=len(train), validation=len(val) if val is not None else None,
             envs=sorted(task_to_env), first_prompt_tokens=tokens, seconds=round(time.monotonic() - t0, 1))
        ray.shutdown()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nemo-rl", required=True)
    ap.add_argument("--ray", action="store_true")
    ap.add_argument("rest", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    rest = a.rest[1:] if a.rest[:1] == ["--"] else a.rest
    doc: dict = {"steps": []}
    try:
        probe(a.nemo_rl, rest, a.ray, doc)
        doc["ok"] = True
    except BaseException as exc:  # noqa: BLE001 - reported, not hidden
        frames = traceback.extract_tb(exc.__traceback__)[-4:]
        doc.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:1500],
                   cause=f"{type(exc.__cause__).__name__}: {exc.__cause__}"[:600] if exc.__cause__ else None,
                   where=[f"{f.filename}:{f.lineno}" for f in frames])
    print(json.dumps(doc, default=str))
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
