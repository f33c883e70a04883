"""The judge against hostile runs (issue 20, section 2): each case below passed before the judge
was hardened; each must now fail, with a reason that names what was wrong.

Metrics are parsed from JSON text the way the nightly reads them (NeMo-RL's metrics.json,
json_dump_tb_logs.py's ``{name: {step: value}}``, or the mini test's result line), so JSON's own
``NaN``/``Infinity`` tokens and overflowing literals reach the judge as they would in a real run.
Logs are the shapes the committed H200 logs show (Ray's actor prefixes, ANSI colours).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from carry.errors import ConfigError
from carry.nightly.judge import judge, parse_gate, parse_step_marker
from carry.nightly.config import load as load_matrix
from carry.nightly.runlog import markers_found, result_line
from helpers import ROOT, proofs_matrix, read_recorded, tool

MARK_GTP = "[gtp] enabling GTP weight rematerialization"
MARK_RESHARD = "[colocated-reshard] building dedicated inference model"
MARKERS = (MARK_GTP, MARK_RESHARD)
GOOD_LOG = (f"{MARK_GTP} (gtp_remat_size=2 expert_gtp_remat_size=1)\n"
            f"{MARK_RESHARD} (inference TP=1 PP=1 EP=1 CP=1 impl=None)\n")
TMPE = 'max(data["train/token_mult_prob_error"]) < 1.05'
GRAD = 'max(data["train/grad_norm"]) < 1e30'
# Ray's prefix on a worker's line, as the committed logs show it (colour codes included).
RAY = "\x1b[36m(MegatronPolicyWorker pid=6368)\x1b[0m "
RAY_RANK = "\x1b[36m(MegatronPolicyWorker[rank=0] pid=6376)\x1b[0m "
REFIT = r"\[refit-check\] step (?P<step>\d+): (?P<n>\d+) of (?P=n) tensors equal"


def metrics_json(**series: dict) -> dict:
    """What the nightly reads from a metrics file: JSON text, parsed (NaN tokens and all)."""
    text = "{" + ", ".join(f'"{k}": {{{", ".join(f"{json.dumps(str(s))}: {v}" for s, v in d.items())}}}'
                           for k, d in series.items()) + "}"
    return json.loads(text)


def fn(metrics: dict, *, log: str = GOOD_LOG, rc: int = 0, gates=(TMPE, GRAD), markers=MARKERS, **kw):
    return judge(rc=rc, timed_out=False, text=log, metrics=metrics, gates=[parse_gate(g) for g in gates],
                 markers=markers, **kw)


def good(**over) -> dict:
    base = {"train/token_mult_prob_error": {1: "1.01", 2: "1.02", 3: "1.015"},
            "train/grad_norm": {1: "0.1", 2: "0.2", 3: "0.15"}}
    for key, steps in over.items():
        base[key.replace("__", "/")] = {**base.get(key.replace("__", "/"), {}), **steps}
    return metrics_json(**base)


def test_a_good_run_still_passes_with_the_same_reason():
    v = fn(good())
    assert v.status == "passed", v
    assert v.reason == (f'{TMPE} (value 1.02); {GRAD} (value 0.2)')


# -- 1. non-finite values fail every gate that reads them ---------------------------------------
@pytest.mark.parametrize("token,shown", [("NaN", "NaN"), ("Infinity", "inf"), ("-Infinity", "-inf"),
                                         ("-1e400", "-inf"), ("1e400", "inf")])
@pytest.mark.parametrize("step", [1, 2, 3])
@pytest.mark.parametrize("agg", ["max", "min", "mean", "median", "first", "last"])
def test_a_non_finite_value_at_any_step_fails_any_gate_on_it(token, shown, step, agg):
    gate = f'{agg}(data["train/grad_norm"]) < 1e30'
    v = fn(good(train__grad_norm={step: token}), gates=(TMPE, gate))
    assert v.status == "failed", (token, step, agg, v)
    assert f"gate {gate}: train/grad_norm is {shown} at step {step}" in v.reason, v.reason


def test_nan_after_the_first_step_of_token_mult_prob_error_fails():
    """max() skips a NaN that is not first: the hostile run of section 2."""
    v = fn(good(train__token_mult_prob_error={2: "NaN"}))
    assert v.status == "failed"
    assert f"gate {TMPE}: train/token_mult_prob_error is NaN at step 2" in v.reason


def test_a_non_finite_scalar_of_a_result_line_fails():
    text = GOOD_LOG + '{"token_mult_prob_error": 1.0001, "grad_norm": -1e400}\n'
    v = fn(result_line(text), log=text, gates=('max(data["grad_norm"]) < 1e30',), metrics_source="result-line")
    assert v.status == "failed" and 'gate max(data["grad_norm"]) < 1e30: grad_norm is -inf' in v.reason, v


@pytest.mark.parametrize("value,named", [('"0.2"', "a string ('0.2')"), ("null", "null"), ("true", "a bool (true)"),
                                         ("[0.2]", "a list"), ('{"a": 1}', "an object")])
def test_a_value_that_is_not_a_number_is_a_named_failure(value, named):
    v = fn(metrics_json(**{"train/token_mult_prob_error": {1: "1.01", 2: "1.02"},
                           "train/grad_norm": {1: "0.1", 2: value}}))
    assert v.status == "failed", v
    assert f"gate {GRAD}: train/grad_norm is {named} at step 2, not a number" in v.reason, v.reason
    if value.startswith(("[", "{")):
        return  # as a whole entry, a list or an object is a series, judged step by step
    # A scalar too (a result line's entry).
    v = fn(json.loads(f'{{"grad_norm": {value}}}'), gates=('max(data["grad_norm"]) < 1e30',))
    assert v.status == "failed" and f"grad_norm is {named}, not a number" in v.reason, v.reason


def test_an_empty_series_is_a_named_failure():
    v = fn({"train/token_mult_prob_error": {}, "train/grad_norm": {"1": 0.1}})
    assert v.status == "failed" and "train/token_mult_prob_error has no values" in v.reason, v


def test_a_gate_whose_threshold_is_not_finite_is_refused():
    with pytest.raises(ConfigError, match="not a finite number"):
        parse_gate('max(data["grad_norm"]) < 1e400')


# -- 2. a marker is a whole line of the run --------------------------------------------------
def test_a_marker_quoted_in_an_error_message_does_not_count():
    quoted = (f"ERROR: never saw '{MARK_GTP} (gtp_remat_size=2)'\n"
              f"ERROR: never saw '{MARK_RESHARD}'\n")
    v = fn(good(), log=quoted)
    assert v.status == "vacuous", v
    assert MARK_GTP in v.reason and MARK_RESHARD in v.reason
    # ... nor behind Ray's prefix, nor the functional script's own complaint about it.
    v = fn(good(), log=f"{RAY}ERROR: never saw '{MARK_GTP}'\n")
    assert v.status == "vacuous" and not any(v.markers.values()), v
    # The script's own FAIL: line quoting a marker is no marker either, and it fails the run (it says so).
    v = fn(good(), log=f"FAIL: '{MARK_RESHARD}' is not in run.log: no refit\n")
    assert v.status == "failed" and not any(v.markers.values()) and "the run printed FAIL:" in v.reason, v


@pytest.mark.parametrize("line,counts", [
    (f"{MARK_GTP} (gtp_remat_size=2)", True),
    (f"{RAY}{MARK_GTP} (gtp_remat_size=2)", True),
    (f"{RAY_RANK}{MARK_GTP}", True),
    (f"(MegatronPolicyWorker pid=12, ip=10.0.0.2) {MARK_GTP}", True),
    (f"(pid=12) {MARK_GTP}", True),
    (f"{RAY}{MARK_GTP}\x1b[32m [repeated 2x across cluster]\x1b[0m", True),
    (f"  {MARK_GTP}", False),                       # indented: a quoted source line, not the print
    (f"INFO:root:{MARK_GTP}", False),               # a logging prefix is not the run's print
    (f"(raylet) {MARK_GTP}", False),                # no pid: not a worker's print
    (f"(Worker pid=1) (Worker pid=2) {MARK_GTP}", False),
    (f"echo '{MARK_GTP}'", False),
    (f"{MARK_GTP[:-1]}", False),
])
def test_which_prefixes_a_whole_line_may_carry(line, counts):
    assert markers_found(f"noise\n{line}\nmore noise\n", [MARK_GTP]) == {MARK_GTP: counts}


def _green_logs() -> list[tuple[Path, tuple[str, ...]]]:
    """Every committed green log and the markers of the nightly cell that judges it."""
    cells = {t.name: t for t in load_matrix(ROOT / "integration" / "nightly.toml").tests}
    out = []
    mini = ROOT / "integration" / "gtp_refit_mini" / "h200"
    for run in json.loads((mini / "runs.json").read_text())["runs"]:
        if run["expect"] == "passed":
            out.append((mini / run["file"], cells[run["cell"]].markers))
    nrl = ROOT / "integration" / "nemo_rl_gtp" / "h200"
    grpo = cells["grpo-megatron-generation-gtp"].markers
    for case in sorted(nrl.glob("*.case.json")):
        doc = json.loads(case.read_text())
        if doc.get("observed") == "green" and doc.get("case") != "gtp-off":
            out.append((case.with_name(case.name.replace(".case.json", ".run.log")), grpo))
    return out


def test_every_marker_of_the_committed_green_logs_is_still_found():
    logs = _green_logs()
    assert len(logs) >= 10 and any("nemo_rl_gtp" in str(p) for p, _ in logs), logs
    for path, markers in logs:
        found = markers_found(path.read_text(errors="replace"), markers)
        assert all(found.values()), (path.name, found)


def test_the_committed_green_logs_quoted_in_an_error_lose_their_markers():
    """The same logs, each marker line rewritten into an error message that quotes it: none found."""
    for path, markers in _green_logs():
        text = path.read_text(errors="replace")
        for m in markers:
            text = text.replace(m, f"ERROR: never saw '{m}")
        found = markers_found(text, markers)
        assert not any(found.values()), (path.name, found)


# -- 3. BUG_HIT and tracebacks ---------------------------------------------------------------
def test_bug_hit_fails_a_run_that_exited_0():
    v = fn(good(), log=GOOD_LOG + "BUG_HIT: mlm-tied-weight-guard: shape is (256, 128), not (512, 128)\n")
    assert v.status == "failed" and v.bug == "mlm-tied-weight-guard", v
    assert v.reason.startswith("BUG_HIT mlm-tied-weight-guard: shape is (256, 128)") and "exited 0" in v.reason
    v = fn(good(), log=GOOD_LOG + f"{RAY}BUG_HIT: mlm-te-bias-sizing: bias has 128 entries\n")
    assert (v.status, v.bug) == ("failed", "mlm-te-bias-sizing"), v
    # Quoting a bug line is not hitting it.
    v = fn(good(), log=GOOD_LOG + "grep found no 'BUG_HIT: mlm-te-bias-sizing: x'\n")
    assert v.status == "passed", v


TB = ('Traceback (most recent call last):\n  File "run.py", line 410, in <module>\n    main()\n'
      'RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970\n')
RESULT = '{"token_mult_prob_error": 1.0001, "grad_norm": 1.9}\n'


def _mini(text: str, rc: int = 0, source: str = "result-line"):
    return fn(result_line(text), log=text, rc=rc, gates=('max(data["token_mult_prob_error"]) < 1.05',),
              metrics_source=source)


def test_a_traceback_after_the_result_line_fails():
    assert _mini(GOOD_LOG + RESULT).status == "passed"
    v = _mini(GOOD_LOG + RESULT + TB)
    assert v.status == "failed", v
    assert "a Python traceback after the result line (log line 4): RuntimeError: NCCL error" in v.reason, v.reason
    v = _mini(GOOD_LOG + RESULT + TB.replace("Traceback", RAY + "Traceback", 1))
    assert v.status == "failed" and "after the result line" in v.reason, v


def test_a_traceback_before_the_result_line_fails_too():
    v = _mini(GOOD_LOG + TB + RESULT)
    assert v.status == "failed", v
    assert "a Python traceback before the result line (log line 3): RuntimeError: NCCL error" in v.reason, v.reason


def test_a_traceback_quoted_inside_the_result_line_is_not_one():
    doc = {"token_mult_prob_error": 1.0001, "note": "Traceback (most recent call last):\n  nothing"}
    assert _mini(GOOD_LOG + json.dumps(doc) + "\n").status == "passed"


# -- 6. per-step markers and gates at every step ------------------------------------------------
PCT = 'min(data["train/baseline_reward/pct_mixed"]) > 0'


def learning(steps: dict[int, dict[str, str]]) -> dict:
    per = {}
    for step, values in steps.items():
        for key, value in values.items():
            per.setdefault(key, {})[step] = value
    return metrics_json(**per)


def four_steps(**over) -> dict:
    steps = {s: {"train/baseline_reward/pct_mixed": "50", "train/token_mult_prob_error": "1.01"} for s in (1, 2, 3, 4)}
    for s, values in over.items():
        steps[int(s[1:])].update(values)
    return learning(steps)


def refit_log(counts: dict[int, str], prefix: str = RAY_RANK) -> str:
    return GOOD_LOG + "".join(f"{prefix}[refit-check] step {s}: {c} tensors equal\n" for s, c in counts.items())


def _learn(metrics, log, gates=(PCT, 'max(data["train/token_mult_prob_error"]) < 1.05'), step_markers=(REFIT,)):
    return fn(metrics, log=log, gates=gates, step_markers=[parse_step_marker(s) for s in step_markers])


def test_step_markers_pass_when_every_step_has_its_line():
    v = _learn(four_steps(), refit_log({s: "170 of 170" for s in (1, 2, 3, 4)}))
    assert v.status == "passed", v


def test_a_step_whose_check_line_does_not_match_fails_naming_the_step():
    v = _learn(four_steps(), refit_log({1: "170 of 170", 2: "170 of 170", 3: "169 of 170", 4: "170 of 170"}))
    assert v.status == "failed", v
    assert "no log line matches step marker" in v.reason and "at step 3" in v.reason, v.reason
    assert "step 2" not in v.reason.split("at step")[1]


def test_a_stale_refit_fails_at_every_step_after_the_first():
    """What the learning case's stale-refit switch leaves: step 1 equal, later steps not."""
    v = _learn(four_steps(), refit_log({1: "170 of 170", 2: "0 of 170", 3: "0 of 170", 4: "0 of 170"}))
    assert v.status == "failed" and "at steps 2, 3, 4" in v.reason, v.reason
    # Counts that only look alike do not match: the backreference wants the same number twice.
    for almost in ("17 of 170", "170 of 1700", "1700 of 170"):
        v = _learn(four_steps(), refit_log({1: "170 of 170", 2: almost, 3: "170 of 170", 4: "170 of 170"}))
        assert v.status == "failed" and "at step 2" in v.reason, (almost, v.reason)


def test_a_missing_step_line_fails_and_a_quoted_one_does_not_count():
    log = refit_log({1: "170 of 170", 2: "170 of 170"}) + "ERROR: wanted '[refit-check] step 3: 170 of 170 tensors equal'\n"
    v = _learn(four_steps(), log)
    assert v.status == "failed" and "at steps 3, 4" in v.reason, v.reason


def test_step_markers_need_steps_in_the_gated_metrics():
    v = _learn({"x": 1.0}, refit_log({1: "170 of 170"}), gates=('max(data["x"]) < 2',))
    assert v.status == "failed" and "no gated metric has steps" in v.reason, v


def test_gates_hold_at_every_step_not_on_the_average():
    v = _learn(four_steps(s3={"train/baseline_reward/pct_mixed": "0"}), refit_log({s: "170 of 170" for s in (1, 2, 3, 4)}))
    assert v.status == "failed" and f"gate {PCT}: min(train/baseline_reward/pct_mixed) = 0, wanted > 0" in v.reason, v
    v = _learn(four_steps(s2={"train/token_mult_prob_error": "1.06"}), refit_log({s: "170 of 170" for s in (1, 2, 3, 4)}))
    assert v.status == "failed" and "max(train/token_mult_prob_error) = 1.06" in v.reason, v


def test_a_gated_metric_missing_at_a_step_the_others_have_fails():
    m = four_steps()
    del m["train/token_mult_prob_error"]["3"]
    v = _learn(m, refit_log({s: "170 of 170" for s in (1, 2, 3, 4)}))
    assert v.status == "failed", v
    assert "train/token_mult_prob_error has no value at step 3" in v.reason, v.reason


def test_len_counts_the_steps():
    v = fn(four_steps(), log=GOOD_LOG, gates=('len(data["train/token_mult_prob_error"]) >= 4',))
    assert v.status == "passed", v
    v = fn(four_steps(), log=GOOD_LOG, gates=('len(data["train/token_mult_prob_error"]) >= 5',))
    assert v.status == "failed" and "len(train/token_mult_prob_error) = 4, wanted >= 5" in v.reason, v


@pytest.mark.parametrize("regex,why", [(r"\[refit-check\] step (\d+) ok", "named group 'step'"),
                                       (r"\[refit-check\] step (?P<step>\d+", "not a valid regex"),
                                       ("", "named group 'step'")])
def test_a_bad_step_marker_is_refused(regex, why):
    with pytest.raises(ConfigError, match=why):
        parse_step_marker(regex)


# -- 4. the matrix refuses a test that could only pass on its exit status ------------------------
BASE = proofs_matrix("gtp", timeout_s=None)


def _matrix(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "nightly.toml"
    p.write_text(BASE + body)
    return p


def test_a_test_with_neither_gates_nor_markers_is_refused(tmp_path):
    cfg = _matrix(tmp_path, '\n[[tests]]\nname = "exit-only"\nkind = "command"\nimages = ["host"]\n'
                            'argv = ["{python}", "-c", "pass"]\n')
    res = tool("nightly", "--config", cfg, "--out", tmp_path / "o", "--print-commands", check=2)
    assert "exit-only" in res.stderr and "neither gates nor markers" in res.stderr, res.stderr
    assert "next:" in res.stderr and "markers = [" in res.stderr
    # The proof entry alone (judged red/green) loads.
    assert [t.name for t in load_matrix(_matrix(tmp_path, "")).tests] == ["proofs"]


@pytest.mark.parametrize("body,msg", [
    ('markers = [""]', "empty marker"),
    (f'markers = ["x"]\nstep_markers = [{json.dumps(REFIT)}]', "step_markers need gates"),
    ('gates = [\'max(data["x"]) < 1\']\nstep_markers = ["no step group"]', "named group 'step'"),
    ('gates = [\'max(data["x"]) < 1e999\']', "not a finite number"),
])
def test_the_matrix_refuses_markers_and_gates_that_cannot_fail(tmp_path, body, msg):
    cfg = _matrix(tmp_path, f'\n[[tests]]\nname = "t1"\nkind = "command"\nimages = ["host"]\nargv = ["x"]\n{body}\n')
    with pytest.raises(ConfigError, match=msg) as exc:
        load_matrix(cfg)
    assert "t1" in exc.value.message


# Cells whose recorded runs are another cell's: the same command (gtp-refit-mini-nccl is nccl-bf16's, in the image).
RECORDED_AS = {"gtp-refit-mini-nccl": "gtp-refit-mini-nccl-bf16"}
# Gates no recorded run has passed yet, each (cell, gate text) with why beside it. None now: the last one, the
# learning gate, passed in h100/2026-12-05-learning-passed and h200/2026-12-05-learning-other-halves.
NOT_YET_RECORDED: set = set()


def _recorded_runs(name: str) -> list[tuple[str, str, dict]]:
    """(label, log, metrics) of the committed runs recorded for matrix entry NAME (any verdict)."""
    import sys
    name = RECORDED_AS.get(name, name)
    mini = ROOT / "integration" / "gtp_refit_mini" / "h200"
    out = [(r["file"], (mini / r["file"]).read_text(), result_line((mini / r["file"]).read_text()) or {})
           for r in json.loads((mini / "runs.json").read_text())["runs"] if r["cell"] == name]
    for cpu in sorted((ROOT / "integration" / "cpu-runs").glob("*/run.json")):
        doc = json.loads(cpu.read_text())
        if doc["test"] == name:
            out.append((cpu.parent.name, (cpu.parent / doc["log"]).read_text(), doc["metrics"]))
    if name == "grpo-megatron-generation-gtp":
        out += [(stem, log, m) for stem, log, m in _green_functional_runs()]
    if name == "grpo-megatron-generation-gtp-learning":
        sys.path.insert(0, str(ROOT / "integration" / "nemo_rl_gtp"))
        from harness.host import cases as casing
        for index in sorted(p for card in ("h100", "h200") for p in (ROOT / "integration" / card).glob("*/runs.json")):
            for run in json.loads(index.read_text())["runs"]:
                d = index.parent / run["dir"]
                if casing.CASES[run["case"]].test == name:
                    out.append((run["dir"], read_recorded(d / "run.log"),
                                json.loads((d / "metrics.json").read_text())))
    return out


def _broken(gate, metrics: dict) -> dict:
    """METRICS with the gated series moved onto the gate's bound at every step: a value the gate refuses."""
    bound = gate.threshold + (1 if gate.op == "==" else 0)
    value = metrics[gate.key]
    moved = {k: bound for k in value} if isinstance(value, dict) else bound
    return {**metrics, gate.key: moved}


def test_each_gate_of_the_shipped_matrix_holds_on_a_recorded_passing_run_and_fails_on_one_that_breaks_it():
    """Every gate of every command and functional entry of integration/nightly.toml, loaded and evaluated against
    the committed H200 runs recorded for that entry: it holds on a recorded run that passed, and fails on a
    recorded run that broke it (or, where none was recorded, on a passing run's metrics with that one series
    moved onto the gate's bound). Every marker is found in a passing run's log and missing from it with its lines
    removed. A gate no run has recorded yet is named in NOT_YET_RECORDED, never silently left out."""
    from carry.nightly.judge import evaluate_gate, markers_found
    cfg = load_matrix(ROOT / "integration" / "nightly.toml")
    unrecorded = set()
    checked = 0
    for t in cfg.tests:
        if t.kind in ("proof", "upstream-tests"):
            continue   # judged red/green per proof, or per upstream test, not by gates
        assert t.gates or t.markers, t.name
        runs = _recorded_runs(t.name)
        assert runs, f"{t.name}: no committed run recorded for it"
        for gate in t.gates:
            held = [(label, m) for label, _, m in runs if gate.key in m and evaluate_gate(gate, m).ok]
            if not held:
                unrecorded.add((t.name, gate.text))
                continue
            label, metrics = held[0]
            failed = [lb for lb, _, m in runs if gate.key in m and not evaluate_gate(gate, m).ok]
            if not failed:
                r = evaluate_gate(gate, _broken(gate, metrics))
                assert not r.ok, (t.name, gate.text, label, r)
            checked += 1
        for marker in t.markers:
            logs = [log for _, log, _ in runs if markers_found(log, [marker])[marker]]
            assert logs, (t.name, marker)
            cut = "\n".join(ln for ln in logs[0].splitlines() if marker not in ln)
            assert not markers_found(cut, [marker])[marker], (t.name, marker)
    assert unrecorded == NOT_YET_RECORDED, unrecorded ^ NOT_YET_RECORDED
    assert checked >= 20, checked


def _green_functional_runs() -> list[tuple[str, str, dict]]:
    nrl = ROOT / "integration" / "nemo_rl_gtp" / "h200"
    out = []
    for case in sorted(nrl.glob("*.case.json")):
        doc = json.loads(case.read_text())
        stem = case.name.replace(".case.json", "")
        m = nrl / f"{stem}.metrics.json"
        if doc.get("observed") == "green" and doc.get("case") != "gtp-off" and m.exists():
            out.append((stem, (nrl / f"{stem}.run.log").read_text(errors="replace"), json.loads(m.read_text())))
    return out


def test_the_committed_green_grpo_runs_still_pass_and_a_nan_in_them_fails():
    """NeMo-RL's own green runs on the H200 (run.log and metrics.json as the nightly reads them),
    judged by the grpo cell: passed. The same metrics with step 2's grad_norm NaN: failed, named."""
    spec = next(t for t in load_matrix(ROOT / "integration" / "nightly.toml").tests
                if t.name == "grpo-megatron-generation-gtp")
    runs = _green_functional_runs()
    assert len(runs) >= 3, [r[0] for r in runs]
    for stem, log, metrics in runs:
        # A resumed run (the resume case) makes the steps after its checkpoint alone.
        first = min(int(s) for s in metrics["train/token_mult_prob_error"])

        def verdict(m):
            return judge(rc=0, timed_out=False, text=log, metrics=m, gates=spec.gates, markers=spec.markers,
                         step_markers=spec.step_markers, metrics_source=spec.metrics, first_step=first)
        v = verdict(metrics)
        assert v.status == "passed", (stem, v.reason)
        last = max(metrics["train/grad_norm"], key=int)
        bad = {**metrics, "train/grad_norm": {**metrics["train/grad_norm"], last: float("nan")}}
        v = verdict(bad)
        assert v.status == "failed" and f"train/grad_norm is NaN at step {last}" in v.reason, (stem, v.reason)


def test_a_gate_failed_on_a_non_finite_value_reports_that_value():
    """GateResult.value is the offending value (what case summaries show), not a misleading max."""
    from carry.nightly.judge import evaluate_gate
    r = evaluate_gate(parse_gate(GRAD), good(train__grad_norm={2: "Infinity"}))
    assert (r.ok, r.value, r.detail) == (False, float("inf"), "train/grad_norm is inf at step 2")
    r = evaluate_gate(parse_gate(GRAD), good(train__grad_norm={2: "null"}))
    assert (r.ok, r.value) == (False, None) and "null at step 2" in r.detail


def test_values_past_float_range_and_overflowing_means_fail_named():
    big = "1" + "0" * 400  # a JSON integer literal: Python reads it as an int that no float holds
    v = fn(metrics_json(**{"train/token_mult_prob_error": {1: "1.01"}, "train/grad_norm": {1: "0.1", 2: big}}))
    assert v.status == "failed" and "train/grad_norm is an integer of 401 digits at step 2, past float range" in v.reason
    v = fn(metrics_json(**{"train/token_mult_prob_error": {1: "1.01"}, "x": {1: "1e308", 2: "1e308"}}),
           gates=(TMPE, 'mean(data["x"]) > 0'))
    assert v.status == "failed" and "mean(x) of finite values overflows" in v.reason, v.reason


def test_a_history_value_past_float_range_is_no_repeat_and_no_crash():
    from carry.nightly.judge import deterministic_flags
    prev = {"run_id": "n0", "metrics": {"x": json.loads("1" + "0" * 400), "y": True, "z": 0.5}}
    assert deterministic_flags({"x": 1.0, "y": 1.0, "z": 0.5}, prev, ["x", "y", "z"]) == [
        "deterministic: z = 0.5 repeats bit-identically (run n0)"]


# -- issue 32, item 3: a SKIP: line counts only in the guard's form and place -----------------
# The guard's lines, as their writers print them (integration/gtp_refit_mini/run.py,
# integration/nemo_rl_gtp/run-in-image.sh); the mini's is followed by its result line.
MINI_SKIP = ('SKIP: gtp_refit_mini: no CUDA device (torch.cuda.is_available() is False)\n'
             '{"test": "gtp_refit_mini", "status": "skipped", "reason": "no CUDA device"}\n')
WRAPPER_SKIP = ("$ bash run-in-image.sh tests/functional/grpo_megatron_generation_gtp.sh /carry/out\n"
                "megatron.core from /carry/trees/megatron-lm/megatron/core\n"
                "SKIP: grpo_megatron_generation_gtp.sh: megatron.core.tensor_parallel.gtp_api.HAVE_GTP is not True "
                "in 'python-MegatronPolicyWorker' (GTP needs TransformerEngine >= 2.19)\n")


def test_the_guards_own_lines_are_skips():
    v = fn({}, log=WRAPPER_SKIP)
    assert (v.status, v.reason) == ("skipped", "grpo_megatron_generation_gtp.sh: megatron.core.tensor_parallel."
                                    "gtp_api.HAVE_GTP is not True in 'python-MegatronPolicyWorker' "
                                    "(GTP needs TransformerEngine >= 2.19)"), v
    v = fn(result_line(MINI_SKIP), log=MINI_SKIP, gates=('max(data["token_mult_prob_error"]) < 1.05',),
           metrics_source="result-line")
    assert v.status == "skipped" and v.reason.startswith("gtp_refit_mini: no CUDA device"), v
    v = fn({}, log=WRAPPER_SKIP + "[carry] killed after 5s\n")  # the launcher's own lines may follow
    assert v.status == "skipped", v


@pytest.mark.parametrize("log, metrics, why", [
    # a broken run with a SKIP line somewhere in it: its gate fails
    (GOOD_LOG + "SKIP: gtp_refit_mini: no CUDA device\nstep 2 done\n", "bad", "not the run's last line"),
    # a broken run that ends with one: it measured its metrics, and they fail
    (GOOD_LOG + "SKIP: grpo_megatron_generation_gtp.sh: HAVE_GTP is not True\n", "bad", "gated metric"),
    # it ran (its markers are there), no metrics at all
    (GOOD_LOG + "SKIP: grpo_megatron_generation_gtp.sh: HAVE_GTP is not True\n", None, "printed marker"),
    # not the guard's form: no NAME, an indent, a quote, a logging prefix
    ("SKIP: because\n", None, "not the guard's form"),
    ("  SKIP: a.sh: indented\n", None, "metric"),
    ("ERROR: the guard said 'SKIP: a.sh: no GTP'\n", None, "metric"),
    ("INFO:root:SKIP: a.sh: no GTP\n", None, "metric"),
    # two of them: the guard prints one
    ("SKIP: a.sh: one\nSKIP: a.sh: two\n", None, "2 SKIP: lines"),
    # a traceback beside it
    ("Traceback (most recent call last):\n  File \"x\", line 1\nValueError: boom\nSKIP: a.sh: no GTP\n", None,
     "traceback"),
    # BUG_HIT beside it
    ("BUG_HIT: mlm-tied-weight-guard: wrong shape\nSKIP: a.sh: no GTP\n", None, "BUG_HIT"),
])
def test_a_skip_line_does_not_hide_a_broken_run(log, metrics, why):
    doc = good(train__grad_norm={2: "NaN"}) if metrics == "bad" else {}
    v = fn(doc, log=log)
    assert v.status == "failed", v
    assert why in v.reason, v.reason


def test_a_skip_line_needs_exit_0_no_own_log_and_a_skipped_result():
    assert fn({}, log=WRAPPER_SKIP, rc=1).status == "failed"
    # the test's own run.log is there: the test ran, whatever the console says
    v = fn({}, log=WRAPPER_SKIP, marker_text="step 1 done\n")
    assert v.status == "failed" and "the test's own log is there" in v.reason, v
    # the mini's result line says it ran
    ran = MINI_SKIP.replace('"skipped"', '"failed"')
    v = fn(result_line(ran), log=ran, gates=('max(data["token_mult_prob_error"]) < 1.05',), metrics_source="result-line")
    assert v.status == "failed" and "its result says status 'failed'" in v.reason, v
    # a step marker's line says it ran
    v = fn({}, log="[refit-check] step 1: 5 of 5 tensors equal\n" + WRAPPER_SKIP.split("\n", 1)[1],
           step_markers=[parse_step_marker(REFIT)])
    assert v.status == "failed" and "a line of step marker" in v.reason, v


# -- issue 32, item 8: the judge's holes ---------------------------------------------------------
GOOD_RESULT = '{"token_mult_prob_error": 1.0001, "grad_norm": 0.5}'


def test_a_result_line_cut_off_is_not_judged_on_an_earlier_one():
    text = f"{MARK_GTP}\n{MARK_RESHARD}\n{GOOD_RESULT}\n" + '{"token_mult_prob_error": 7.5, "grad_no'
    assert result_line(text) is None  # was the earlier, good line: the run passed on it
    from carry.nightly.runlog import read_result_line
    _, _, problem = read_result_line(text)
    assert "the result line (log line 4, 39 characters) is not valid JSON, cut off or damaged" in problem
    v = fn({}, log=text, gates=('max(data["token_mult_prob_error"]) < 1.05',), metrics_source="result-line",
           metrics_problem=problem)
    assert v.status == "failed" and "cut off or damaged" in v.reason, v


@pytest.mark.parametrize("steps, series, lack", [
    (3, {1: "1.0", 3: "1.0"}, "has no value at step 2 (the run is configured for 3 steps)"),
    (2, {1: "1.0"}, "has no value at step 2 (the run is configured for 2 steps)"),
    (2, {1: "1.0", 2: "1.0", 3: "1.0"}, "has a value at step 3, past the 2 steps"),
])
def test_steps_missing_from_every_gated_series_fail(steps, series, lack):
    m = metrics_json(**{"train/token_mult_prob_error": series, "train/grad_norm": series})
    # The series agree with each other: without the configuration only a gap can tell (steps 1 and 3).
    assert fn(m).status == ("failed" if steps == 3 else "passed")
    v = fn(m, steps=steps)
    assert v.status == "failed" and f"train/token_mult_prob_error {lack}" in v.reason, v.reason
    assert f"train/grad_norm {lack}" in v.reason


def test_the_matrix_says_how_many_steps_a_run_makes():
    cfg = load_matrix(ROOT / "integration" / "nightly.toml")
    steps = {t.name: t.steps for t in cfg.tests}
    assert steps["grpo-megatron-generation-gtp"] == 2 and steps["grpo-megatron-generation-gtp-learning"] == 6
    assert steps["gtp-refit-mini-nccl-bf16"] == 3  # from its argv's --steps 3


def test_the_steps_setting_and_argv_must_agree(tmp_path):
    head = proofs_matrix("gtp")
    cfg = tmp_path / "n.toml"
    cfg.write_text(head + '''
[[tests]]
name = "x"
kind = "command"
images = ["host"]
argv = ["run", "--steps", "3"]
gates = ['max(data["x"]) < 1']
steps = 4
''')
    with pytest.raises(ConfigError, match="steps = 4, but its argv says --steps 3"):
        load_matrix(cfg)


def test_a_check_line_that_counts_nothing_does_not_count():
    m = good()
    log = GOOD_LOG + "".join(f"[refit-check] step {s}: {n} of {n} tensors equal\n" for s, n in ((1, 170), (2, 0), (3, 170)))
    v = fn(m, log=log, step_markers=[parse_step_marker(REFIT)])
    assert v.status == "failed", v
    assert "at step 2 (a line at step 2 counts 0: it checked nothing)" in v.reason, v.reason
    v = fn(m, log=log.replace(" 0 of 0 ", " 00 of 00 "), step_markers=[parse_step_marker(REFIT)])
    assert v.status == "failed", v


def test_reading_a_megabyte_line_of_blanks_is_linear():
    """run_lines (and BUG_HIT, SKIP:, markers, tracebacks) over a 1 MB run of blanks: it was n^2
    (19 s at 100k blanks). Timed under the machine's other load."""
    import time
    from carry.nightly.runlog import bug_hits, run_lines, skip_reason
    for line in ("x" + " " * 1_000_000 + "y", "BUG_HIT: a-b: " + " " * 1_000_000 + "y",
                 "SKIP: a.sh: " + " " * 1_000_000 + "y", "(pid=1) " + " " * 1_000_000 + "[repeated 2x"):
        t0 = time.monotonic()
        run_lines(line)
        bug_hits(line)
        skip_reason(line)
        v = fn(good(), log=GOOD_LOG + line + "\n")
        took = time.monotonic() - t0
        print(f"1 MB line {line[:12]!r}: {took:.3f}s")
        assert took < 5, took
        assert v.status in ("passed", "failed")


def test_a_run_reporting_a_million_metrics_keeps_its_gated_ones_and_a_bounded_report():
    """Issue 32, item 7's class (huge output): run.json and the history keep at most 1000 metric
    names, the gated ones always; a metric name of a megabyte is not kept."""
    m = good()
    m.update({f"noise/{i:07d}": float(i) for i in range(200_000)})
    m["x" * 1_000_000] = 1.0
    v = fn(m)
    assert v.status == "passed", v.reason
    assert len(v.metrics) == 1000 and "train/grad_norm" in v.metrics and "x" * 1_000_000 not in v.metrics


def test_an_upstream_tests_cell_is_judged_from_its_report_and_never_green_without_one(tmp_path):
    """An upstream-tests cell runs tools/upstream_tests.py and is judged from the report it wrote
    (--json): its status, with 'incomplete' an error. A run that wrote none (past the cell's
    timeout, its Slurm step cancelled; stopped on bad input) is an ``error`` that says why, from
    its log, whose last lines are kept."""
    from carry.nightly.launch import Finished
    from carry.nightly.upstream import REPORT, judge_report

    log = tmp_path / "console.log"
    log.write_text("$ srun --job-name=demo--host--upstream-tests-megatron-lm ...\n[carry] slurm step 7.3 on node\n"
                   "megatron-lm: 1 test file(s) selected; running pristine and patched (pytest, 1 rank(s))\n"
                   "slurmstepd: error: *** STEP 7.3 ON node CANCELLED AT 2026-01-01T00:00:00 ***\n\n"
                   "[carry] killed after 5s\n")
    (tmp_path / REPORT).write_text(json.dumps({"ok": True, "upstreams": [{"upstream": "megatron-lm",
                                                                          "status": "passed", "reason": "stale"}]}))
    v, info = judge_report("megatron-lm", Finished(-15, True, 5.0, log), tmp_path, 5.0)
    assert v.status == "error" and info == {}, v
    assert v.reason == ("megatron-lm's tests timed out after 5s: nothing was judged; last line: slurmstepd: error: "
                        "*** STEP 7.3 ON node CANCELLED AT 2026-01-01T00:00:00 ***"), v.reason
    assert v.tail[-1] == "[carry] killed after 5s", v.tail

    (tmp_path / REPORT).unlink()
    log.write_text("$ python3 tools/upstream_tests.py ...\nerror: megatron-lm pins no tests in series demo\n"
                   "next: add [upstreams.megatron-lm.tests] to series.toml\n")
    v, _ = judge_report("megatron-lm", Finished(2, False, 1.0, log), tmp_path, 300.0)
    assert (v.status, v.reason) == ("error", "megatron-lm's tests could not run: megatron-lm pins no tests in "
                                             "series demo"), v
    log.write_text("$ python3 tools/upstream_tests.py ...\nSegmentation fault\n")
    v, _ = judge_report("megatron-lm", Finished(139, False, 1.0, log), tmp_path, 300.0)
    assert v.reason == ("megatron-lm's tests could not run: it exited 139 without a report; last line: "
                        "Segmentation fault"), v

    def judged(status: str, upstream: str = "megatron-lm") -> tuple[str, str]:
        (tmp_path / REPORT).write_text(json.dumps({"ok": status == "passed", "upstreams": [
            {"upstream": upstream, "status": status, "reason": f"it says {status}", "counts": {"*": {"passed": 2}}}]}))
        v, info = judge_report("megatron-lm", Finished(0 if status == "passed" else 1, False, 9.0, log), tmp_path,
                               300.0)
        assert info.get("upstream_tests", {}).get("counts", {"*": {"passed": 2}}) == {"*": {"passed": 2}}, info
        return v.status, v.reason

    assert judged("passed") == ("passed", "it says passed")
    assert judged("failed") == ("failed", "it says failed")
    assert judged("incomplete") == ("error", "it says incomplete")  # a verdict not given is never green
    assert judged("passed", "megatron-bridge")[0] == "error"  # another upstream's report is no report of this one
    # a report whose bisection did not finish (a cut run judged from its records) names no bisected test
    (tmp_path / REPORT).write_text(json.dumps({"ok": False, "upstreams": [
        {"upstream": "megatron-lm", "status": "failed", "reason": "judged from the records of a run that was cut: ...",
         "bisect": "not finished", "counts": {"*": {"regression": 1}}}]}))
    v, info = judge_report("megatron-lm", Finished(1, False, 9.0, log), tmp_path, 300.0)
    assert v.status == "failed" and info["upstream_tests"]["bisect"] == [], (v, info)


def test_a_timed_out_upstream_tests_cell_is_judged_from_its_records_and_never_green(tmp_path):
    """The cell's timeout cut the run: its --judge-records run's report is the verdict, failed for a regression
    its records hold and an error for anything else (passed included: a cut run compared less than it was
    asked), its counts kept; with no such report (the judge refused: no records; a report the cut run had
    not written as judged from records) nothing was judged, and the judge's own error line says why."""
    from carry.nightly.launch import Finished
    from carry.nightly.upstream import JUDGE_LOG, REPORT, judge_report

    log = tmp_path / "console.log"
    log.write_text("$ python3 tools/upstream_tests.py ...\n[ 10.0s] megatron-lm patched (2 rank(s)): 3 test(s) ended\n"
                   "[carry] killed after 5s\n")
    cut = Finished(-9, True, 5.0, log)

    def judged(status: str, from_records: bool = True) -> tuple[str, str, dict]:
        (tmp_path / JUDGE_LOG).write_text("$ python3 tools/upstream_tests.py ... --judge-records\n")
        (tmp_path / REPORT).write_text(json.dumps({"ok": False, "upstreams": [
            {"upstream": "megatron-lm", "status": status, "reason": f"judged: {status}", "bisect": "not finished",
             "judged_from_records": from_records, "counts": {"*": {"passed": 2, "not-compared": 3}}}]}))
        v, info = judge_report("megatron-lm", cut, tmp_path, 5.0, Finished(1, False, 1.0, tmp_path / JUDGE_LOG))
        return v.status, v.reason, info

    status, reason, info = judged("failed")
    assert (status, reason) == ("failed", "megatron-lm's tests timed out after 5s; judged from the records its "
                                          "launches left: judged: failed"), reason
    assert info["upstream_tests"]["judged_from_records"] is True and info["upstream_tests"]["bisect"] == [], info
    assert info["upstream_tests"]["counts"] == {"*": {"passed": 2, "not-compared": 3}}, info
    assert judged("incomplete")[0] == "error"
    assert judged("passed")[:2] == ("error", "megatron-lm's tests timed out after 5s; judged from the records its "
                                             "launches left: judged: passed")   # never green
    assert judged("passed", from_records=False)[0] == "error" and judged("failed", from_records=False)[2] == {}
    (tmp_path / REPORT).unlink()
    (tmp_path / JUDGE_LOG).write_text("$ ...\nerror: megatron-lm: no launch left records in out/megatron-lm\n")
    v, info = judge_report("megatron-lm", cut, tmp_path, 5.0, Finished(2, False, 1.0, tmp_path / JUDGE_LOG))
    assert (v.status, info) == ("error", {}) and v.reason.startswith(
        "megatron-lm's tests timed out after 5s: nothing was judged (from its records: megatron-lm: no launch left "
        "records in out/megatron-lm); last line: "), v.reason


def test_a_run_killed_by_a_signal_or_without_an_exit_status_fails_whatever_it_left():
    """Every gate holds and every marker is there, but the process died of a signal (a negative exit status:
    the OOM killer's -9) or left no exit status at all: failed, by its exit status."""
    for rc in (-9, -11, None):
        v = fn(good(), rc=rc)
        assert v.status == "failed" and v.reason.startswith(f"exited {rc}"), (rc, v)


def test_a_timed_out_run_fails_though_its_log_and_metrics_look_whole():
    """A run cut at its time limit fails as timed out, even when what it wrote so far passes every gate
    and shows every marker, and even when the launcher saw exit status 0."""
    for rc in (0, None, -9):
        v = judge(rc=rc, timed_out=True, text=GOOD_LOG, metrics=good(), gates=[parse_gate(TMPE)], markers=MARKERS,
                  timeout_s=60)
        assert v.status == "failed" and v.reason.startswith("timed out after 60s"), (rc, v)


def test_a_fail_line_in_the_tests_own_log_fails_the_run():
    """The script's FAIL: line may reach only its own log (run.log), not the console: it fails the run all
    the same, exit 0 and every marker notwithstanding."""
    console = "launching the functional script\n"
    own = GOOD_LOG + "FAIL: token_mult_prob_error 1.2 is above 1.05\n"
    v = fn(good(), log=console, marker_text=own)
    assert v.status == "failed" and "the run printed FAIL: token_mult_prob_error 1.2" in v.reason, v
    assert fn(good(), log=console, marker_text=GOOD_LOG).status == "passed"


def test_a_changed_value_is_no_repeat():
    """Only a value equal to the last bit to the previous run's is flagged: one that moved is not."""
    from carry.nightly.judge import deterministic_flags
    prev = {"run_id": "n0", "metrics": {"x": 1.0204, "z": 0.5}}
    assert deterministic_flags({"x": 1.0205, "z": 0.5}, prev, ["x", "z"]) == [
        "deterministic: z = 0.5 repeats bit-identically (run n0)"]
    assert deterministic_flags({"x": 1.0205, "z": 0.25}, prev, ["x", "z"]) == []


def test_a_skip_line_beside_unreadable_metrics_is_no_skip():
    """The guard's SKIP: line with exit 0, but the run left a metrics file that cannot be read: it ran and
    broke, so it fails (a skip would hide it)."""
    problem = "metrics.json is not a readable JSON object"
    v = fn({}, log=WRAPPER_SKIP, metrics_problem=problem)
    assert v.status == "failed" and problem in v.reason and "its SKIP: line does not count" in v.reason, v
    assert fn({}, log=WRAPPER_SKIP).status == "skipped"
