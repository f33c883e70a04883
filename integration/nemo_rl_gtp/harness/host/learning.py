"""The learning cases on the GPU host: their model, what their run log says about each refit, their verdict.

- the model: ``random`` is the setup's build from the seed; ``trained`` is the pretrain step
  (pretrain.py) on one GPU of the host, from that same build, cached in ROOT/pretrained/<sha256 of
  its inputs>/ so that every case of a call (and later calls while the machine is warm) reuses it;
  ``--model released`` runs every case on Qwen/Qwen2.5-0.5B from Hugging Face instead (a host that
  reaches it; the script's own model name, downloads allowed).
- the harness metrics: the refit check's lines (hooks/carry_refit_check.py, one per rank after each
  refit) read back from run.log into ``harness/*`` series beside the script's metrics in
  metrics.json, so the nightly's gates and the case's verdict read the same numbers. A step the run
  logged a metric for but that has no check line from every rank counts as unverified.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import sys
from pathlib import Path

from carry.errors import OperationError
from carry.nightly.runlog import loads_object

from ..models import fixtures
from . import cases as casing

PRETRAIN_PY = Path(__file__).resolve().parents[1] / "models" / "pretrain.py"   # run as a script on GPU 0
RELEASED = "Qwen/Qwen2.5-0.5B"   # the functional script's own policy.model_name
MODEL_FORMS = ("default", "released")
UNVERIFIED, EQUAL, DRIFT, CHANGED = casing.UNVERIFIED, casing.EQUAL, casing.DRIFT, casing.CHANGED
STEPS_FROM = "train/token_mult_prob_error"   # the steps the run reached, as its metrics say


def pretrain_fixtures(lay) -> Path:
    """The folder pretrain.py reads: the setup's model (config, tokenizer, the seed's weights), data, prompt."""
    doc = lay.stage_doc()["fixtures"]
    fx = lay.root / "pretrain-fixtures"
    (fx / "data").mkdir(parents=True, exist_ok=True)
    link = fx / "model"
    if link.is_symlink() or link.exists():
        link.unlink() if link.is_symlink() else shutil.rmtree(link)
    link.symlink_to(lay.model, target_is_directory=True)
    shutil.copy2(lay.payload / doc["data"], fx / "data" / "train.jsonl")
    fixtures.write_validation(fx / "data" / fixtures.VALIDATION_FILE, doc["seed"], fx / "data" / "train.jsonl")
    staged = lay.payload / doc.get("prompt", "fixtures/prompt.txt")
    if staged.exists():
        shutil.copy2(staged, fx / "prompt.txt")
    else:   # a payload staged before prompt.txt was: the same bytes (stage checks them against cot.txt)
        (fx / "prompt.txt").write_text(fixtures.COT_PROMPT, encoding="utf-8")
    return fx


def trained_model(lay, log, stream, *, python: str | None = None, gpu: str = "0", timeout: float = 1200,
                  extra: list[str] | None = None) -> tuple[Path, dict]:
    """ROOT/pretrained/<key>/model, trained once on one GPU and reused while its inputs are the same.

    STREAM is setup.stream (one subprocess runner for the harness). Raises when the step fails,
    the acceptance included: a learning case never starts from a model outside the window.
    """
    from ..models.pretrain import DEFAULT_BATCH, DEFAULT_LR, DEFAULT_STEPS, inputs_digest

    fx = pretrain_fixtures(lay)
    seed = lay.stage_doc()["fixtures"]["seed"]
    key, _ = inputs_digest(fx, seed=seed, steps=DEFAULT_STEPS, lr=DEFAULT_LR, batch=DEFAULT_BATCH, tiny=False)
    out = lay.root / "pretrained" / key[:16]
    argv = [python or str(lay.vpython), str(PRETRAIN_PY), "--out", str(out), "--fixtures", str(fx),
            "--seed", str(seed), *(extra or [])]
    env = {"CUDA_VISIBLE_DEVICES": gpu, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    from .setup import child_env
    rc = stream(argv, log, env=child_env(env), timeout=timeout)
    result = out / "pretrain.json"
    if result.exists():   # beside the log (OUT), accepted or not: the figures come back either way
        shutil.copy2(result, Path(log.name).with_name("pretrain.json"))
    if rc != 0 or not result.exists():
        raise OperationError(f"the pretrain step failed (exit {rc}; {result if result.exists() else 'no result'}): "
                             f"see {log.name}")
    return out / "model", json.loads(result.read_text())


def model_for(lay, case: casing.Case, log, stream, form: str = "default") -> tuple[str, dict[str, str], dict | None]:
    """(policy.model_name, environment to add, the pretrain result) for CASE."""
    if form == "released":
        # Downloads allowed: the model (and its tokenizer) from Hugging Face, as NeMo-RL's own test runs.
        return RELEASED, {"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0"}, None
    if case.model == "trained":
        model, doc = trained_model(lay, log, stream)
        return str(model), {}, doc
    from .setup import model_for as built_model
    return str(built_model(lay, case)), {}, None


# -- what the run log says ---------------------------------------------------------------------------
_CHECK = re.compile(casing.REFIT_CHECK_LINE)
_DRIFT = re.compile(casing.WEIGHT_CHANGE_LINE)


def harness_metrics(log: str, steps: list[str], ranks: int, tensors: int | None = None,
                    swaps: int | None = None) -> dict[str, dict[str, float]]:
    """Per step: tensors not shown equal on the worst rank (missing lines count all), the weights' drift.

    The hook numbers its lines by swap, 1, 2, ... in the order made, and NeMo-RL swaps each time it prepares
    generation: before the start validation, before each step's generation and before the end validation
    (8 swaps for 6 steps, h100/2026-12-05-learning-passed). Every swap counts: those numbered past the last
    step (the last step's own and the end validation's) are judged in the last step's value, where the
    gated series end (their steps are the run's 1..N); its drift is the latest swap's. SWAPS: how many the run
    made (merge_metrics: one per step and one per validation); one with no line is unverified, all of it.
    TENSORS is how many the model has (model_tensors): a line that checked fewer ("10 of 10") leaves
    the rest unverified. Without it (an unknown model) the most any line counted stands in."""
    seen: dict[str, dict[int, tuple[int, int]]] = {}
    drift: dict[str, dict[int, tuple[float, float]]] = {}
    from carry.nightly.runlog import SEPARATORS, log_lines

    for line in log_lines(log):   # split at \n alone; a line other separators split or join counts for nothing
        if any(c in line for c in SEPARATORS):
            continue
        m = _CHECK.fullmatch(line)
        if m:
            seen.setdefault(m["step"], {})[int(m["rank"])] = (int(m["equal"]), int(m["n"]))
        d = _DRIFT.fullmatch(line)
        if d:
            rel, frac = float(d["rel"]), float(d["frac"])
            if not (math.isfinite(rel) and rel >= 0 and _within(frac, 0.0, 1.0)):   # what no drift can be: NaN, so
                rel = frac = math.nan                                                # the gate reading it fails
            drift.setdefault(d["step"], {})[int(d["rank"])] = (rel, frac)
    total = tensors or max((n for per in seen.values() for _, n in per.values()), default=1)
    last = max((int(s) for s in steps if s.isdigit()), default=None)
    later = [] if last is None else sorted({int(k) for k in (*seen, *drift) if int(k) > last}
                                           | set(range(last + 1, (swaps or 0) + 1)))
    out: dict[str, dict[str, float]] = {UNVERIFIED: {}, EQUAL: {}, DRIFT: {}, CHANGED: {}}
    for step in steps:
        labels = [step] + ([str(k) for k in later] if step.isdigit() and int(step) == last else [])
        unverified, equal = [], []
        for label in labels:
            per = seen.get(label, {})
            if set(per) >= set(range(ranks)):
                unverified.append(float(max(max(n, total) - eq for eq, n in per.values())))
                equal.append(float(min(eq for eq, _ in per.values())))
            else:
                unverified.append(float(max(total, 1)))   # a rank said nothing: nothing was shown
        out[UNVERIFIED][step] = max(unverified)
        if len(equal) == len(labels):
            out[EQUAL][step] = min(equal)
        moves = [m for m in (_moved(drift.get(label, {}), ranks) for label in labels) if m is not None]
        if moves:   # the latest swap's drift; a NaN at any of them stays NaN, and the gate reading it fails
            for key, i in ((DRIFT, 0), (CHANGED, 1)):
                vals = [mv[i] for mv in moves]
                out[key][step] = math.nan if any(math.isnan(v) for v in vals) else vals[-1]
    return {k: v for k, v in out.items() if v}


def _moved(per_rank: dict[int, tuple[float, float]], ranks: int) -> tuple[float, float] | None:
    """One swap's drift, (relative L2, changed fraction): the least any rank shows (a NaN stays NaN: min()
    would drop it by its place in the list); (0, 0) when a rank said nothing (no movement was shown); None
    when no rank did."""
    if not per_rank:
        return None
    if not set(per_rank) >= set(range(ranks)):
        return (0.0, 0.0)
    return tuple(math.nan if any(math.isnan(v[i]) for v in per_rank.values()) else min(v[i] for v in per_rank.values())
                 for i in (0, 1))


def model_tensors(case: casing.Case, config: dict | None = None) -> int:
    """How many tensors the training model has, from the model's config (the check must show them all):
    Megatron's Qwen2 layout (TE layer spec) has per layer the fused QKV weight, its bias and its input
    norm, the output projection, the fused gate/up weight and its norm, the down projection (7), then
    the embedding and the final norm, and an output layer unless the embeddings are tied."""
    from ..models import fixtures
    cfg = config or fixtures.SHAPE
    if case.shape != "dense":
        raise ValueError(f"case {case.name}: no tensor count for shape {case.shape}")
    return 7 * int(cfg["num_hidden_layers"]) + 2 + (0 if cfg.get("tie_word_embeddings") else 1)


GAIN, START, END = casing.GAIN, "harness/validation/accuracy_start", "harness/validation/accuracy_end"
VALIDATION = "validation/accuracy"   # NeMo-RL's own: logged at step 0 (val_at_start) and after the last step


def validation_metrics(metrics: dict, last_step: int | None) -> dict[str, float]:
    """Start, end and gain of the held-out accuracy, as scalars (one number each, not a step series): the
    start is NeMo-RL's validation at step 0, the end the one at the last step the run was set for. Either
    missing (the run stopped early, or never validated): nothing, and the gate on the gain fails."""
    series = metrics.get(VALIDATION)
    if not isinstance(series, dict) or last_step is None:
        return {}
    start, end = series.get("0"), series.get(str(last_step))
    if not all(_accuracy(v) for v in (start, end)):   # a gain from accuracies no run can have is no gain
        return {}
    return {START: float(start), END: float(end), GAIN: float(end) - float(start)}


_ANSWER = re.compile(r"\[validation-answer\] (.*)$")   # hooks/carry_learning.py's say_answers


def validation_by_sign(log: str) -> dict | None:
    """{"validations": {index: {"negative": [right, answers], "rest": [right, answers]}}, "unreadable": n} from
    the run's [validation-answer] lines: the held-out accuracy told apart where the pretrain corpus left its gap
    (the problems whose true answer is negative, pretrain.SIGN_DROP). None when the run printed no such line. A
    line that is not one answer (not a JSON object, a key twice, a reward that is no number in [0, 1], no
    problem of the fixtures' form) is counted unreadable, never skipped silently."""
    validations: dict[str, dict[str, list[int]]] = {}
    unreadable = 0
    for line in log.split("\n"):
        m = _ANSWER.search(line.rstrip("\r"))
        if not m:
            continue
        answer = _answer(m.group(1))
        if answer is None:
            unreadable += 1
            continue
        index, reward, truth = answer
        kind = validations.setdefault(index, {"negative": [0, 0], "rest": [0, 0]})[
            "negative" if truth.startswith("-") else "rest"]
        kind[0] += reward == 1.0
        kind[1] += 1
    return {"validations": validations, "unreadable": unreadable} if validations or unreadable else None


def _answer(text: str) -> tuple[str, float, str] | None:
    """(validation index, reward, the problem's true answer) of one [validation-answer] JSON, else None."""
    try:
        row = loads_object(text)
        index, reward, truth = int(row["validation"]), row["reward"], fixtures.answer_of(str(row["problem"]))
    except (ValueError, KeyError, TypeError):
        return None
    return (str(index), reward, truth) if truth is not None and _within(reward, 0.0, 1.0) else None


def _within(v, low: float, high: float) -> bool:
    """Whether V is a number (not a bool) from LOW to HIGH, so never NaN or infinite."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and low <= v <= high


def _accuracy(v) -> bool:
    return _within(v, 0.0, 1.0)


def best_lr(gains: dict[str, object]) -> tuple[str, float] | None:
    """The lr recipe with the highest held-out gain, of {lr: the gain its metrics.json holds}; a gain that is
    missing or not a difference of two accuracies (not a number, NaN, beyond +-1) counts as none measured.
    None when no recipe measured one. A tie goes to the first listed."""
    best = None
    for lr, gain in gains.items():
        if _within(gain, -1.0, 1.0) and (best is None or gain > best[1]):
            best = (lr, float(gain))
    return best


def recipe_gains(out: Path, lrs: list[str]) -> dict[str, object]:
    """{lr: GAIN from OUT/case-learning-lr<lr>/metrics.json}, None where that file is missing or unreadable."""
    got: dict[str, object] = {}
    for lr in lrs:
        try:
            got[lr] = json.loads((out / f"case-learning-lr{lr}" / "metrics.json").read_text()).get(GAIN)
        except (OSError, ValueError, AttributeError):
            got[lr] = None
    return got


def main(argv: list[str]) -> int:
    """python3 -m harness.host.learning best-lr OUT LR...: print the best recipe's lr (exit 1 if none)."""
    if len(argv) < 3 or argv[0] != "best-lr":
        print("usage: python3 -m harness.host.learning best-lr OUT LR...", file=sys.stderr)
        return 2
    gains = recipe_gains(Path(argv[1]), argv[2:])
    for lr, gain in gains.items():
        print(f"lr {lr}: held-out gain {gain}", file=sys.stderr)
    best = best_lr(gains)
    if best is None:
        return 1
    print(best[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


def merge_metrics(out: Path, ranks: int, *, refit: bool = True, tensors: int | None = None,
                  last_step: int | None = None) -> dict:
    """OUT/metrics.json gets the harness series, computed from the raw files alone: run.log and the script's
    own metrics (kept as script-metrics.json, and read from there when it is already). TENSORS: how many
    the model has (model_tensors); LAST_STEP: the step the run was set to end at (the end validation's)."""
    path, raw = out / "metrics.json", out / "script-metrics.json"
    source = raw if raw.exists() else path
    if not source.exists():
        return {}
    from carry.nightly.runlog import loads_object

    try:   # a key twice is ambiguous (the judge's reader): nothing is merged, and the case's gates find nothing
        metrics = loads_object(source.read_text())
    except ValueError:
        return {}
    log = (out / "run.log").read_text(errors="replace") if (out / "run.log").exists() else ""
    steps = sorted((metrics.get(STEPS_FROM) or {}), key=lambda s: int(s) if str(s).isdigit() else 0)
    validations = metrics.get(VALIDATION) if isinstance(metrics.get(VALIDATION), dict) else {}
    swaps = len(steps) + len(validations)   # NeMo-RL swaps each time it prepares generation
    extra = harness_metrics(log, [str(s) for s in steps], ranks, tensors, swaps) if refit else {}
    extra.update(validation_metrics(metrics, last_step))
    if source is path:
        shutil.copy2(path, raw)
    path.write_text(json.dumps({**metrics, **extra}, indent=2, sort_keys=True) + "\n")
    return extra


