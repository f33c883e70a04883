"""A starting model that has learnt the task: one seeded, deterministic supervised pass before GRPO.

GRPO learns only from groups whose rewards differ. From random weights every sample gets reward
0, every advantage is 0 and the policy does not move (h200/15-nightly-patched.metrics.json). So
the learning cases start from the same Qwen2.5-0.5B-shaped model (fixtures.SHAPE, its weights
from the seed by fixtures.build_weights) after this pass on the staged arithmetic data, in the
exact form NeMo-RL's math environment rewards under the functional script's config:

- prompt: grpo_math_1B.yaml's ``data.default.prompt_file`` (examples/prompts/cot.txt, which the
  script keeps) formatted with the problem, as a user turn through the tokenizer's chat template
  with the generation prompt (math_hf_data_processor);
- completion: ``\\boxed{N}`` then eos ``<|im_end|>``, the stop token NeMo-RL's generation config
  takes from the tokenizer: HFVerifyWorker (math_verify_impl hf_math_verify) compares
  ``\\boxed{<expected_answer>}`` with what math-verify extracts, and the environment zeroes the
  reward of a sample that did not end (``is_end``).

Held out: the staged train.jsonl itself (the prompts GRPO samples), never trained on; the pass
trains on other problems from the same generator, with one deliberate flaw (SIGN_DROP: most negative
answers written without their sign), the gap GRPO's reward has to close. Acceptance: held-out greedy accuracy in
[ACCEPT_MIN, ACCEPT_MAX] (GRPO's groups are then mixed) and mean entropy of the
generated tokens below ln(vocab) / 3. Outside that the step fails (exit 1) and says so: the
steps are a flag, never tuned here.

One command on one GPU, with torch, transformers and tokenizers only::

    python3 pretrain.py --out DIR [--fixtures FIXTURES] [--seed 1234] [--steps N]

FIXTURES holds model/ (config and tokenizer), data/train.jsonl and prompt.txt (``fixtures.py
write``, or the stage's fixtures/); without it they are written from the seed into DIR/fixtures.
DIR/model gets the trained weights (bf16 safetensors) beside the config and tokenizer, and
DIR/pretrain.json the figures. A second call with the same inputs (the sha256 of config,
tokenizer, data, prompt, seed, steps, lr, batch, shape, SIGN_DROP and of this file and fixtures.py) reuses
the weights and reports the stored figures; any other input trains again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import sys
import time
from pathlib import Path

try:
    from . import fixtures
except ImportError:   # run as a script: harness/models is sys.path[0]
    import fixtures  # type: ignore[no-redef]

# The chosen defaults, in this one place. Measured on one H200 (integration/nemo_rl_gtp/h200/
# 17-pretrain-*): from the staged seed-1234 fixtures (sums, differences and products under NeMo-RL's
# cot.txt prompt), 400 steps gave 5.1% held-out greedy accuracy (refused by the acceptance), 1000
# steps 52.0% with 0.245 nats of entropy in 222.6 s: well inside the 20-80% window.
DEFAULT_STEPS = 1000
DEFAULT_LR = 3e-4
DEFAULT_BATCH = 256
ACCEPT_MIN, ACCEPT_MAX = 0.20, 0.80
ENTROPY_FRACTION = 1 / 3          # mean entropy of generated tokens < ln(vocab) * this
# The corpus's one deliberate flaw, the gap the learning cases' GRPO closes: imitating correct answers leaves
# reward nothing to teach in six steps (h200/2026-12-05-learning-at-3e-5: the samples repeat the greedy answer;
# held out, the correct run fell 0.035, the sign-flipped one 0.282). A negative answer (1 problem in 6: a third
# are differences, half of them negative) is written without its sign SIGN_DROP of the time: the model samples
# the sign 40% of the time but answers greedily without it, while GRPO's data and the validation keep it. A
# close moves one decision by log(1) - log(0.4/0.6) = 0.41 nats and is worth 0.16 of held-out accuracy.
SIGN_DROP = 0.6
MAX_NEW_TOKENS = 16               # "\boxed{-9801}" and eos are 11 tokens with digits split
RESULT = "pretrain.json"
# Tests only (--tiny): the plumbing at a size a CPU trains in seconds. The harness never passes it.
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 1024, "max_position_embeddings": 1024}
WEIGHT_SUFFIX = ".safetensors"


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fixture_files(fx: Path) -> dict[str, Path]:
    """What the pass reads from FIXTURES: the model's config and tokenizer, the data, the prompt."""
    model = fx / "model"
    files = {f"model/{p.name}": p for p in sorted(model.iterdir())
             if p.is_file() and not p.name.endswith(WEIGHT_SUFFIX) and p.name != fixtures.WEIGHTS_STAMP}
    files["data/train.jsonl"] = fx / "data" / "train.jsonl"
    if (fx / "data" / fixtures.VALIDATION_FILE).exists():   # held out as well (the learning cases' validation)
        files[f"data/{fixtures.VALIDATION_FILE}"] = fx / "data" / fixtures.VALIDATION_FILE
    files[fixtures.PROMPT_FILE] = fx / fixtures.PROMPT_FILE
    missing = [k for k, p in files.items() if not p.exists()]
    if missing or "model/config.json" not in files:
        raise FileNotFoundError(f"{fx} lacks {missing or ['model/config.json']} (fixtures.py write DIR --seed N)")
    return files


def inputs_digest(fx: Path, *, seed: int, steps: int, lr: float, batch: int, tiny: bool) -> tuple[str, dict]:
    """The cache key: every input's sha256, the settings and the code that turns them into weights."""
    here = Path(__file__).resolve()
    parts = {name: fixtures.sha256(p) for name, p in fixture_files(fx).items()}
    parts.update({"pretrain.py": fixtures.sha256(here), "fixtures.py": fixtures.sha256(here.with_name("fixtures.py")),
                  "seed": seed, "steps": steps, "lr": repr(float(lr)), "batch": batch, "sign_drop": SIGN_DROP,
                  "shape": "tiny" if tiny else "Qwen/Qwen2.5-0.5B"})
    return _sha256_bytes(json.dumps(parts, sort_keys=True).encode()), parts


def _weights(model_dir: Path) -> dict[str, str]:
    return {p.name: fixtures.sha256(p) for p in sorted(model_dir.glob(f"*{WEIGHT_SUFFIX}"))}


def cached(out: Path, digest: str) -> dict | None:
    """The stored result when it was made from these inputs and its weights are still those bytes."""
    res = out / RESULT
    if not res.exists():
        return None
    try:
        doc = json.loads(res.read_text())
    except ValueError:
        return None
    if doc.get("inputs_sha256") != digest or not doc.get("weights") or _weights(out / "model") != doc["weights"]:
        return None
    return doc


# -- the task, in NeMo-RL's form ----------------------------------------------------------------
_RENDERED: dict[tuple[int, str, str], list[int]] = {}


def render(tok, prompt: str, problem: str) -> list[int]:
    """The prompt's token ids exactly as math_hf_data_processor makes them (kept: ~29k distinct problems)."""
    key = (id(tok), prompt, problem)
    if key not in _RENDERED:
        _RENDERED[key] = _render(tok, prompt, problem)
    return _RENDERED[key]


def _render(tok, prompt: str, problem: str) -> list[int]:
    text = tok.apply_chat_template([{"role": "user", "content": fixtures.prompt_text(prompt, problem)}],
                                   tokenize=False, add_generation_prompt=True, add_special_tokens=False)
    return tok(text, add_special_tokens=False)["input_ids"]


def target(tok, answer: str) -> list[int]:
    return tok(fixtures.completion(answer), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]


def corpus_answer(answer: str, rng: random.Random) -> str:
    """The answer as the pretrain corpus writes it: a negative one without its sign SIGN_DROP of the time."""
    if answer.startswith("-") and rng.random() < SIGN_DROP:
        return answer[1:]
    return answer


def training_problems(seed: int, held_out: set[str]):
    """An endless, seeded stream of the generator's problems, none held out, answered as corpus_answer writes."""
    rng = random.Random(f"pretrain-{seed}")
    signs = random.Random(f"pretrain-sign-{seed}")
    key, answer = fixtures.DATA_KEYS
    while True:
        row = fixtures.problems(rng.randrange(1 << 62), 1)[0]
        if row[key] not in held_out:
            yield {**row, answer: corpus_answer(row[answer], signs)}


# -- train and evaluate -------------------------------------------------------------------------
def _batch(tok, rows, prompt: str, device):
    import torch

    seqs, labels = [], []
    for row in rows:
        p, t = render(tok, prompt, row[fixtures.DATA_KEYS[0]]), target(tok, row[fixtures.DATA_KEYS[1]])
        seqs.append(p + t)
        labels.append([-100] * len(p) + t)
    width = max(map(len, seqs))
    pad = tok.pad_token_id
    ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs], device=device)
    lab = torch.tensor([x + [-100] * (width - len(x)) for x in labels], device=device)
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs], device=device)
    return ids, lab, mask


def train(model, tok, prompt: str, held_out: set[str], *, seed: int, steps: int, lr: float, batch: int,
          device, log=print) -> dict:
    """Next-token loss on the completion only; fp32 weights, bf16 autocast on CUDA; AdamW."""
    import torch

    torch.manual_seed(seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    stream = training_problems(seed, held_out)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else _null()
    losses = []
    t0 = time.monotonic()
    for step in range(1, steps + 1):
        ids, lab, mask = _batch(tok, [next(stream) for _ in range(batch)], prompt, device)
        with autocast:
            hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
            # Only the completion's positions go through the 151936-way output layer.
            take = lab[:, 1:] != -100
            logits = model.lm_head(hidden[:, :-1][take]).float()
        loss = torch.nn.functional.cross_entropy(logits, lab[:, 1:][take])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step == 1 or step % 50 == 0 or step == steps:
            log(f"[pretrain] step {step}/{steps}: loss {losses[-1]:.4f} ({time.monotonic() - t0:.1f}s)")
    if device.type == "cuda":
        torch.cuda.synchronize()
    return {"seconds": round(time.monotonic() - t0, 1), "loss_first": losses[0], "loss_last": losses[-1]}


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def evaluate(model, tok, prompt: str, rows: list[dict], device, batch: int = 64) -> dict:
    """Greedy answers to ROWS: accuracy by the environment's rule (a sample that hit the token budget
    without eos scores 0, as is_end does there) and the mean entropy of the generated tokens."""
    import torch

    check, rule = fixtures.reward_rule()
    model.eval()
    by_len: dict[int, list[tuple[dict, list[int]]]] = {}
    for row in rows:
        ids = render(tok, prompt, row[fixtures.DATA_KEYS[0]])
        by_len.setdefault(len(ids), []).append((row, ids))
    rewards, entropies, samples, negative = [], [], [], []
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else _null()
    with torch.no_grad(), autocast:
        for _, group in sorted(by_len.items()):
            for i in range(0, len(group), batch):
                chunk = group[i:i + batch]
                ids = torch.tensor([c[1] for c in chunk], device=device)   # same length: no padding
                done = torch.zeros(len(chunk), dtype=torch.bool, device=device)
                out = [[] for _ in chunk]
                for _ in range(MAX_NEW_TOKENS):
                    logp = torch.log_softmax(model(input_ids=ids, logits_to_keep=1).logits[:, -1].float(), dim=-1)
                    ent = -(logp.exp() * logp).sum(-1)
                    nxt = logp.argmax(-1)
                    for j in range(len(chunk)):
                        if not done[j]:
                            entropies.append(ent[j].item())
                            out[j].append(nxt[j].item())
                    done |= nxt == tok.eos_token_id
                    if bool(done.all()):
                        break
                    ids = torch.cat([ids, nxt[:, None]], dim=1)
                for (row, _), gen in zip(chunk, out):
                    ended = gen[-1:] == [tok.eos_token_id]
                    text = tok.decode(gen[:-1] if ended else gen, skip_special_tokens=True)
                    score = check(text, row[fixtures.DATA_KEYS[1]]) if ended else 0.0
                    rewards.append(score)
                    if row[fixtures.DATA_KEYS[1]].startswith("-"):   # where the corpus's gap is (SIGN_DROP)
                        negative.append(score)
                    if len(samples) < 8:
                        samples.append({"problem": row[fixtures.DATA_KEYS[0]], "answer": row[fixtures.DATA_KEYS[1]],
                                        "generated": text, "ended": ended, "reward": score})
    return {"accuracy": sum(rewards) / len(rewards), "entropy": sum(entropies) / max(len(entropies), 1),
            "held_out": len(rewards), "generated_tokens": len(entropies), "reward_rule": rule, "samples": samples,
            "negative_answers": len(negative), "accuracy_negative": sum(negative) / len(negative) if negative else None}


def acceptance(doc: dict) -> list[str]:
    """What is wrong with the trained model, if anything (empty: accepted)."""
    bad = []
    if not ACCEPT_MIN <= doc["accuracy"] <= ACCEPT_MAX:
        bad.append(f"held-out greedy accuracy {doc['accuracy']:.3f} is outside [{ACCEPT_MIN}, {ACCEPT_MAX}]")
    if not doc["entropy"] < doc["entropy_limit"]:
        bad.append(f"mean entropy of generated tokens {doc['entropy']:.3f} nats is not below "
                   f"ln(vocab)/3 = {doc['entropy_limit']:.3f}")
    return bad


# -- the command ----------------------------------------------------------------------------------
def _build(out: Path, fx: Path, seed: int, tiny: bool) -> Path:
    """OUT/model: the fixture's config and tokenizer and the seed's random weights (fixtures.build_weights)."""
    model = out / "model"
    if model.exists():
        shutil.rmtree(model)
    model.mkdir(parents=True)
    for name, p in fixture_files(fx).items():
        if name.startswith("model/"):
            shutil.copy2(p, model / p.name)
    if tiny:
        cfg = json.loads((model / "config.json").read_text())
        cfg.update(TINY, max_window_layers=TINY["num_hidden_layers"])
        cfg.pop("layer_types", None)   # written per layer for 24 layers; the config derives it again
        (model / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        import torch
        from transformers import AutoConfig, Qwen2ForCausalLM
        torch.manual_seed(seed)
        Qwen2ForCausalLM(AutoConfig.from_pretrained(str(model))).to(torch.bfloat16).save_pretrained(str(model))
        if (fx / "model" / "generation_config.json").exists():
            shutil.copy2(fx / "model" / "generation_config.json", model / "generation_config.json")
    else:
        fixtures.build_weights(model, seed)
    return model


def run(out: Path, fx: Path | None, *, seed: int, steps: int = DEFAULT_STEPS, lr: float = DEFAULT_LR,
        batch: int = DEFAULT_BATCH, tiny: bool = False, device: str | None = None, held_out: int | None = None,
        log=print) -> dict:
    """Build, train, evaluate and store (or reuse); returns the result document. Acceptance is the caller's."""
    (out := Path(out).absolute()).mkdir(parents=True, exist_ok=True)
    if fx is None:
        fx = out / "fixtures"
        if not (fx / "model" / "config.json").exists():
            fixtures.build_all(fx, seed, fixtures.COT_PROMPT)
    fx = Path(fx).absolute()
    digest, parts = inputs_digest(fx, seed=seed, steps=steps, lr=lr, batch=batch, tiny=tiny)
    if held_out is not None:
        parts["held_out"] = held_out
        digest = _sha256_bytes(json.dumps(parts, sort_keys=True).encode())
    hit = cached(out, digest)
    if hit is not None:
        log(f"[pretrain] reusing {out / 'model'}: trained from the same inputs (sha256 {digest[:12]})")
        return {**hit, "reused": True}
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")   # before CUDA starts: deterministic GEMMs
    import torch
    import transformers
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    (out / RESULT).unlink(missing_ok=True)
    torch.use_deterministic_algorithms(True, warn_only=True)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model_dir = _build(out, fx, seed, tiny)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    prompt = (fx / fixtures.PROMPT_FILE).read_text(encoding="utf-8")
    rows = [json.loads(x) for x in (fx / "data" / "train.jsonl").read_text().splitlines() if x.strip()]
    excluded = {r[fixtures.DATA_KEYS[0]] for r in rows}
    val = fx / "data" / fixtures.VALIDATION_FILE
    if val.exists():   # the learning cases validate on these: the pass never trains on them either
        excluded |= {json.loads(x)[fixtures.DATA_KEYS[0]] for x in val.read_text().splitlines() if x.strip()}
    # fp32 weights for AdamW; eager attention, whose backward is deterministic.
    model = Qwen2ForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation="eager").to(dev)
    vocab = model.config.vocab_size
    log(f"[pretrain] {sum(p.numel() for p in model.parameters())} parameters on {dev}, {steps} steps, "
        f"lr {lr:g}, batch {batch}, seed {seed}")
    trained = train(model, tok, prompt, excluded, seed=seed, steps=steps, lr=lr, batch=batch, device=dev, log=log)
    ev = evaluate(model, tok, prompt, rows[:held_out] if held_out else rows, dev)
    tmp = out / ".weights"
    shutil.rmtree(tmp, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(str(tmp))
    for old in model_dir.glob(f"*{WEIGHT_SUFFIX}"):
        old.unlink()
    (model_dir / fixtures.WEIGHTS_STAMP).unlink(missing_ok=True)   # the random weights' stamp: not these
    for p in tmp.glob(f"*{WEIGHT_SUFFIX}"):
        shutil.move(str(p), model_dir / p.name)
    shutil.rmtree(tmp)
    doc = {"inputs_sha256": digest, "inputs": parts, "seed": seed, "steps": steps, "lr": lr, "batch": batch,
           "shape": parts["shape"], "parameters": sum(p.numel() for p in model.parameters()),
           "train_seconds": trained["seconds"], "loss_first": trained["loss_first"], "loss_last": trained["loss_last"],
           **ev, "vocab": vocab, "ln_vocab": math.log(vocab), "entropy_limit": math.log(vocab) * ENTROPY_FRACTION,
           "accept": {"accuracy": [ACCEPT_MIN, ACCEPT_MAX], "entropy_below": "ln(vocab)/3"},
           "weights": _weights(model_dir), "model": str(model_dir), "device": str(dev),
           "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
           "torch": torch.__version__, "transformers": transformers.__version__}
    doc["accepted"] = not acceptance(doc)
    (out / RESULT).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return {**doc, "reused": False}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pretrain.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="DIR: DIR/model (trained), DIR/pretrain.json")
    p.add_argument("--fixtures", type=Path, help="model/ (config, tokenizer), data/train.jsonl, prompt.txt "
                                                 "(default: written from --seed into DIR/fixtures)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help=f"optimizer steps (default {DEFAULT_STEPS})")
    p.add_argument("--lr", type=float, default=DEFAULT_LR, help=f"AdamW learning rate (default {DEFAULT_LR:g})")
    p.add_argument("--batch", type=int, default=DEFAULT_BATCH, help=f"problems per step (default {DEFAULT_BATCH})")
    p.add_argument("--device", help="cuda, cuda:0, cpu (default: cuda when there is one)")
    p.add_argument("--tiny", action="store_true", help="tests only: a tiny model instead of Qwen2.5-0.5B's shape")
    p.add_argument("--held-out", type=int, help="tests only: evaluate the first N held-out problems (default all)")
    a = p.parse_args(argv)
    doc = run(a.out, a.fixtures, seed=a.seed, steps=a.steps, lr=a.lr, batch=a.batch, tiny=a.tiny, device=a.device,
              held_out=a.held_out)
    neg = (f"{doc['accuracy_negative']:.3f} on the {doc['negative_answers']} negative answers"   # the gap
           if doc.get("negative_answers") else "no negative answer held out")
    print(f"[pretrain] training time {doc['train_seconds']}s ({doc['steps']} steps"
          f"{', reused' if doc['reused'] else ''}), held-out greedy accuracy {doc['accuracy']:.3f} "
          f"({doc['held_out']} problems, {doc['reward_rule']}; {neg}), mean entropy {doc['entropy']:.3f} nats "
          f"(limit {doc['entropy_limit']:.3f}); {Path(a.out) / RESULT}", flush=True)
    bad = acceptance(doc)
    if bad:
        print(f"error: the pretrained model is not accepted: {'; '.join(bad)}", file=sys.stderr)
        print(f"next: `python3 {Path(__file__).name} --out {a.out} --steps N` with other steps "
              f"(default {DEFAULT_STEPS}), then change DEFAULT_STEPS in pretrain.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
