"""The model, tokenizer and data a GRPO run needs when nothing can be downloaded.

A Qwen2 of the Qwen2.5 shape in miniature (tied embeddings, SwiGLU, QKV bias,
RMSNorm, rotary, grouped-query attention), randomly initialised; a byte-level
BPE tokenizer trained on the run's own text, with a ChatML template and
eos/pad set; and arithmetic problems as JSON lines. Everything comes from one
seed: building twice gives the same bytes.
"""

from __future__ import annotations

import json
import random
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
# The shape the issue asks for; the vocabulary is the tokenizer's, padded by Megatron.
SHAPE = {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 512, "vocab_size": 1024, "max_position_embeddings": 1024}
DATA_KEYS = ("problem", "expected_answer")


def problems(seed: int, n: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        op = rng.choice("+-*")
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        out.append({DATA_KEYS[0]: f"What is {a} {op} {b}?", DATA_KEYS[1]: str(value)})
    return out


def write_dataset(path: Path, seed: int, n: int = 256) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in problems(seed, n):
            f.write(json.dumps(row, sort_keys=True) + "\n")
    return path


def _corpus(seed: int, prompt_text: str) -> list[str]:
    """What the tokenizer will see: the prompts as the chat template renders them, and answers."""
    lines = []
    for row in problems(seed + 1, 2000):
        user = prompt_text.replace("{}", row[DATA_KEYS[0]])
        lines.append(f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")
        lines.append(f"The answer is \\boxed{{{row[DATA_KEYS[1]]}}}.<|im_end|>")
    return lines


def build_tokenizer(out: Path, seed: int, prompt_text: str = "{}") -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=SHAPE["vocab_size"] - 16, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(seed, prompt_text), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD,
                                   additional_special_tokens=["<|im_start|>"], model_max_length=SHAPE["max_position_embeddings"])
    fast.chat_template = CHAT_TEMPLATE
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    return out


def build_model(out: Path, seed: int) -> Path:
    """A randomly initialised tiny Qwen2 next to its tokenizer (call build_tokenizer first)."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tok = AutoTokenizer.from_pretrained(str(out))
    if len(tok) > SHAPE["vocab_size"]:
        raise ValueError(f"tokenizer has {len(tok)} tokens, more than the model's {SHAPE['vocab_size']}")
    cfg = Qwen2Config(**SHAPE, hidden_act="silu", tie_word_embeddings=True, rms_norm_eps=1e-6,
                      rope_theta=10000.0, use_sliding_window=False, attention_dropout=0.0,
                      bos_token_id=tok.convert_tokens_to_ids(PAD), eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, torch_dtype="bfloat16")
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    return out


def build_all(root: Path, seed: int, prompt_text: str = "{}") -> dict[str, str]:
    """root/model (weights + tokenizer) and root/data/train.jsonl; returns their paths."""
    model = build_tokenizer(root / "model", seed, prompt_text)
    build_model(model, seed)
    data = write_dataset(root / "data" / "train.jsonl", seed)
    return {"model": str(model), "data": str(data)}
