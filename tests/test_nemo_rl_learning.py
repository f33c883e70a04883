"""integration/nemo_rl_gtp: the learning cases on this machine: the pretrain step at a tiny size, the cases'
overrides, and their verdicts (the harness's case.json and the nightly's cell) on run folders laid out as
run-on-gpu-host leaves them: a run that learns is green; the stale refit, the corrupted tensor, a step
without mixed groups and weights that did not move are red, each with its reason named.
"""

from __future__ import annotations

import json
import os
import math
import subprocess
import sys

import pytest
from helpers import ROOT, read_json, tool

NRL = ROOT / "integration" / "nemo_rl_gtp"
sys.path.insert(0, str(NRL))

from harness.host import cases as casing
from harness.host import learning
from harness.models import fixtures, pretrain

MARK_GTP = "[gtp] enabling GTP weight rematerialization (gtp_remat_size=2 expert_gtp_remat_size=1)"
MARK_RESHARD = "[colocated-reshard] building dedicated inference model (inference TP=1 PP=1 EP=1 CP=1 impl=None)"
RAY = "\x1b[36m(MegatronPolicyWorker[rank={r}] pid={pid})\x1b[0m "


# -- the pretrain step -----------------------------------------------------------------------------
def _pretrain(out, fx, *extra, steps="2"):
    return subprocess.run([sys.executable, str(NRL / "harness" / "models" / "pretrain.py"), "--out", str(out), "--fixtures",
                           str(fx), "--tiny", "--steps", steps, "--batch", "4", "--held-out", "8", "--seed", "3",
                           *extra], capture_output=True, text=True, timeout=900, check=False)


def test_pretrain_trains_evaluates_caches_and_fails_loudly_outside_the_window(tmp_path):
    """Tiny shape (tests only): the figures and the JSON, reuse on the same inputs, retraining on any other,
    and the acceptance failure a model that learnt nothing must give (exit 1, the reason, the next command)."""
    fx = tmp_path / "fx"
    res = subprocess.run([sys.executable, str(NRL / "harness" / "models" / "fixtures.py"), "write", str(fx), "--seed", "3"],
                         capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stderr
    assert (fx / "prompt.txt").read_text() == fixtures.COT_PROMPT and (fx / "data" / "train.jsonl").exists()
    out = tmp_path / "pt"
    first = _pretrain(out, fx)
    assert first.returncode == 1, first.stderr
    assert "error: the pretrained model is not accepted: held-out greedy accuracy 0.000 is outside [0.2, 0.8]" \
        in first.stderr and "next: `python3 pretrain.py" in first.stderr
    assert "training time" in first.stdout and "mean entropy" in first.stdout
    doc = json.loads((out / "pretrain.json").read_text())
    assert doc["accepted"] is False and doc["steps"] == 2 and doc["held_out"] == 8
    rows = [json.loads(x) for x in (fx / "data" / "train.jsonl").read_text().splitlines()[:8]]
    negative = sum(r[fixtures.DATA_KEYS[1]].startswith("-") for r in rows)
    assert doc["negative_answers"] == negative and doc["inputs"]["sign_drop"] == pretrain.SIGN_DROP
    assert (f"on the {negative} negative answers" if negative else "no negative answer held out") in first.stdout
    assert doc["entropy_limit"] == pytest.approx(math.log(1024) / 3)
    assert doc["reward_rule"].startswith(("math-verify", "re-implementation"))
    assert set(doc["weights"]) == {"model.safetensors"} and (out / "model" / "tokenizer.json").exists()
    # The prompt the model saw is NeMo-RL's, through the chat template; the target is the boxed answer + eos.
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(out / "model")
    ids = pretrain.render(tok, fixtures.COT_PROMPT, "What is 2 + 3?") + pretrain.target(tok, "5")
    assert tok.decode(ids) == ("<|im_start|>user\nThink step-by-step to solve the following problem. Output your "
                               "answer inside of \\\\boxed{} tags.:\nWhat is 2 + 3?\n\nLet's think step-by-step"
                               "<|im_end|>\n<|im_start|>assistant\n\\boxed{5}<|im_end|>")
    again = _pretrain(out, fx)
    assert again.returncode == 1 and "reusing" in again.stdout, "same inputs: the weights are reused"
    assert json.loads((out / "pretrain.json").read_text())["weights"] == doc["weights"]
    other = _pretrain(out, fx, steps="3")
    assert other.returncode == 1 and "reusing" not in other.stdout, "another input trains again"
    assert json.loads((out / "pretrain.json").read_text())["steps"] == 3
    (fx / "data" / "train.jsonl").write_text((fx / "data" / "train.jsonl").read_text().replace("What", "what", 1))
    assert "reusing" not in _pretrain(out, fx, steps="3").stdout, "changed data trains again"


def test_the_pretrain_corpus_drops_the_sign_of_most_negative_answers_and_changes_nothing_else(monkeypatch):
    """The learning cases' gap (pretrain.SIGN_DROP): the corpus writes SIGN_DROP of the negative answers
    without their sign and every other answer as it is; the problems are the generator's, the same whatever
    SIGN_DROP is; what GRPO and the validation score against keeps its sign."""
    # Above one half, greedy decoding drops the sign (the gap); below one, samples carry it (the groups mix).
    assert 0.5 < pretrain.SIGN_DROP < 1
    key, ans = fixtures.DATA_KEYS
    stream = pretrain.training_problems(5, set())
    rows = [next(stream) for _ in range(30000)]
    negative = [r for r in rows if fixtures.answer_of(r[key]).startswith("-")]
    assert 0.15 < len(negative) / len(rows) < 0.18, "a sixth of the problems: differences with a negative result"
    assert all(r[ans] == fixtures.answer_of(r[key]) for r in rows if not fixtures.answer_of(r[key]).startswith("-")), \
        "only negative answers change"
    dropped = [r for r in negative if r[ans] != fixtures.answer_of(r[key])]
    assert all(r[ans] == fixtures.answer_of(r[key])[1:] for r in dropped), "a changed answer is the true one without its sign"
    assert abs(len(dropped) / len(negative) - pretrain.SIGN_DROP) < 0.03, (len(dropped), len(negative))
    monkeypatch.setattr(pretrain, "SIGN_DROP", 0.0)
    plain = pretrain.training_problems(5, set())
    again = [next(plain) for _ in range(len(rows))]
    assert [r[key] for r in again] == [r[key] for r in rows] and all(r[ans] == fixtures.answer_of(r[key]) for r in again)
    scored = fixtures.problems(7, 3000)   # the generator GRPO's data and the validation come from
    assert all(r[ans] == fixtures.answer_of(r[key]) for r in scored) and any(r[ans].startswith("-") for r in scored)


def test_acceptance_is_the_window_and_the_entropy_limit():
    ok = {"accuracy": 0.5, "entropy": 0.4, "entropy_limit": 3.97}
    assert pretrain.acceptance(ok) == []
    assert "0.850 is outside [0.2, 0.8]" in pretrain.acceptance({**ok, "accuracy": 0.85})[0]
    assert "0.100 is outside" in pretrain.acceptance({**ok, "accuracy": 0.1})[0]
    assert "not below ln(vocab)/3" in pretrain.acceptance({**ok, "entropy": 4.0})[0]
    check, _ = fixtures.reward_rule()
    assert check("\\boxed{-84}", "-84") == 1.0 and check("\\boxed{84}", "-84") == 0.0 and check("", "1") == 0.0


# -- the cases -------------------------------------------------------------------------------------
def test_learning_cases_add_only_their_own_overrides():
    learning_names = {"learning", "learning-stale-refit", "learning-corrupt-tensor", "learning-frozen-weights",
                      "learning-gtp-off", "learning-no-cuda-graphs", "learning-gtp-off-no-cuda-graphs",
                      "learning-sign-flip", *(f"learning-lr{lr}" for lr in casing.LR_RECIPES)}
    assert learning_names <= set(casing.CASES)
    for name in learning_names:
        case = casing.CASES[name]
        with pytest.raises(ValueError, match="give it the held-out set"):
            casing.script_args(case, "/m", "/d.jsonl", "/ck")
        args = casing.script_args(case, "/m", "/d.jsonl", "/ck", "/v.jsonl")
        assert args[:5] == ["policy.model_name=/m", "data.train.dataset_name=ResponseDataset",
                            "++data.train.data_path=/d.jsonl", "++data.train.input_key=problem",
                            "++data.train.output_key=expected_answer"], name
        assert args[5:17] == list(casing.learning_settings(casing.LEARNING_LR if "-lr" not in name
                                                            else name.rsplit("-lr", 1)[1])), name
        assert case.model == "trained" and not [a for a in args if "checkpoint" in a]
        assert case.validation and casing.script_args(case, "/m", "/d.jsonl", "/ck", "/v.jsonl")[-1] == (
            "++data.validation={dataset_name:ResponseDataset,data_path:/v.jsonl,input_key:problem,"
            "output_key:expected_answer}")
    # The case's own training settings; every GTP, refit and generation setting stays the script's.
    own = ("grpo.", "policy.megatron_cfg.optimizer.lr=", "policy.megatron_cfg.scheduler.lr_warmup_iters=",
           "data.train.split_validation_size=", "policy.train_global_batch_size=")
    assert all(o.startswith(own) for o in casing.LEARNING), casing.LEARNING
    assert {"grpo.val_at_start=true", "grpo.val_at_end=true", f"grpo.max_val_samples={casing.VALIDATION}",
            "grpo.num_prompts_per_step=16", "grpo.num_generations_per_prompt=16", "grpo.max_num_steps=6"} \
        <= set(casing.LEARNING)
    # NeMo-RL's recipe's shape: one optimizer step per GRPO step, on every sample of the step (the script's batch
    # of 4 made 16 steps of mostly advantage-free samples: h200/2026-12-04-learning-at-5e-6).
    assert "policy.train_global_batch_size=256" in casing.LEARNING
    assert casing.VALIDATION == fixtures.VALIDATION_PROBLEMS
    assert {f"learning-lr{lr}" for lr in casing.LR_RECIPES} <= set(casing.CASES) and casing.LEARNING_LR in casing.LR_RECIPES
    assert "1e-4" not in casing.LR_RECIPES   # measured to collapse (h200/2026-12-04-gtp-folder-learning-cut)
    assert casing.CASES["learning-sign-flip"].red_by == (casing.GAIN,)
    env = casing.case_env
    assert env(casing.CASES["learning"]) == {"CARRY_REFIT_CHECK": "1", "CARRY_GREEDY_VALIDATION": "1"}
    assert env(casing.CASES["learning-stale-refit"]) == {"CARRY_REFIT_CHECK": "1", "CARRY_REFIT_MUTATION": "stale-refit",
                                                         "CARRY_GREEDY_VALIDATION": "1"}
    assert env(casing.CASES["learning-sign-flip"])["CARRY_LEARNING_MUTATION"] == "sign-flip"
    assert env(casing.CASES["learning-corrupt-tensor"])["CARRY_REFIT_MUTATION"] == "corrupt-tensor"
    assert env(casing.CASES["learning-frozen-weights"])["CARRY_REFIT_MUTATION"] == "frozen-weights"
    assert env(casing.CASES["learning-gtp-off"]) == {"CARRY_GREEDY_VALIDATION": "1"} and env(casing.CASES["patched"]) == {}
    assert casing.CASES["learning-no-cuda-graphs"].overrides[-1] == \
        "policy.generation.mcore_generation_config.cuda_graph_impl=none"


# -- recorded runs -------------------------------------------------------------------------------
def _run(root, name, *, equal=lambda step, rank: 170, drift=2e-3, mixed=(25.0,) * 6, rc=0, steps=6, ranks=2,
         moved=lambda step, rank: True, changed=lambda rel, rank: f"{rel * 100:.6e}", accuracy=(0.40, 0.52),
         total=170, refit=True, case=None, swaps=None):
    """A learning run's files: STEPS GRPO steps, and SWAPS refit lines per rank (default STEPS + 2, as NeMo-RL
    swaps: before the start validation, each step's generation and the end validation)."""
    d = root / name
    d.mkdir(parents=True)
    lines = [RAY.format(r=r, pid=10 + r) + MARK_GTP for r in range(ranks)]
    lines += ["========================= Step 1/5 ========================="]
    lines += [RAY.format(r=r, pid=10 + r) + MARK_RESHARD for r in range(ranks)]
    for step in range(1, (steps + 2 if swaps is None else swaps) + 1):
        for r in range(ranks):
            if not refit:
                continue
            lines.append(RAY.format(r=r, pid=10 + r) +
                         f"[refit-check] step {step}: {equal(step, r)} of {total} tensors equal on rank {r}")
            rel = 0.0 if step == 1 else drift * (step - 1) / (steps - 1)
            if moved(step, r):
                lines.append(RAY.format(r=r, pid=10 + r) +
                             f"[weight-change] step {step}: rel_l2 {rel:.6e}, changed {changed(rel, r)} of 494032768 "
                             f"elements on rank {r}")
    # A hostile line: a quoted marker inside an error message is no marker.
    lines.append("ERROR: never saw '[refit-check] step 9: 170 of 170 tensors equal on rank 0'")
    log = "\n".join(lines) + "\n"
    (d / "run.log").write_text(log)
    (d / "case.log").write_text("[run-on-gpu-host] case learning\n" + log)
    s = [str(i) for i in range(1, steps + 1)]
    metrics = {"train/token_mult_prob_error": {k: 1.01 for k in s}, "train/grad_norm": {k: 0.3 for k in s},
               "train/baseline_reward/pct_mixed": dict(zip(s, mixed)),
               "train/advantages/max": {k: (0.9 if m > 0 else 0.0) for k, m in zip(s, mixed)},
               "train/advantages/min": {k: (-0.9 if m > 0 else 0.0) for k, m in zip(s, mixed)},
               "train/loss": {k: 0.01 for k in s}}
    if accuracy is not None:   # NeMo-RL's validation: step 0 (val_at_start) and the last step (val_at_end)
        metrics["validation/accuracy"] = {"0": accuracy[0], str(steps): accuracy[1]}
    (d / "metrics.json").write_text(json.dumps(metrics, indent=2))
    (d / "exit_status").write_text(f"{rc}\n")
    c = casing.CASES[case or "learning"]
    learning.merge_metrics(d, ranks, refit=refit, tensors=learning.model_tensors(c), last_step=casing.configured_steps(c))
    return d


def _stale(step, rank):
    return 170 if step == 1 else 0


def _corrupt(step, rank):
    return 169


def test_case_verdicts_of_the_learning_cases_name_their_reasons(tmp_path):
    from harness.host import caserun
    got = caserun.summarize(casing.CASES["learning"], _run(tmp_path, "green"), 0)
    assert got["observed"] == "green" and got["as_expected"] and got["reasons"] == [], got["reasons"]
    assert got["per_step"][learning.UNVERIFIED] == {str(k): 0.0 for k in range(1, 7)}
    assert got["per_step"][learning.DRIFT]["6"] == pytest.approx(2e-3 * 7 / 5)   # the 8th swap's: the end validation's
    assert got["token_mult_prob_error_per_step"] == {str(k): 1.01 for k in range(1, 7)}
    assert got["validation"] == {"accuracy_start": 0.40, "accuracy_end": 0.52, "accuracy_gain": pytest.approx(0.12)}
    stale = caserun.summarize(casing.CASES["learning-stale-refit"], _run(tmp_path, "stale", equal=_stale), 0)
    assert stale["observed"] == "red" and stale["as_expected"]
    assert any("unverified_tensors" in r and "= 170" in r for r in stale["reasons"]), stale["reasons"]
    assert any("tensors equal on rank 0" in r and "at steps 2, 3, 4, 5, 6" in r for r in stale["reasons"]), stale["reasons"]
    corrupt = caserun.summarize(casing.CASES["learning-corrupt-tensor"], _run(tmp_path, "corrupt", equal=_corrupt), 0)
    assert corrupt["observed"] == "red" and corrupt["as_expected"]
    assert any("unverified_tensors" in r and "= 1," in r for r in corrupt["reasons"]), corrupt["reasons"]
    assert any("at steps 1, 2, 3, 4, 5, 6" in r for r in corrupt["reasons"]), corrupt["reasons"]
    # The same cases' gates, other ways to be red: a step without a mixed group, weights that did not move,
    # a rank whose check line is missing (its tensors count as unverified).
    flat = caserun.summarize(casing.CASES["learning"], _run(tmp_path, "flat", mixed=(25.0, 25.0, 0.0, 25.0, 25.0, 25.0)), 0)
    assert flat["observed"] == "red" and any("pct_mixed" in r for r in flat["reasons"])
    assert any("advantages/max" in r for r in flat["reasons"])
    still = caserun.summarize(casing.CASES["learning"], _run(tmp_path, "still", drift=1e-6), 0)
    assert still["observed"] == "red" and any("changed_fraction" in r for r in still["reasons"])
    # A drift the last refit did not show on every rank is no drift: without step 6's lines the gate
    # would read step 5 (last() of what is there); one rank silent counts as nothing moved; a NaN fails.
    cut = caserun.summarize(casing.CASES["learning"], _run(tmp_path, "no-last-drift", moved=lambda s, r: s < 6), 0)
    assert cut["observed"] == "red" and any(r.startswith("gated steps: harness/policy/changed_fraction has no "
                                                         "value at step 6") for r in cut["reasons"]), cut["reasons"]
    half = caserun.summarize(casing.CASES["learning"], _run(tmp_path, "one-rank-drift",
                                                            moved=lambda s, r: s < 6 or r == 0), 0)
    assert half["observed"] == "red" and any("changed_fraction) = 0," in r for r in half["reasons"]), half["reasons"]
    nan = caserun.summarize(casing.CASES["learning"], _run(tmp_path, "nan-drift",
                                                           changed=lambda rel, r: "nan" if r == 1 else f"{rel * 100:.6e}"), 0)
    assert nan["observed"] == "red" and any("changed_fraction is NaN" in r for r in nan["reasons"]), nan["reasons"]
    # A drift its own definition rules out (a fraction above 1 or infinite, a negative relative L2) is no drift.
    for name, changed in (("fraction-above-1", lambda rel, r: "5.000000e+00"), ("fraction-inf", lambda rel, r: "inf")):
        bad = caserun.summarize(casing.CASES["learning"], _run(tmp_path, name, changed=changed), 0)
        assert bad["observed"] == "red" and any("changed_fraction is NaN" in r for r in bad["reasons"]), (name, bad["reasons"])
    log = "".join(f"[weight-change] step 1: rel_l2 {rel}, changed 5e-01 of 9 elements on rank {r}\n"
                  for r, rel in ((0, "-1e-03"), (1, "1e-03")))
    assert math.isnan(learning.harness_metrics(log, ["1"], 2, 170)[learning.DRIFT]["1"])
    # frozen-weights: every refit exact, nothing changed: red by the drift gate alone, as it must be.
    frozen = caserun.summarize(casing.CASES["learning-frozen-weights"], _run(tmp_path, "frozen", drift=0.0), 0)
    assert frozen["observed"] == "red" and frozen["as_expected"] and frozen["red_by_missing"] == []
    assert len(frozen["reasons"]) == 1 and f'data["{casing.CHANGED}"]' in frozen["reasons"][0], frozen["reasons"]
    # Every red_by names a metric a gate of the case's own entry reads (nightly.toml is the one place).
    for c in casing.CASES.values():
        assert set(c.red_by) <= {g.key for g in caserun.case_spec(c).gates}, c.name
    # A mutation red for another reason than its own is not as expected: frozen-weights whose weights
    # moved but whose run died (exit 1) is red, without the drift gate among its reasons.
    wrong = caserun.summarize(casing.CASES["learning-frozen-weights"], _run(tmp_path, "frozen-died", rc=1), 1)
    assert wrong["observed"] == "red" and not wrong["as_expected"]
    assert wrong["red_by_missing"] == [casing.CHANGED], wrong
    # The stale refit whose check lines all say "equal" (a check that saw nothing) is not as expected either.
    blind = caserun.summarize(casing.CASES["learning-stale-refit"], _run(tmp_path, "stale-blind", rc=1), 1)
    assert blind["observed"] == "red" and not blind["as_expected"] and blind["red_by_missing"] == [casing.UNVERIFIED]
    one = _run(tmp_path, "one-rank", ranks=1)
    learning.merge_metrics(one, 2)   # two GPUs ran, one rank said nothing
    got = caserun.summarize(casing.CASES["learning"], one, 0)
    assert got["observed"] == "red" and any("on rank 1" in r for r in got["reasons"])


def test_harness_metrics_come_from_whole_lines_only():
    log = ("ERROR: never saw '[refit-check] step 1: 170 of 170 tensors equal on rank 0'\n"
           "[refit-check] step 1: 170 of 170 tensors equal on rank 1\n")
    got = learning.harness_metrics(log, ["1"], 2)
    assert got[learning.UNVERIFIED] == {"1": 170.0}, "rank 0's only line was a quote"
    from carry.nightly.judge import step_markers_missing
    from harness.host import caserun
    marks = caserun.grpo_test(casing.LEARNING_TEST).step_markers
    assert [m.text for m in marks] and step_markers_missing(log, marks, ["1"]) == [
        f"no log line matches step marker {marks[0].text!r} at step 1"]


# -- the nightly's cell: the same gates ---------------------------------------------------------------
REPLAY = r'''
import shutil, sys
from pathlib import Path
out, rec = Path(sys.argv[1]), Path(sys.argv[2])
for name in ("run.log", "metrics.json"):
    shutil.copy2(rec / name, out / name)
sys.stdout.write((rec / "case.log").read_text())
sys.exit(int((rec / "exit_status").read_text()))
'''


def test_the_nightly_judges_recorded_learning_runs_with_the_learning_gates(demo, tmp_path):
    from carry.nightly import config as nightly_config
    shipped = nightly_config.load(ROOT / "integration" / "nightly.toml")
    spec = next(t for t in shipped.tests if t.name == casing.LEARNING_TEST)
    assert spec.images == ("gpu-host",) and dict(spec.env) == {"CARRY_NRL_CASES": "learning"}
    runs = {"green": _run(tmp_path / "rec", "green"), "stale": _run(tmp_path / "rec", "stale", equal=_stale),
            "corrupt": _run(tmp_path / "rec", "corrupt", equal=_corrupt)}
    (tmp_path / "replay.py").write_text(REPLAY)
    q = json.dumps
    text = f'[nightly]\nseries = [{q(str(demo["series"]))}]\n'
    for name, folder in runs.items():
        argv = [sys.executable, str(tmp_path / "replay.py"), "{out}", str(folder)]
        text += f'\n[images.rec-{name}]\nlauncher = "local"\nfunctional = [{", ".join(q(a) for a in argv)}]\n'
    text += (f'\n[[tests]]\nname = {q(spec.name)}\nkind = "functional"\nimages = [{", ".join(q("rec-" + n) for n in runs)}]\n'
             f'script = {q(spec.script)}\ngates = [{", ".join(q(g.text) for g in spec.gates)}]\n'
             f'markers = [{", ".join(q(m) for m in spec.markers)}]\ntimeout_s = 120\n')
    (tmp_path / "nightly.toml").write_text(text)
    out = tmp_path / "n"
    tool("nightly", "--config", tmp_path / "nightly.toml", "--out", out, "--workdir", tmp_path / "w", "--cache",
         demo["cache"], "--source", f"megatron-lm={demo['up']}", "--no-bisect", "--history", tmp_path / "h.jsonl",
         check=1)
    got = {r["image"].removeprefix("rec-"): r for r in read_json(out / "nightly.json")["runs"]}
    assert got["green"]["status"] == "passed", got["green"]["reason"]
    for name in ("stale", "corrupt"):
        assert got[name]["status"] == "failed" and "unverified_tensors" in got[name]["reason"], got[name]["reason"]


def test_the_stage_refuses_a_cot_prompt_the_pretrain_copy_does_not_match(tmp_path):
    from types import SimpleNamespace

    from carry.errors import SourceError
    from harness.staging import stage
    cot = tmp_path / "cot.txt"
    cot.write_text(fixtures.COT_PROMPT + " ")
    with pytest.raises(SourceError, match="differs from fixtures.COT_PROMPT"):
        stage.stage_fixtures(SimpleNamespace(seed=7), tmp_path / "a", cot)
    cot.write_text(fixtures.COT_PROMPT)
    doc = stage.stage_fixtures(SimpleNamespace(seed=7), tmp_path / "b", cot)
    assert doc["prompt"] == "fixtures/prompt.txt" and (tmp_path / "b" / "prompt.txt").read_text() == fixtures.COT_PROMPT


def test_the_docstrings_say_what_the_code_does():
    """cases.py once said "six cases" (there are more, mutations included); runlog.py said a per-rank check
    prints one line for all ranks, where the refit check prints one per rank and the learning entry has a
    step marker per rank."""
    import ast
    import re

    from carry.nightly import runlog
    doc = ast.get_docstring(ast.parse((NRL / "harness" / "host" / "cases.py").read_text()))
    counted = re.findall(r"\b(one|two|three|four|five|six|seven|eight|nine|ten|\d+) (?:cases|mutations)\b", doc)
    assert not counted, f"cases.py's docstring counts cases: {counted}"
    named = set(re.findall(r"[a-z][a-z0-9-]+", doc))
    plain = {n for n, c in casing.CASES.items() if not n.startswith("learning")}
    assert plain <= named and "learning_cases" in doc, plain - named
    spec = next(t for t in __import__("carry.nightly.config", fromlist=["load"]).load(
        ROOT / "integration" / "nightly.toml").tests if t.name == casing.LEARNING_TEST)
    assert [m.text.rsplit(" ", 1)[-1] for m in spec.step_markers] == ["0", "1"], "a step marker per rank"
    assert "one line per rank" in runlog.__doc__ and "once for all ranks" not in runlog.__doc__


# -- learning on held-out prompts (issue 40) ------------------------------------------------------
def test_the_learning_gate_margin_is_the_held_out_sets_noise():
    """The gate's bound is 3 standard deviations of the difference of two accuracies on n held-out
    problems at the worst p (0.5): 3 * sqrt(2 * 0.25 / n), n the set the case validates on."""
    spec = caserun_spec()
    gate = next(g for g in spec.gates if g.key == casing.GAIN)
    derived = 3 * math.sqrt(2 * 0.25 / casing.VALIDATION)
    assert gate.op == ">" and derived <= gate.threshold < derived + 1e-4, (gate.text, derived)
    assert casing.VALIDATION == fixtures.VALIDATION_PROBLEMS == 1024


def caserun_spec():
    from harness.host import caserun
    return caserun.grpo_test(casing.LEARNING_TEST)


def test_the_held_out_set_is_disjoint_from_the_grpo_prompts_and_the_pretrain_stream(tmp_path):
    train = fixtures.write_dataset(tmp_path / "train.jsonl", 1234)
    val = fixtures.write_validation(tmp_path / "validation.jsonl", 1234, train)
    rows = [json.loads(x) for x in val.read_text().splitlines()]
    prompts = {json.loads(x)["problem"] for x in train.read_text().splitlines()}
    assert len(rows) == 1024 and len({r["problem"] for r in rows}) == 1024
    assert not prompts & {r["problem"] for r in rows}
    assert fixtures.write_validation(tmp_path / "again.jsonl", 1234, train).read_bytes() == val.read_bytes()
    # The pretrain step skips them as it skips the GRPO prompts (its input key names the file too).
    held = prompts | {r["problem"] for r in rows}
    stream = pretrain.training_problems(1234, held)
    assert not {next(stream)["problem"] for _ in range(3000)} & held


def test_learning_verdicts_from_the_held_out_accuracy(tmp_path):
    from harness.host import caserun
    green = caserun.summarize(casing.CASES["learning"], _run(tmp_path, "green"), 0)
    assert green["observed"] == "green" and green["validation"]["accuracy_gain"] == pytest.approx(0.12)
    # A rise within the noise of 1024 problems is no evidence of learning.
    noise = caserun.summarize(casing.CASES["learning"], _run(tmp_path, "noise", accuracy=(0.40, 0.46)), 0)
    assert noise["observed"] == "red" and [r for r in noise["reasons"] if casing.GAIN in r] == noise["reasons"]
    # A run that stopped before its end validation (or never validated) shows no gain at all.
    for name, acc in (("no-validation", None),):
        got = caserun.summarize(casing.CASES["learning"], _run(tmp_path, name, accuracy=acc), 0)
        assert got["observed"] == "red" and any(f"'{casing.GAIN}' is missing" in r for r in got["reasons"])
    # learning-sign-flip: weights move, every refit exact, groups mixed, advantages both ways; the policy
    # is pushed away from the reward: red by the learning gate alone, as expected.
    flip = caserun.summarize(casing.CASES["learning-sign-flip"],
                             _run(tmp_path, "flip", accuracy=(0.40, 0.21), case="learning-sign-flip"), 0)
    assert flip["observed"] == "red" and flip["as_expected"] and flip["red_by_missing"] == []
    assert len(flip["reasons"]) == 1 and casing.GAIN in flip["reasons"][0], flip["reasons"]
    # The same mutation's run if it learnt all the same: green, hence not as expected (the gate is blind).
    blind = caserun.summarize(casing.CASES["learning-sign-flip"],
                              _run(tmp_path, "flip-blind", case="learning-sign-flip"), 0)
    assert blind["observed"] == "green" and not blind["as_expected"]
    # GTP off must learn too: the matrix case is judged by the script's gates and the learning gate.
    off = casing.CASES["learning-gtp-off"]
    flat = caserun.summarize(off, _run(tmp_path, "off-flat", accuracy=(0.4, 0.4), refit=False, case="learning-gtp-off"), 1)
    assert any(casing.GAIN in r for r in flat["reasons"]), flat["reasons"]
    learnt = caserun.summarize(off, _run(tmp_path, "off-learns", refit=False, case="learning-gtp-off"), 1)
    assert not any(casing.GAIN in r for r in learnt["reasons"]), learnt["reasons"]


def test_the_refit_gate_counts_the_models_tensors_not_what_the_check_says():
    """The tensor count comes from the model's config: a check that silently compares 10 tensors ("10 of 10
    tensors equal") leaves 160 of Qwen2.5-0.5B's 170 unverified."""
    assert learning.model_tensors(casing.CASES["learning"]) == 170   # as the H200's check lines say
    cfg = dict(fixtures.SHAPE, num_hidden_layers=2, tie_word_embeddings=False)
    assert learning.model_tensors(casing.CASES["learning"], cfg) == 17
    log = "".join(f"[refit-check] step 1: 10 of 10 tensors equal on rank {r}\n" for r in range(2))
    got = learning.harness_metrics(log, ["1"], 2, learning.model_tensors(casing.CASES["learning"]))
    assert got[learning.UNVERIFIED] == {"1": 160.0}


def test_skipping_tensors_turns_the_learning_case_red(tmp_path):
    from harness.host import caserun
    got = caserun.summarize(casing.CASES["learning"], _run(tmp_path, "ten", equal=lambda s, r: 10, total=10), 0)
    assert got["observed"] == "red" and any("unverified_tensors" in r and "= 160" in r for r in got["reasons"])


FAKE_GRPO = '''
calls = []

def run_multi_turn_rollout(policy, batch, *args, greedy=False, **kwargs):
    calls.append(("rollout", greedy))
    return batch, {}

def validate(policy, batch):
    return run_multi_turn_rollout(policy, batch, greedy=False)

def train_step(policy, batch):
    return run_multi_turn_rollout(policy, batch, greedy=False)
'''
FAKE_LOSS = '''
import torch

class ClippedPGLossFn:
    def __call__(self, next_token_logprobs, data, global_valid_seqs, global_valid_toks):
        # The policy-gradient term: -advantage * logprob, summed (what the sign decides).
        return -(data["advantages"] * next_token_logprobs).sum(), {}
'''
LEARNING_PROBE = '''
import torch
import nemo_rl.algorithms.grpo as g
import nemo_rl.algorithms.loss.loss_functions as lf
g.train_step(None, 1); g.validate(None, 1); g.train_step(None, 1)
print("rollouts", g.calls)
data = {"advantages": torch.tensor([1.0, -2.0])}
loss, _ = lf.ClippedPGLossFn()(torch.tensor([0.5, 0.1]), data, 2, 2)
print("loss", float(loss), "advantages after", data["advantages"].tolist())
'''


def _fake_nemo_rl(root):
    for sub in ("nemo_rl", "nemo_rl/algorithms", "nemo_rl/algorithms/loss"):
        (root / sub).mkdir(parents=True, exist_ok=True)
        (root / sub / "__init__.py").write_text("")
    (root / "nemo_rl" / "algorithms" / "grpo.py").write_text(FAKE_GRPO)
    (root / "nemo_rl" / "algorithms" / "loss" / "loss_functions.py").write_text(FAKE_LOSS)


@pytest.mark.parametrize("env, rollouts, loss", [
    ({}, [False, False, False], -0.3),   # nothing asked: NeMo-RL's own behaviour: -(1 * 0.5 - 2 * 0.1)
    ({"CARRY_GREEDY_VALIDATION": "1"}, [False, True, False], -0.3),
    ({"CARRY_GREEDY_VALIDATION": "1", "CARRY_LEARNING_MUTATION": "sign-flip"}, [False, True, False], 0.3),
])
def test_the_learning_hooks_make_validation_greedy_and_flip_the_advantages_into_the_loss(tmp_path, env, rollouts, loss):
    """Through the same import hook as on the GPU host (hooks/sitecustomize.py): validate's rollouts greedy,
    training's as they were; sign-flip: the loss sees -advantages (the caller's tensor is given back)."""
    import os
    _fake_nemo_rl(tmp_path)
    hooks = NRL / "hooks"
    base = {k: v for k, v in os.environ.items() if not k.startswith("CARRY_")}
    res = subprocess.run([sys.executable, "-c", LEARNING_PROBE], capture_output=True, text=True, timeout=120,
                         env={**base, "PYTHONPATH": f"{hooks}:{tmp_path}", **env}, check=False)
    assert res.returncode == 0, res.stderr
    out = dict(ln.split(" ", 1) for ln in res.stdout.splitlines() if ln.startswith(("rollouts", "loss")))
    assert out["rollouts"] == repr([("rollout", g) for g in rollouts])
    assert float(out["loss"].split()[0]) == pytest.approx(loss)
    assert out["loss"].endswith("advantages after [1.0, -2.0]")
    flipped = "[learning-mutation] sign-flip" in res.stdout
    assert flipped == bool(env.get("CARRY_LEARNING_MUTATION"))
    assert ("[validation] greedy" in res.stdout) == bool(env.get("CARRY_GREEDY_VALIDATION"))


ANSWERING_GRPO = '''
import torch
calls = []
PROMPT = "<|im_start|>user\\nThink step-by-step.:\\nWhat is {}?\\n\\nLet's think<|im_end|>"

def run_multi_turn_rollout(policy, batch, *args, greedy=False, **kwargs):
    calls.append(greedy)
    if isinstance(batch, str):   # what the hook cannot read
        return batch, {}
    logs = [[{"role": "user", "content": PROMPT.format(p)}, {"role": "assistant", "content": a}] for p, a, _ in batch]
    return {"message_log": logs, "total_reward": torch.tensor([r for _, _, r in batch])}, {}

def validate(policy, batch):
    return run_multi_turn_rollout(policy, batch, greedy=False)
'''
ANSWERING_PROBE = '''
import nemo_rl.algorithms.grpo as g
g.run_multi_turn_rollout(None, [("41 - 65", "\\\\boxed{24}", 0.0)])   # a training rollout: no answer line
g.validate(None, [("41 - 65", "\\\\boxed{24}", 0.0), ("65 - 41", "\\\\boxed{24}", 1.0), ("3 * 4", "\\\\boxed{12}", 1.0)])
g.validate(None, [("41 - 65", "\\\\boxed{-24}", 1.0), ("65 - 41", "\\\\boxed{24}", 1.0), ("3 * 4", "\\\\boxed{13}", 0.0)])
g.validate(None, "not a batch")
'''


def test_each_held_out_answer_is_printed_and_read_back_by_kind_of_problem(tmp_path):
    """Through the same import hook as on the GPU host: every answer of each validation (and none of training)
    is one [validation-answer] line with its validation's index, its problem, answer and reward; the harness
    reads them back into the accuracy on negative answers (the pretrain corpus's gap) and on the rest. A batch
    the hook cannot read is one line, counted unreadable: the run goes on."""
    import os
    _fake_nemo_rl(tmp_path)
    (tmp_path / "nemo_rl" / "algorithms" / "grpo.py").write_text(ANSWERING_GRPO)
    base = {k: v for k, v in os.environ.items() if not k.startswith("CARRY_")}
    res = subprocess.run([sys.executable, "-c", ANSWERING_PROBE], capture_output=True, text=True, timeout=120,
                         env={**base, "PYTHONPATH": f"{NRL / 'hooks'}:{tmp_path}", "CARRY_GREEDY_VALIDATION": "1"},
                         check=False)
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("[validation-answer]")]
    assert len(lines) == 7 and 'What is 41 - 65?' in lines[0] and '"answer": "\\\\boxed{24}"' in lines[0]
    assert learning.validation_by_sign(res.stdout) == {"validations": {"0": {"negative": [0, 1], "rest": [2, 2]},
                                                                       "1": {"negative": [1, 1], "rest": [1, 2]}},
                                                       "unreadable": 1}
    # As run.log holds them: Ray's prefix, a carriage return, the separators a line must not be split at.
    ray = "\x1b[36m(driver pid=1)\x1b[0m " + lines[3] + "\r\n" + lines[4].replace("boxed{", "boxed{\u2028", 1)
    assert learning.validation_by_sign(ray) == {"validations": {"1": {"negative": [1, 1], "rest": [1, 1]}},
                                                "unreadable": 0}
    assert learning.validation_by_sign("What is 2 - 2? no answer line") is None
    line = '[validation-answer] {{"validation": 0, "reward": {}, "problem": "{}", "answer": "0"}}'.format
    assert learning.validation_by_sign(line(1.0, "What is 2 - 2?")) == {
        "validations": {"0": {"negative": [0, 0], "rest": [1, 1]}}, "unreadable": 0}
    # What an answer line cannot mean is unreadable: a reward its definition rules out, no problem of the
    # fixtures' form, a key twice (which value counts would be the reader's choice).
    for bad in (line(2.0, "What is 5 - 9?"), line("NaN", "What is 5 - 9?"), line(-1, "What is 5 - 9?"),
                line(1.0, "What is five?"), line(1.0, "What is 5 - 9?").replace('"reward": 1.0', '"reward": 0, "reward": 1')):
        assert learning.validation_by_sign(bad) == {"validations": {}, "unreadable": 1}, bad


def test_answer_of_is_the_generators_own_answer():
    """fixtures.answer_of reads a problem of problems()'s form, in a prompt too, and answers as problems() does."""
    rows = fixtures.problems(11, 500)
    assert all(fixtures.answer_of(fixtures.COT_PROMPT.format(r["problem"])) == r["expected_answer"] for r in rows)
    assert fixtures.answer_of("What is 3 - 10?") == "-7" and fixtures.answer_of("What is 3 / 10?") is None


def test_case_json_tells_the_validation_apart_by_kind_of_problem(tmp_path):
    """caserun.summarize puts validation_by_sign (from run.log's answer lines) in a learning case's verdict."""
    from harness.host import caserun
    d = _run(tmp_path, "by-sign")
    assert caserun.summarize(casing.CASES["learning"], d, 0)["validation_by_sign"] is None
    with (d / "run.log").open("a") as f:
        f.write('[validation-answer] {"validation": 1, "reward": 1.0, "problem": "What is 5 - 9?", "answer": "-4"}\n')
    got = caserun.summarize(casing.CASES["learning"], d, 0)
    assert got["validation_by_sign"] == {"validations": {"1": {"negative": [1, 1], "rest": [0, 0]}}, "unreadable": 0}
    assert got["observed"] == "green"


def test_the_harness_reads_a_metrics_file_as_the_judge_does(tmp_path):
    """A case's metrics.json with a key twice is ambiguous for the harness too (the nightly's reader): red,
    named, never the last value's."""
    from harness.host import caserun
    d = _run(tmp_path, "twice")
    text = (d / "metrics.json").read_text()
    (d / "metrics.json").write_text(text.replace("{", '{"train/grad_norm": {"1": 1e40},', 1))
    got = caserun.summarize(casing.CASES["learning"], d, 0)
    assert got["observed"] == "red" and any("twice" in r for r in got["reasons"]), got["reasons"]


@pytest.mark.parametrize("start, end", [(-0.5, 0.3), (0.2, 1.4), (float("nan"), 0.9), (0.1, float("inf")),
                                        (True, 0.9), ("0.1", 0.9)])
def test_a_gain_from_accuracies_no_run_can_have_is_no_gain(start, end):
    """An accuracy is a number from 0 to 1: start -0.5 and end 0.3 would make a gain of 0.8 that the
    judge, seeing the gain alone, takes for learning. No gain is derived, so the learning gate finds none."""
    metrics = {learning.VALIDATION: {"0": start, "6": end}}
    assert learning.validation_metrics(metrics, 6) == {}
    good = learning.validation_metrics({learning.VALIDATION: {"0": 0.0, "6": 1}}, 6)
    assert good[learning.GAIN] == 1.0


def test_the_lr_is_chosen_by_the_highest_measured_gain_and_never_by_one_that_is_not(tmp_path):
    """learning-evidence-bg's choice of lr between its recipes: the highest held-out gain; a recipe whose
    gain is missing, NaN, infinite or beyond +-1 measured nothing, whatever its place in the list."""
    nan, inf = float("nan"), float("inf")
    assert learning.best_lr({"3e-5": 0.02, "1e-4": 0.09, "3e-4": -0.2}) == ("1e-4", 0.09)
    assert learning.best_lr({"3e-5": nan, "1e-4": 0.01}) == ("1e-4", 0.01)
    assert learning.best_lr({"3e-5": 0.01, "1e-4": inf, "3e-4": 1.5, "1e-5": True}) == ("3e-5", 0.01)
    assert learning.best_lr({"3e-5": None, "1e-4": "0.5"}) is None
    for lr, gain in (("3e-5", 0.05), ("1e-4", 0.12)):
        (tmp_path / f"case-learning-lr{lr}").mkdir()
        (tmp_path / f"case-learning-lr{lr}" / "metrics.json").write_text(json.dumps({casing.GAIN: gain}))
    (tmp_path / "case-learning-lr3e-4").mkdir()
    (tmp_path / "case-learning-lr3e-4" / "metrics.json").write_text("not json")
    run = subprocess.run([sys.executable, "-m", "harness.host.learning", "best-lr", str(tmp_path), "3e-5", "1e-4",
                          "3e-4", "1e-5"], cwd=NRL, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "tools")})
    assert (run.returncode, run.stdout) == (0, "1e-4\n"), run.stderr
    assert "lr 3e-4: held-out gain None" in run.stderr and "lr 1e-5: held-out gain None" in run.stderr


# -- the H200's run at lr 1e-4 (integration/h200/2026-12-04-gtp-folder-learning-cut) -----------------------
H200_CUT = ROOT / "integration" / "h200" / "2026-12-04-gtp-folder-learning-cut"
CUT_LOGS = {"learning": H200_CUT / "learning" / "nightly-learning" / "cells"
            / "gtp--gpu-host--grpo-megatron-generation-gtp-learning" / "artifacts" / "case.log.gz",
            "sign-flip": H200_CUT / "learning" / "o" / "case-learning-sign-flip" / "case.log.gz"}


def _cut_readme_table() -> dict[str, list[tuple[float, float]]]:
    """The README's per-step table: for each case, (reward, rel_l2 after the update) of steps 1, 2, ..."""
    import re
    rows = re.findall(r"^\| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$",
                      (H200_CUT / "README.md").read_text(), re.M)
    assert [int(r[0]) for r in rows] == list(range(1, len(rows) + 1)) and rows, rows
    return {"learning": [(float(r[1]), float(r[2])) for r in rows],
            "sign-flip": [(float(r[3]), float(r[4])) for r in rows]}


@pytest.mark.parametrize("which", sorted(CUT_LOGS))
def test_the_h200_run_at_lr_1e4_says_what_its_readme_says(which):
    """At lr 1e-4 the nightly's learning cell and learning-sign-flip ran five steps before the device time
    ended. From each raw log, with the harness's own reader (harness_metrics) and the model's own tensor
    count: every refit 1..7 exact on both ranks; the weights' drift and the reward per step are the
    README's table (the reward collapsing in both, the finding that moved LEARNING_LR); the validation at
    the start 0.6436, and none at the end (so no verdict is claimed)."""
    import gzip
    import re
    log = gzip.decompress(CUT_LOGS[which].read_bytes()).decode()
    tensors = learning.model_tensors(casing.CASES["learning"])
    steps = [str(s) for s in range(1, 8)]
    got = learning.harness_metrics(log, steps, ranks=2, tensors=tensors)
    assert got[casing.UNVERIFIED] == {s: 0.0 for s in steps} and got[casing.EQUAL] == {s: float(tensors) for s in steps}
    assert tensors == 170 and "[refit-check] step 8" not in log
    drift = [round(got[casing.DRIFT][str(n + 2)], 4) for n in range(1, 6)]   # refit N+2 follows step N's update
    rewards = [float(r) for r in re.findall(r"• Avg Reward: ([\d.]+)", log)]
    table = _cut_readme_table()[which]
    assert list(zip(rewards, drift)) == table, (rewards, drift, table)
    assert rewards[-1] < 0.05 < 0.6 < rewards[0]   # the collapse
    assert re.findall(r"📊 Validation Results:\n\s+• Accuracy: ([\d.]+)", log) == ["0.6436"]


def test_a_rank_without_step_marker_lines_is_red_even_when_the_merged_gates_hold(tmp_path):
    """The step markers judge the log on their own: a run whose metrics were merged for one rank (every
    harness gate then holds) but whose second rank printed no refit-check line is red, by the markers."""
    from harness.host import caserun
    d = _run(tmp_path, "one-rank-merged", ranks=1)   # merged for the one rank that spoke: unverified 0
    got = caserun.summarize(casing.CASES["learning"], d, 0)
    assert all(g["ok"] for g in got["gates"].values()), got["gates"]
    assert got["step_markers"]["missing"], got["step_markers"]
    assert got["observed"] == "red" and not got["as_expected"], got
    assert any("on rank 1" in r for r in got["reasons"]), got["reasons"]
    # The missing lines are the case's errors too (case.json's first and last error name them).
    assert got["last_error"].startswith("FAIL: no log line matches step marker") and "rank 1" in got["last_error"], got


def test_a_recorded_run_cut_short_is_red_by_its_configured_step_count(tmp_path):
    """A learning run recorded before the held-out validation (judged without the learning gate) that
    stopped after 5 of its 6 configured steps, every series consistent up to there: red, by the count
    the case configures (grpo.max_num_steps=6), not green by the steps its series happen to show."""
    from harness.host import caserun
    recorded = [a for a in casing.script_args(casing.CASES["learning"], "/m", "/d.jsonl", "/ck", "/v.jsonl")
                if a != "grpo.val_at_start=true"]
    case = casing.as_recorded("learning", recorded)
    assert not case.validation and casing.configured_steps(case) == 6
    whole = caserun.summarize(case, _run(tmp_path, "six", accuracy=None), 0)
    assert whole["observed"] == "green", whole["reasons"]
    cut = caserun.summarize(case, _run(tmp_path, "five", steps=5, accuracy=None), 0)
    assert cut["observed"] == "red", cut
    assert any(r.startswith("gated steps: ") and "configured for 6 steps" in r for r in cut["reasons"]), cut["reasons"]


def test_the_swaps_after_the_last_step_are_judged_too(tmp_path):
    """NeMo-RL swaps the weights into the inference model before the start validation, before each step's
    generation and before the end validation: 8 swaps for 6 steps (h100/2026-12-05-learning-passed). The 7th
    (step 6's generation) and the 8th (the end validation's) are checked like the others: a tensor unequal
    there, a rank silent there, or either swap missing, and the case is red by the refit gate alone; a run
    whose every swap was exact is green."""
    from harness.host import caserun
    gate = f'max(data["{learning.UNVERIFIED}"]) == 0'
    for name, kw in (("end-validation-unequal", {"equal": lambda s, r: 160 if s == 8 and r == 1 else 170}),
                     ("last-generation-unequal", {"equal": lambda s, r: 169 if s == 7 else 170}),
                     ("rank-silent-at-the-end", {}),
                     ("end-swap-missing", {"swaps": 7})):
        d = _run(tmp_path, name, **kw)
        if name == "rank-silent-at-the-end":   # rank 1's check line of the 8th swap gone
            log = (d / "run.log").read_text().splitlines()
            (d / "run.log").write_text("\n".join(ln for ln in log if "step 8: 170 of 170 tensors equal on rank 1" not in ln) + "\n")
            learning.merge_metrics(d, 2, tensors=170, last_step=6)
        got = caserun.summarize(casing.CASES["learning"], d, 0)
        assert got["observed"] == "red" and got["reasons"] == [f"gate {gate}: {got['gates'][gate]['detail']}"], \
            (name, got["reasons"])
        assert got["per_step"][learning.UNVERIFIED]["5"] == 0.0 and got["per_step"][learning.UNVERIFIED]["6"] > 0, name
    got = caserun.summarize(casing.CASES["learning"], _run(tmp_path, "every-swap-exact"), 0)
    assert got["observed"] == "green", got["reasons"]


def test_a_silent_rank_leaves_every_tensor_unverified_by_the_gate_itself(tmp_path):
    """Two ranks ran and only rank 0 printed its refit-check lines: the unverified-tensors gate fails on its
    own (every tensor of every step counts), not only the step markers."""
    from harness.host import caserun
    log = "".join(f"[refit-check] step {s}: 170 of 170 tensors equal on rank 0\n" for s in (1, 2))
    got = learning.harness_metrics(log, ["1", "2"], 2, 170)
    assert got[learning.UNVERIFIED] == {"1": 170.0, "2": 170.0}
    one = _run(tmp_path, "rank-0-alone", ranks=1)
    learning.merge_metrics(one, 2, tensors=170, last_step=6)   # two GPUs ran
    verdict = caserun.summarize(casing.CASES["learning"], one, 0)
    gate = verdict["gates"][f'max(data["{learning.UNVERIFIED}"]) == 0']
    assert not gate["ok"] and gate["value"] == 170.0, gate
    assert verdict["observed"] == "red" and any(learning.UNVERIFIED in r for r in verdict["reasons"])


def test_a_check_line_holding_a_line_separator_counts_for_nothing():
    """A line another reader would split (a carriage return inside Ray's prefix) is ambiguous: the judge's
    step markers ignore it, and so must the harness, which leaves its rank's tensors unverified."""
    ambiguous = "(MegatronPolicyWorker[rank=0] pid=7\r) [refit-check] step 1: 170 of 170 tensors equal on rank 0\n"
    plain = "[refit-check] step 1: 170 of 170 tensors equal on rank 1\n"
    got = learning.harness_metrics(ambiguous + plain, ["1"], 2, 170)
    assert got[learning.UNVERIFIED] == {"1": 170.0}, got
    drift = "(MegatronPolicyWorker[rank=0] pid=7\u2028) [weight-change] step 1: rel_l2 1e-03, changed 5e-01 of 9 elements on rank 0\n"
    moved = "[weight-change] step 1: rel_l2 1e-03, changed 5e-01 of 9 elements on rank 1\n"
    assert learning.harness_metrics(drift + moved, ["1"], 2, 170)[learning.CHANGED] == {"1": 0.0}


def test_merging_again_reads_the_scripts_own_metrics_not_the_merged_ones(tmp_path):
    """The harness series are computed from the raw files alone, every time: merged again for a run set for 7
    steps (no validation at step 7), the gain the first merge computed is gone, and the case is red by it."""
    from harness.host import caserun
    d = _run(tmp_path, "remerged")
    assert json.loads((d / "metrics.json").read_text())[casing.GAIN] == pytest.approx(0.12)
    learning.merge_metrics(d, 2, tensors=170, last_step=7)
    assert casing.GAIN not in json.loads((d / "metrics.json").read_text())
    assert casing.GAIN not in json.loads((d / "script-metrics.json").read_text())
    got = caserun.summarize(casing.CASES["learning"], d, 0)
    assert got["observed"] == "red" and any(f"'{casing.GAIN}' is missing" in r for r in got["reasons"]), got["reasons"]


def test_what_the_judge_counts_a_refit_is_what_the_harness_counts_equal():
    """The learning entry's step markers (nightly.toml, read by the judge) and cases.REFIT_CHECK_LINE (read by
    the harness to count unverified tensors) are one rule: a line a step marker takes is one the harness parses
    with every tensor equal; "169 of 170" the harness parses as one short, and no step marker takes it."""
    import re
    from harness.host import caserun
    marks = [re.compile(casing.RAY_PREFIX + m.text) for m in caserun.grpo_test(casing.LEARNING_TEST).step_markers]
    line = re.compile(casing.REFIT_CHECK_LINE)
    assert len(marks) == 2
    for rank in range(2):
        whole = RAY.format(r=rank, pid=11) + f"[refit-check] step 3: 170 of 170 tensors equal on rank {rank}"
        short = f"[refit-check] step 3: 169 of 170 tensors equal on rank {rank}"
        m = line.fullmatch(whole)
        assert m and m["equal"] == m["n"] == "170" and m["rank"] == str(rank), whole
        assert [bool(mk.fullmatch(whole)) for mk in marks] == [r == rank for r in range(2)], whole
        m = line.fullmatch(short)
        assert m and (m["equal"], m["n"]) == ("169", "170"), short
        assert not any(mk.fullmatch(short) for mk in marks), short


def test_the_unverified_count_is_the_worst_ranks(tmp_path):
    """One rank shows every tensor equal, the other one tensor short: the step counts that rank's unverified
    tensor, and the gate reading it fails (not only the step marker of the rank that fell short)."""
    from harness.host import caserun
    log = "[refit-check] step 1: 169 of 170 tensors equal on rank 0\n[refit-check] step 1: 170 of 170 tensors equal on rank 1\n"
    got = learning.harness_metrics(log, ["1"], 2, 170)
    assert got[learning.UNVERIFIED] == {"1": 1.0} and got[learning.EQUAL] == {"1": 169.0}, got
    d = _run(tmp_path, "rank-0-short", equal=lambda step, rank: 169 if rank == 0 else 170)
    verdict = caserun.summarize(casing.CASES["learning"], d, 0)
    gate = verdict["gates"][f'max(data["{learning.UNVERIFIED}"]) == 0']
    assert not gate["ok"] and gate["value"] == 1.0, gate


def test_the_drift_is_the_least_moved_ranks(tmp_path):
    """At the last refit one rank's weights moved and the other's did not (its updates never reached what is
    sent): the step's changed fraction is the still rank's 0, and the drift gate fails."""
    from harness.host import caserun
    log = ("[weight-change] step 1: rel_l2 1.0e-03, changed 5.0e-01 of 9 elements on rank 0\n"
           "[weight-change] step 1: rel_l2 0.0e+00, changed 0.0e+00 of 9 elements on rank 1\n")
    got = learning.harness_metrics(log, ["1"], 2, 170)
    assert got[learning.CHANGED] == {"1": 0.0} and got[learning.DRIFT] == {"1": 0.0}, got
    d = _run(tmp_path, "rank-1-still", changed=lambda rel, rank: f"{rel * 100:.6e}" if rank == 0 else "0.0e+00")
    verdict = caserun.summarize(casing.CASES["learning"], d, 0)
    gate = verdict["gates"][f'last(data["{learning.CHANGED}"]) > 1e-3']
    assert not gate["ok"] and gate["value"] == 0.0, gate
    assert verdict["observed"] == "red"


def test_a_tie_between_lr_recipes_goes_to_the_first_listed():
    assert learning.best_lr({"1e-5": 0.1, "3e-5": 0.1, "6e-5": 0.05}) == ("1e-5", 0.1)
    assert learning.best_lr({"1e-5": 0.05, "3e-5": 0.1, "6e-5": 0.1}) == ("3e-5", 0.1)


def test_the_configured_steps_are_the_last_override_as_hydra_applies_them(tmp_path):
    """Hydra applies overrides in order, the last wins: a case whose overrides set 2 steps and then 6 runs 6,
    and a run of it that stopped after step 2 is red."""
    from dataclasses import replace
    from harness.host import caserun
    case = replace(casing.CASES["learning"], overrides=("grpo.max_num_steps=2",) + casing.CASES["learning"].overrides)
    assert casing.configured_steps(case) == 6
    assert casing.configured_steps(replace(case, overrides=("grpo.max_num_steps=6", "grpo.max_num_steps=2"))) == 2
    cut = caserun.summarize(replace(case, validation=False), _run(tmp_path, "two-of-six", steps=2, accuracy=None), 0)
    assert cut["observed"] == "red" and any("configured for 6 steps" in r for r in cut["reasons"]), cut["reasons"]
