"""The mini test's MoE shape (``--shape moe-tiny``), on the CPU: its arguments and config, and how
a run whose train step cannot run over gloo is reported and judged (named, never a pass).

What needs a GPU (building the TE grouped experts, the refit, the checkpoints) runs in the
nightly cells gtp-refit-mini-moe-gloo (one GPU) and gtp-refit-mini-moe-nccl (two).
"""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
from carry.nightly.judge import judge, numeric_metrics, parse_gate
from helpers import MINI, ROOT, mini_test_module

SKIP = "skipped: gloo has no coalesced collectives"


@pytest.fixture(scope="module")
def mini():
    """run.py as a module, and the sibling modules it imports (rank, model, ...), then forgotten."""
    with mini_test_module("mini_run_moe") as module:
        yield SimpleNamespace(run=module, rank=sys.modules["rank"], model=sys.modules["model"],
                              ckpt=sys.modules["ckpt"], report=sys.modules["report"])


def _cells():
    from carry.nightly.config import load

    return {t.name: t for t in load(ROOT / "integration" / "nightly.toml").tests}


def test_moe_tiny_is_experts_with_gtp_on_both_axes(mini):
    s, _ = mini.run.parse_args(["--shape", "moe-tiny"])
    assert (s.experts, s.topk, s.expert_gtp, s.gtp, s.tied) == (4, 2, 2, 2, False)
    assert (s.vocab, s.hidden, s.moe_ffn) == (512, 128, 128)
    s, _ = mini.run.parse_args(["--shape", "moe-tiny", "--expert-gtp", "1", "--tied"])
    assert (s.expert_gtp, s.tied) == (1, True)  # flags win over the shape
    dense, _ = mini.run.parse_args([])
    assert (dense.experts, dense.expert_gtp, dense.tied) == (0, 1, True)  # the dense default is unchanged


@pytest.mark.parametrize("argv,why", [
    (["--expert-gtp", "2"], "--expert-gtp needs --experts"),
    (["--shape", "moe-tiny", "--topk", "5"], "--topk 5 must be between 1 and --experts 4"),
    (["--shape", "moe-tiny", "--expert-gtp", "3"], "multiple of --expert-gtp 3"),
    (["--shape", "moe-tiny", "--compare-gtp-off"], "--compare-gtp-off compares trained arms"),
])
def test_moe_arguments_that_cannot_work_are_usage_errors(argv, why):
    res = subprocess.run([sys.executable, str(MINI), *argv], capture_output=True, text=True, timeout=120,
                         check=False)
    assert res.returncode == 2 and why in res.stderr, res.stderr


CONFIG_PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import run, model
s, _ = run.parse_args(["--shape", "moe-tiny"])
c = model.model_config(s, gtp=2, expert_gtp=2)
print(json.dumps({k: getattr(c, k) for k in ("num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size",
    "moe_grouped_gemm", "gated_linear_unit", "add_qkv_bias", "gtp_weight_remat_size",
    "expert_gtp_weight_remat_size")}))
"""


def test_moe_tiny_config_and_dry_check_on_the_pinned_megatron_core(mcore_tree):
    """The shape's TransformerConfig, built by megatron-core 0.19.2 itself (its own validation, its
    own derivation of both GTP sizes), and --dry-check finding every expert API the test uses."""
    import json

    env = {"PYTHONPATH": str(mcore_tree), "PATH": "/usr/bin:/bin"}
    res = subprocess.run([sys.executable, "-c", CONFIG_PROBE, str(MINI.parent)], capture_output=True, text=True,
                         timeout=300, env=env, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    config = json.loads(res.stdout.strip().splitlines()[-1])
    assert config == {"num_moe_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden_size": 128, "moe_grouped_gemm": True,
                      "gated_linear_unit": True, "add_qkv_bias": True, "gtp_weight_remat_size": 2,
                      "expert_gtp_weight_remat_size": 2}
    res = subprocess.run([sys.executable, str(MINI), "--shape", "moe-tiny", "--dry-check"], capture_output=True,
                         text=True, timeout=300, env=env, check=False)
    report = json.loads(res.stdout.strip().splitlines()[-1])
    assert res.returncode == 0 and report["ok"] and report["problems"] == [], report
    assert report["settings"]["experts"] == 4 and report["settings"]["expert_gtp"] == 2


def test_only_expert_gtp_over_gloo_skips_the_train_step(mini):
    s = mini.run.parse_args(["--shape", "moe-tiny"])[0]
    assert mini.rank.train_step_skip(s, 2) == SKIP
    assert mini.rank.train_step_skip(s, 1) is None  # experts unsharded: gloo trains them
    assert mini.rank.train_step_skip(mini.run.parse_args(["--shape", "moe-tiny", "--backend", "nccl"])[0], 2) is None
    assert mini.rank.train_step_skip(mini.run.parse_args([])[0], 1) is None


def _rank_result(rank, skipped: bool, expert_shards=16, marks=True):
    """One rank's result as rank.run_rank returns it (the fields summarize reads)."""
    steps = [{"step": k, "train_step": SKIP, "refit_seconds": 0.01} for k in range(2)] if skipped else [
        {"step": k, "loss": 0.0, "token_mult_prob_error": 1.0, "grad_norm": 0.5, "seconds": 0.1,
         "refit_seconds": 0.01} for k in range(2)]
    gtp = {"steps": steps, "train_step": SKIP if skipped else "ran", "expert_gtp_sharded_params": expert_shards,
           "ckpt_tensors_checked": 40, "sample_logprob_sum": -100.0, "samples": 64.0,
           "token_mult_prob_error_sum": 0.0 if skipped else 64.0, "tokens_compared": 0.0 if skipped else 64.0,
           "max_abs_logprob_diff": 0.0, "setup_mib": 1.0, "train_state_mib": None if skipped else 2.0,
           "peak_mib": 1.0,
           "step_seconds": 0.0 if skipped else 0.1, "refit_seconds": 0.01, "refit_bytes_received": 100, "refit_tensors": 40,
           "refit_gathered": 22, "refit_padded": 0, "refit_expert_gathered": expert_shards,
           "grad_norm": None if skipped else 0.5, "loss": None if skipped else 0.0}
    if not skipped:
        gtp.update(ckpt_err_sum=64.0, ckpt_count=64.0, ckpt_max_abs_logprob_diff=0.0)
    markers = ["[gtp] enabling GTP weight rematerialization (gtp_remat_size=2 expert_gtp_remat_size=2)",
               "[colocated-reshard] building dedicated inference model (...)"]
    if marks:
        markers.append(f"[gtp] expert weights GTP-sharded: {expert_shards} of 22 GTP shards")
    return {"rank": rank, "markers": markers, "gtp_sharded_params": 22, "gtp": gtp}


def _log(metrics: dict, marks=True) -> str:
    import json

    lines = ["[gtp] enabling GTP weight rematerialization (gtp_remat_size=2 expert_gtp_remat_size=2)",
             "[colocated-reshard] building dedicated inference model (inference TP=1 ...)",
             f"train_step: {SKIP} (...)"]
    if marks:
        lines.insert(1, "[gtp] expert weights GTP-sharded: 16 of 22 GTP shards (expert_gtp_remat_size=2)")
    return "\n".join(lines + [json.dumps(metrics)]) + "\n"


def test_a_skipped_train_step_is_named_and_reports_no_training_metric(mini):
    s = mini.run.parse_args(["--shape", "moe-tiny"])[0]
    metrics, problems = mini.report.summarize({r: _rank_result(r, True) for r in range(2)}, s)
    assert problems == []
    assert metrics["train_step"] == SKIP
    for key in ("token_mult_prob_error", "ckpt_token_mult_prob_error", "grad_norm", "loss_per_step"):
        assert key not in metrics, key  # nothing unmeasured can pass a gate
    assert metrics["expert_gtp_sharded_params"] == 16 and metrics["refit_expert_gathered"] == 16
    # A trained run reports the training metrics and train_step "ran".
    trained, _ = mini.report.summarize({r: _rank_result(r, False) for r in range(2)},
                                    mini.run.parse_args(["--shape", "moe-tiny", "--backend", "nccl"])[0])
    assert trained["train_step"] == "ran" and trained["token_mult_prob_error"] == 1.0


def test_summarize_fails_a_moe_run_without_the_expert_marker(mini):
    s = mini.run.parse_args(["--shape", "moe-tiny"])[0]
    _, problems = mini.report.summarize({r: _rank_result(r, True, marks=False) for r in range(2)}, s)
    assert problems == [f"rank {r} never logged '[gtp] expert weights GTP-sharded'" for r in range(2)]


def test_the_nightly_cells_judge_a_skipped_train_step_honestly(mini):
    """The gloo cell passes on what it covers; the nccl cell, given a run that did not train, fails
    (its training gates find no metric); a run with expert GTP off or without the marker fails
    the gloo cell too (gate red, or vacuous)."""
    cells = _cells()
    gloo, nccl = cells["gtp-refit-mini-moe-gloo"], cells["gtp-refit-mini-moe-nccl"]
    assert gloo.gpus == 1 and nccl.gpus == 2
    assert "moe-tiny" in gloo.argv and "gloo" in gloo.argv and "nccl" in nccl.argv
    s = mini.run.parse_args(["--shape", "moe-tiny"])[0]
    metrics, _ = mini.report.summarize({r: _rank_result(r, True) for r in range(2)}, s)
    doc = {"status": "passed", **metrics}

    def verdict(cell, doc, marks=True):
        return judge(rc=0, timed_out=False, text=_log(doc, marks), metrics=numeric_metrics(doc),
                     gates=cell.gates, markers=cell.markers)

    assert verdict(gloo, doc).status == "passed"
    v = verdict(nccl, doc)
    assert v.status == "failed" and "token_mult_prob_error" in v.reason and "missing" in v.reason
    off, _ = mini.report.summarize({r: _rank_result(r, True, expert_shards=0, marks=False) for r in range(2)}, s)
    v = verdict(gloo, {"status": "passed", **off}, marks=False)
    assert v.status == "failed" and "expert_gtp_sharded_params" in v.reason
    assert verdict(gloo, doc, marks=False).status == "vacuous"
    assert parse_gate(gloo.gates[0].text).key == "expert_gtp_sharded_params"


def test_expert_fc1_mismatches_name_the_swiglu_patch(mini):
    """A checkpoint in which only grouped experts' fc1 (TEGroupedMLP's weight<i>) or dense fc1 differ
    is the series' SwiGLU bug; any other tensor differing is not."""
    assert mini.ckpt._FC1.search("decoder.layers.0.mlp.experts.linear_fc1.weight3: max |diff| 0.1")
    assert mini.ckpt._FC1.search("decoder.layers.1.mlp.linear_fc1.weight: max |diff| 0.1")
    assert not mini.ckpt._FC1.search("decoder.layers.0.mlp.experts.linear_fc2.weight0: max |diff| 0.1")
    assert not mini.ckpt._FC1.search("decoder.layers.0.mlp.router.weight: max |diff| 0.1")
