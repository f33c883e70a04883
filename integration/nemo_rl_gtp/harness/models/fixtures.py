"""The model, tokenizer and data a GRPO run needs when nothing can be downloaded.

The model is Qwen/Qwen2.5-0.5B's exact shape (Qwen2ForCausalLM: hidden 896, 24
layers, 14 heads, 2 KV heads, FFN 4864, vocabulary 151936, tied embeddings,
SwiGLU, QKV bias, RMSNorm, rotary with theta 1e6, bf16), randomly initialised
from the seed; a byte-level BPE tokenizer trained on the run's own text, with a
ChatML template and eos/pad set; and arithmetic problems as JSON lines.

Its weights are about 1 GB, more than the ferry should carry, so they travel as
a recipe: the stage writes the config (and the tokenizer), and the GPU host (and
the dry-run) build the weights from that config with the same seed, on the CPU,
with :func:`build_weights`, and log their sha256. Everything comes from one seed:
building twice with the same torch gives the same bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import operator
import random
import re
import sys
from pathlib import Path

# Qwen2's ChatML markers. eos ends an assistant turn (generation stops there);
# pad is the base model's end-of-text.
EOS = "<|im_end|>"
PAD = "<|endoftext|>"
SPECIALS = [PAD, "<|im_start|>", EOS]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Qwen/Qwen2.5-0.5B's config.json, the numbers that give the model its shape. The functional
# script's generation settings (buffer_size_gb, max_tokens) are sized for this model.
SHAPE = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
         "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768,
         "max_window_layers": 24, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
         "use_sliding_window": False, "sliding_window": 32768, "hidden_act": "silu", "attention_dropout": 0.0,
         "initializer_range": 0.02}
# The tokenizer stays small (trained on the run's text); its ids are far below the model's vocabulary.
TOKENIZER_VOCAB = 1008
TOKENIZER_MAX_LENGTH = 1024
WEIGHTS_STAMP = "weights-built.json"   # beside the weights: the seed, the config's sha256, the files' sha256
DATA_KEYS = ("problem", "expected_answer")
PROMPT_FILE = "prompt.txt"
# NeMo-RL's math environment (HFVerifyWorker, hf_math_verify) compares the boxed gold answer with what
# math-verify extracts from the response; a boxed integer is the form it extracts first.
ANSWER_FORM = "\\boxed{{{}}}"
# examples/prompts/cot.txt at the pinned NeMo-RL commit (grpo_math_1B.yaml's data.default.prompt_file,
# which the functional script keeps). The stage checks it against the file itself; the copy lets the
# pretrain step run on a host that has no NeMo-RL tree.
COT_PROMPT = ("Think step-by-step to solve the following problem. Output your answer inside of \\\\boxed{{}} tags.:\n"
              "{}\n\nLet's think step-by-step")


OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
_PROBLEM = re.compile(r"What is (\d+) ([-+*]) (\d+)\?")


def problems(seed: int, n: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        op = rng.choice("".join(OPS))
        out.append({DATA_KEYS[0]: f"What is {a} {op} {b}?", DATA_KEYS[1]: str(OPS[op](a, b))})
    return out


def answer_of(text: str) -> str | None:
    """The true answer to the problem of problems()'s form found in TEXT (a prompt around it too), else None."""
    m = _PROBLEM.search(text)
    return str(OPS[m.group(2)](int(m.group(1)), int(m.group(3)))) if m else None


# How an answer to a problem is scored: NeMo-RL's math environment (the pretrain step's acceptance).
_BOXED = re.compile(r"\\boxed\s*\{\s*([^{}]*?)\s*\}")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def reward_rule():
    """The math environment's check: math-verify as HFVerifyWorker configures it when importable, else
    a re-implementation of its acceptance of integers (named in the result)."""
    try:
        from math_verify.metric import math_metric
        from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig
    except ImportError:
        def check(response: str, truth: str) -> float:
            # The last boxed answer, else the last number (math-verify's expression target), as a number.
            found = _BOXED.findall(response) or _NUMBER.findall(response)
            if not found:
                return 0.0
            try:
                return float(float(found[-1].replace(" ", "")) == float(truth))
            except ValueError:
                return 0.0
        return check, "re-implementation: the last \\boxed{} (else the last number) equals the integer"
    from importlib.metadata import version
    verify = math_metric(gold_extraction_target=(LatexExtractionConfig(),),
                         pred_extraction_target=(ExprExtractionConfig(), LatexExtractionConfig()))

    def check(response: str, truth: str) -> float:
        try:
            return float(verify(["\\boxed{" + truth + "}"], [response])[0])
        except Exception:  # noqa: BLE001 - the environment scores any verifier failure 0 too
            return 0.0
    return check, f"math-verify {version('math-verify')} (HFVerifyWorker's math_metric)"


# The learning cases' held-out validation set (NeMo-RL's own validation, before the first step and after
# the last): problems of the same generator that neither GRPO (train.jsonl) nor the pretrain step (which
# skips them too) trains on. Its size sets the learning gate's margin (nightly.toml).
VALIDATION_PROBLEMS = 1024
VALIDATION_FILE = "validation.jsonl"


def validation_problems(seed: int, exclude: set[str], n: int = VALIDATION_PROBLEMS) -> list[dict[str, str]]:
    """N distinct problems, none of EXCLUDE (the GRPO prompts), from their own stream of the seed."""
    rng = random.Random(f"validation-{seed}")
    out, seen = [], set(exclude)
    while len(out) < n:
        row = problems(rng.randrange(1 << 62), 1)[0]
        if row[DATA_KEYS[0]] not in seen:
            seen.add(row[DATA_KEYS[0]])
            out.append(row)
    return out


def write_validation(path: Path, seed: int, train: Path, n: int = VALIDATION_PROBLEMS) -> Path:
    """PATH gets the held-out set for the GRPO prompts in TRAIN (a jsonl of problems)."""
    exclude = {json.loads(x)[DATA_KEYS[0]] for x in train.read_text(encoding="utf-8").splitlines() if x.strip()}
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in validation_problems(seed, exclude, n):
            f.write(json.dumps(row, sort_keys=True) + "\n")
    return path


def write_dataset(path: Path, seed: int, n: int = 256) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in problems(seed, n):
            f.write(json.dumps(row, sort_keys=True) + "\n")
    return path


def prompt_text(prompt: str | None, problem: str) -> str:
    """The user turn as NeMo-RL's math_hf_data_processor writes it: ``prompt.format(problem)``."""
    return prompt.format(problem) if prompt else problem


def completion(answer: str) -> str:
    """The answer as the math environment rewards it: math-verify's boxed form (eos added by the caller)."""
    return ANSWER_FORM.format(answer)


def _corpus(seed: int, prompt: str | None) -> list[str]:
    """What the tokenizer will see: the prompts as the chat template renders them, and answers."""
    lines = []
    for row in problems(seed + 1, 2000):
        user = prompt_text(prompt, row[DATA_KEYS[0]])
        lines.append(f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")
        lines.append(completion(row[DATA_KEYS[1]]) + EOS)
    return lines


def build_tokenizer(out: Path, seed: int, prompt: str | None = None) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Digits one by one, as Qwen2's own tokenizer splits them: arithmetic is learnable digit by digit.
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TOKENIZER_VOCAB, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(seed, prompt), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD,
                                   additional_special_tokens=["<|im_start|>"], model_max_length=TOKENIZER_MAX_LENGTH)
    fast.chat_template = CHAT_TEMPLATE
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    return out


def write_model_config(out: Path) -> Path:
    """config.json and generation_config.json of the model, next to its tokenizer (build_tokenizer first)."""
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config

    tok = AutoTokenizer.from_pretrained(str(out))
    if len(tok) > SHAPE["vocab_size"]:
        raise ValueError(f"tokenizer has {len(tok)} tokens, more than the model's {SHAPE['vocab_size']}")
    cfg = Qwen2Config(**SHAPE, bos_token_id=tok.convert_tokens_to_ids(PAD), eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, torch_dtype="bfloat16")
    cfg.architectures = ["Qwen2ForCausalLM"]
    cfg.save_pretrained(str(out))
    GenerationConfig.from_model_config(cfg).save_pretrained(str(out))
    return out


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def weight_files(model_dir: Path) -> list[Path]:
    return sorted(p for p in model_dir.iterdir() if p.name.endswith(".safetensors")
                  or p.name == "model.safetensors.index.json")


def kept_weights(model_dir: Path, seed: int) -> tuple[str, dict | None]:
    """(the config's sha256, the stamp marked reused) when MODEL_DIR's weights were built from this
    config and SEED and their bytes still match the stamp; else (the config's sha256, None)."""
    config_sha = sha256(model_dir / "config.json")
    stamp = model_dir / WEIGHTS_STAMP
    if stamp.exists():
        old = json.loads(stamp.read_text())
        files = {p.name: sha256(p) for p in weight_files(model_dir)}
        if old.get("seed") == seed and old.get("config_sha256") == config_sha and files and old.get("files") == files:
            return config_sha, {**old, "reused": True}
    return config_sha, None


def check_shape(model_dir: Path) -> dict:
    """The config in MODEL_DIR must be the shape above; returns what it says."""
    raw = json.loads((model_dir / "config.json").read_text())
    rope = raw.get("rope_theta", (raw.get("rope_parameters") or {}).get("rope_theta"))
    got = {k: (rope if k == "rope_theta" else raw.get(k)) for k in SHAPE if k != "sliding_window"}
    want = {k: v for k, v in SHAPE.items() if k != "sliding_window"}
    if raw.get("model_type") != "qwen2" or got != want:
        diff = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
        raise ValueError(f"{model_dir / 'config.json'} is not the Qwen2.5-0.5B shape: "
                         f"model_type {raw.get('model_type')!r}, (got, want) {diff}")
    return got


def build_weights(model_dir: Path, seed: int) -> dict:
    """The model's weights from MODEL_DIR/config.json and SEED: random init on the CPU, bf16, safetensors.

    The same function runs on the GPU host (setup) and in the dry-run. The config and the
    tokenizer files are left exactly as shipped; only the weight files are written. If
    MODEL_DIR already holds weights built from the same config and seed whose bytes still
    match the stamp, they are kept. Returns (and writes to the stamp) the seed, the config's
    sha256, each weight file's sha256, the parameter count and the versions that built it.
    """
    import shutil
    import tempfile
    import time

    model_dir = Path(model_dir)
    check_shape(model_dir)
    config_sha, kept = kept_weights(model_dir, seed)
    if kept is not None:
        return kept
    stamp = model_dir / WEIGHTS_STAMP
    import torch
    import transformers
    from transformers import AutoConfig, Qwen2ForCausalLM

    t0 = time.monotonic()
    stamp.unlink(missing_ok=True)
    for old_file in weight_files(model_dir):
        old_file.unlink()
    cfg = AutoConfig.from_pretrained(str(model_dir))
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    with tempfile.TemporaryDirectory(dir=model_dir.parent, prefix=".weights.") as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        del model
        for p in weight_files(Path(tmp)):
            shutil.move(str(p), model_dir / p.name)
    files = {p.name: sha256(p) for p in weight_files(model_dir)}
    doc = {"seed": seed, "config_sha256": config_sha, "files": files, "parameters": params,
           "bytes": sum((model_dir / n).stat().st_size for n in files), "torch": torch.__version__,
           "transformers": transformers.__version__, "seconds": round(time.monotonic() - t0, 1)}
    stamp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return {**doc, "reused": False}


def build_all(root: Path, seed: int, prompt: str | None = None) -> dict[str, str]:
    """root/model (tokenizer and config; no weights: build_weights makes them), root/data/train.jsonl
    and root/prompt.txt (the prompt file the run's config names, as given)."""
    model = build_tokenizer(root / "model", seed, prompt)
    write_model_config(model)
    data = write_dataset(root / "data" / "train.jsonl", seed)
    (root / PROMPT_FILE).write_text(prompt or "", encoding="utf-8")
    return {"model": str(model), "data": str(data), "prompt": str(root / PROMPT_FILE)}


def main(argv: list[str]) -> int:
    """python fixtures.py weights MODEL_DIR --seed N [--json FILE]: run in the environment that will use them.
    python fixtures.py write DIR --seed N [--prompt-file FILE]: DIR/model (config, tokenizer), DIR/data, DIR/prompt.txt."""
    p = argparse.ArgumentParser(prog="fixtures.py")
    p.add_argument("what", choices=["weights", "write"])
    p.add_argument("dir", type=Path)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--json", type=Path)
    p.add_argument("--prompt-file", type=Path, help="write: the prompt file (default: the copy of NeMo-RL's cot.txt)")
    a = p.parse_args(argv)
    if a.what == "write":
        prompt = a.prompt_file.read_text(encoding="utf-8") if a.prompt_file else COT_PROMPT
        doc = {"seed": a.seed, **build_all(a.dir, a.seed, prompt)}
    else:
        doc = build_weights(a.dir, a.seed)
    return print_report(doc, a.json)


def print_report(doc: dict, json_path: Path | None) -> int:
    """What a weights build reports, on stdout and (``--json FILE``) in FILE, which the host's
    setup reads (host/setup.py build_weights_from_stage)."""
    text = json.dumps(doc, sort_keys=True)
    if json_path:
        json_path.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
