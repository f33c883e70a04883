"""What the mini test reports: the ranks' results folded into the metrics and the problems that
fail the run (the markers every rank must log, the gates on the log-prob errors), and the one JSON
result line, the last on stdout (for tools/nightly.py's judge)."""

from __future__ import annotations

import json
import os

from rank import MARK_EXPERT, MARK_GTP, MARK_RESHARD
from settings import Settings


def te_version() -> str | None:
    try:
        import transformer_engine
    except ImportError:
        return None
    return getattr(transformer_engine, "__version__", "unknown")


def emit(result: dict, s: Settings) -> None:
    line = json.dumps(result, sort_keys=True)
    if s.out:
        os.makedirs(s.out, exist_ok=True)
        with open(os.path.join(s.out, "result.json"), "w") as f:
            f.write(line + "\n")
    print(line, flush=True)


_ARM_KEYS = ("setup_mib", "train_state_mib", "peak_mib", "step_seconds", "refit_seconds", "refit_bytes_received")


def summarize(ok: dict[int, dict], s: Settings) -> tuple[dict, list[str]]:
    """Fold the ranks' results into the metrics and the problems that fail the run.

    A run whose train step was skipped (MoE over gloo) reports ``train_step`` with the reason and
    no training metric at all: nothing it did not measure can pass a gate.
    """
    ranks = [ok[r] for r in sorted(ok)]
    g = [r["gtp"] for r in ranks]
    skipped = sorted({x["train_step"] for x in g if x["train_step"] != "ran"})
    metrics = {
        "train_step": skipped[0] if skipped else "ran",
        "gtp_sharded_params": ranks[0]["gtp_sharded_params"],
        "expert_gtp_sharded_params": g[0]["expert_gtp_sharded_params"],
        "ckpt_tensors_checked": min(x["ckpt_tensors_checked"] for x in g),
        "refit_tensors": g[0]["refit_tensors"], "refit_gathered": g[0]["refit_gathered"],
        "refit_padded": g[0]["refit_padded"], "refit_expert_gathered": g[0]["refit_expert_gathered"],
        # The inference model's mean log-prob of what it sampled: depends on the seed (weights, samples).
        "sample_logprob_mean": sum(x["sample_logprob_sum"] for x in g) / sum(x["samples"] for x in g),
        "refit_seconds": max(x["refit_seconds"] for x in g),
    }
    if not skipped:
        count = sum(x["tokens_compared"] for x in g)
        metrics.update({
            "token_mult_prob_error": sum(x["token_mult_prob_error_sum"] for x in g) / count,
            "token_mult_prob_error_per_step": [
                sum(x["steps"][k]["token_mult_prob_error"] for x in g) / len(g) for k in range(s.steps)],
            "max_abs_logprob_diff": max(x["max_abs_logprob_diff"] for x in g),
            "ckpt_token_mult_prob_error": sum(x["ckpt_err_sum"] for x in g) / sum(x["ckpt_count"] for x in g),
            "ckpt_max_abs_logprob_diff": max(x["ckpt_max_abs_logprob_diff"] for x in g),
            "loss_per_step": [g[0]["steps"][k]["loss"] for k in range(s.steps)],
            "grad_norm_per_step": [g[0]["steps"][k]["grad_norm"] for k in range(s.steps)],
            "grad_norm": g[0]["grad_norm"],
            "tokens": int(count),
        })
        # Cost: the worst rank of each arm (max), and GTP's ratio to GTP off.
        for key in _ARM_KEYS:
            metrics[f"gtp_{key}"] = max(x[key] for x in g)
    if not skipped and all("gtp_off" in r for r in ranks):
        for key in _ARM_KEYS:
            off = max(r["gtp_off"][key] for r in ranks)
            metrics[f"off_{key}"] = off
            if off:
                metrics[f"ratio_{key}"] = metrics[f"gtp_{key}"] / off
        metrics["off_grad_norm_per_step"] = [ranks[0]["gtp_off"]["steps"][k]["grad_norm"] for k in range(s.steps)]
        metrics["off_token_mult_prob_error"] = (
            sum(r["gtp_off"]["token_mult_prob_error_sum"] for r in ranks)
            / sum(r["gtp_off"]["tokens_compared"] for r in ranks))
    problems = []
    marks = (MARK_GTP, MARK_RESHARD) + ((MARK_EXPERT,) if s.experts and s.expert_gtp > 1 else ())
    for rank, res in sorted(ok.items()):
        for mark in marks:
            if not any(m.startswith(mark) for m in res["markers"]):
                problems.append(f"rank {rank} never logged {mark!r}")
    for key in ("token_mult_prob_error", "ckpt_token_mult_prob_error"):
        if key in metrics and not metrics[key] < s.max_error:
            problems.append(f"{key} {metrics[key]:.6f} is not below {s.max_error}")
    return metrics, problems
