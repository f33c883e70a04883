"""tools/nightly.py end to end on real runs: a demo series on a real git upstream, real
proofs, real commands, the real functional-test wrapper driving a small real shell script
laid out like a NeMo-RL functional test, the real mini GTP test (which skips here: no CUDA),
and, with the pinned megatron-core, the real capability guard.

What is judged is what the runs printed and wrote; nothing is handed to the judge ready-made.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from carry.nightly.judge import judge, numeric_metrics, parse_gate
from carry.nightly.runlog import result_line
from helpers import MINI, ROOT, SERIES, mini_test_module, proofs_matrix, read_json, read_recorded, tool
from fakeup import add_proofs
from fakeup import GOOD, GPU, MISSING_DEPENDENCY, REGRESS, SITE_PROOF, VACUOUS

MARK_GTP = "[gtp] enabling GTP weight rematerialization"
MARK_RESHARD = "[colocated-reshard] building dedicated inference model"
GPU_LOGS = ROOT / "integration" / "gtp_refit_mini" / "h200"

# Laid out like NeMo-RL's tests/functional/grpo_megatron_generation*.sh: tee run.log into
# tests/functional/<name>/, write metrics.json the way tests/json_dump_tb_logs.py does
# ({metric: {step: value}}, indent 2). FAKE_MODE picks how it behaves. In "gate" mode it
# exits 0 although the metric is too high, as a script that forgets its gate would.
FUNCTIONAL_SCRIPT = r'''#!/bin/bash
SCRIPT_DIR=$( cd -- "$( dirname -- "${BASH_SOURCE[0]}" )" &> /dev/null && pwd)
EXP_NAME=$(basename $0 .sh)
EXP_DIR=$SCRIPT_DIR/$EXP_NAME
RUN_LOG=$EXP_DIR/run.log
set -eou pipefail
rm -rf $EXP_DIR
mkdir -p $EXP_DIR
mode=${FAKE_MODE:?}
{
  if [[ $mode == quoted ]]; then
    echo "ERROR: never saw '[gtp] enabling GTP weight rematerialization (gtp_remat_size=2)'"
    echo "ERROR: never saw '[colocated-reshard] building dedicated inference model'"
  else
    echo "[gtp] enabling GTP weight rematerialization (gtp_remat_size=2 expert_gtp_remat_size=1)"
  fi
  if [[ $mode != vacuous && $mode != quoted ]]; then
    echo "[colocated-reshard] building dedicated inference model (inference TP=1 PP=1 EP=1 CP=1 impl=None)"
  fi
  echo "step 1/2 done"
} 2>&1 | tee $RUN_LOG
if [[ $mode == bug || $mode == bug0 ]]; then
  echo "BUG_HIT: mlm-tied-weight-guard: supplied weight's shape is (256, 128), not (512, 128)" | tee -a $RUN_LOG
  if [[ $mode == bug ]]; then exit 1; fi
fi
if [[ $mode == hang ]]; then
  echo "waiting on a collective that never completes"
  sleep 600
fi
err=1.0125
if [[ $mode == gate ]]; then err=1.2; fi
if [[ $mode == nan ]]; then err=nan; fi
python3 - "$EXP_DIR/metrics.json" "$err" <<'PY'
import json, sys
data = {"train/token_mult_prob_error": {"1": 1.003, "2": float(sys.argv[2])},
        "train/loss": {"1": 0.61, "2": 0.58}}
with open(sys.argv[1], "w") as f:
    json.dump(data, f, indent=2)
PY
'''
# This machine has no TransformerEngine, so megatron-core's HAVE_GTP is False here. For the
# cells that must get past the capability guard, the guard's question is answered by this
# stand-in; the real answer (False -> SKIP) is exercised in test_real_capability_guard_and_mini.
HAVE_GTP_TRUE = 'echo "megatron.core from (stand-in: no TransformerEngine here)"; echo "HAVE_GTP True"\n'

# A command whose result depends on the trees: the 'threeway' patch changes beta.value_10.
BETA_OK = "import megatron.core.beta as b; assert b.value_10 == 10, b.value_10; print('beta.value_10 is 10')"
CMD_BETA = ["{python}", "-c", BETA_OK]


def _toml_list(items) -> str:
    return "[" + ", ".join(json.dumps(x) for x in items) + "]"


def functional_test(name: str, mode: str, probe: str, timeout: int = 120) -> str:
    return f'''
[[tests]]
name = "{name}"
kind = "functional"
images = ["nrl-here"]
script = "tests/functional/grpo_fake_gtp.sh"
env = {{ FAKE_MODE = "{mode}", CARRY_GTP_PROBE = "{probe}", CARRY_FUNCTIONAL_RUNNER = "bash" }}
gates = ['max(data["train/token_mult_prob_error"]) < 1.05']
markers = {_toml_list([MARK_GTP, MARK_RESHARD])}
timeout_s = {timeout}
'''


@pytest.fixture
def night(demo, tmp_path):
    """The demo series with proofs, a NeMo-RL-shaped checkout, and a matrix over both."""
    sdir = demo["series"]
    add_proofs(sdir, {"good": GOOD, "vacuous": VACUOUS, "gpu": GPU, "regress": REGRESS},
               {"clean": "good", "threeway": "vacuous", "conflict": "gpu", "upstreamed": "regress"},
               SERIES / "proofs" / "pytest.ini")

    nrl = tmp_path / "nemo-rl"
    script = nrl / "tests" / "functional" / "grpo_fake_gtp.sh"
    script.parent.mkdir(parents=True)
    script.write_text(FUNCTIONAL_SCRIPT)
    script.chmod(0o755)
    probe = tmp_path / "have_gtp_true.sh"
    probe.write_text(HAVE_GTP_TRUE)
    stand_in = f"bash {probe}"

    config = tmp_path / "nightly.toml"
    config.write_text(f'''
[nightly]
series = [{json.dumps(str(sdir))}]
timeout_s = 300

[images.host]
launcher = "local"

[images.nrl-here]
launcher = "local"
workdir = {json.dumps(str(nrl))}

[[tests]]
name = "proofs"
kind = "proof"
images = ["host"]
timeout_s = 120

[[tests]]
name = "beta-unchanged"
kind = "command"
images = ["host"]
argv = {_toml_list(CMD_BETA)}
env = {{ PYTHONPATH = "{{tree:megatron-lm}}" }}
markers = ["beta.value_10 is 10"]
timeout_s = 120

[[tests]]
name = "mini"
kind = "command"
images = ["host"]
argv = {_toml_list(["{python}", str(MINI), "--nproc", "2", "--backend", "gloo", "--seed", "{seed}", "--out", "{out}"])}
env = {{ PYTHONPATH = "{{tree:megatron-lm}}" }}
metrics = "result-line"
gates = ['max(data["token_mult_prob_error"]) < 1.05']
markers = {_toml_list([MARK_GTP, MARK_RESHARD])}
timeout_s = 120
''' + functional_test("fn-pass", "pass", stand_in)
        + functional_test("fn-vacuous", "vacuous", stand_in)
        + functional_test("fn-gate", "gate", stand_in)
        + functional_test("fn-bug", "bug", stand_in)
        + functional_test("fn-hang", "hang", stand_in, timeout=4)
        + functional_test("fn-nan", "nan", stand_in)
        + functional_test("fn-quoted", "quoted", stand_in)
        + functional_test("fn-bug0", "bug0", stand_in)
        + functional_test("fn-probe-broken", "pass", "false"))
    return dict(demo, config=config, nrl=nrl)


def nightly(d, out: Path, *extra: str, check: int | None = None):
    return tool("nightly", "--config", d["config"], "--out", out, "--workdir", d["tmp"] / "nwork",
                "--cache", d["cache"], "--source", f"megatron-lm={d['up']}", "--history", d["tmp"] / "history.jsonl",
                *extra, check=check, timeout=600)


def by_test(out: Path) -> dict[str, dict]:
    return {r["test"]: r for r in read_json(out / "nightly.json")["runs"]}


def test_the_matrix_judged_bisected_and_reported(night):
    out = night["tmp"] / "n1"
    t0 = time.monotonic()
    res = nightly(night, out, "--run-id", "night-1", check=1)
    runs = by_test(out)

    # proofs: red/green -> passed; green on pristine -> vacuous; GPU-only -> skipped, never passed
    assert runs["proofs[clean]"]["status"] == "passed", runs["proofs[clean]"]
    assert runs["proofs[threeway]"]["status"] == "vacuous"
    assert "pristine" in runs["proofs[threeway]"]["reason"]
    assert runs["proofs[conflict]"]["status"] == "skipped"
    assert "needs a CUDA GPU" in runs["proofs[conflict]"]["reason"]

    # a proof that patch 1 breaks: failed, and bisection names patch 1
    reg = runs["proofs[upstreamed]"]
    assert reg["status"] == "failed" and "value_5" in reg["reason"]
    assert reg["bisect"]["first_patch"] == "clean" and reg["bisect"]["first_index"] == 1
    assert [p["k"] for p in reg["bisect"]["probes"]][0] == 0

    # a command that patch 2 breaks: bisection reruns it on prefixes and names patch 2
    beta = runs["beta-unchanged"]
    assert beta["status"] == "failed" and "AssertionError" in beta["reason"]
    b = beta["bisect"]
    assert b["changed"] is True and b["first_patch"] == "threeway" and b["first_index"] == 2
    probes = {p["k"]: p for p in b["probes"]}
    assert probes[0]["status"] == "passed" and probes[2]["status"] == "failed"
    assert "threeway" in b["note"]

    # the mini GTP test, really run: no CUDA here -> its own SKIP line -> skipped
    mini = runs["mini"]
    assert mini["status"] == "skipped", mini
    assert "no CUDA device" in mini["reason"]
    assert "--seed" in mini["command"] and str(read_json(out / "nightly.json")["seed"]) in mini["command"]

    # the functional wrapper on a NeMo-RL-shaped script
    ok = runs["fn-pass"]
    assert ok["status"] == "passed", ok
    assert ok["metrics"]["train/token_mult_prob_error"] == 1.0125
    assert {"run.log", "metrics.json", "exit_status", "probe.log", "console.log"} <= set(ok["artifacts"])
    assert all(ok["markers"].values())
    vac = runs["fn-vacuous"]
    assert vac["status"] == "vacuous" and MARK_RESHARD in vac["reason"]
    gate = runs["fn-gate"]
    assert gate["status"] == "failed" and "1.2" in gate["reason"], gate
    assert "not bisected" in gate["bisect"]["note"]  # its image does not swap trees in
    bug = runs["fn-bug"]
    assert bug["status"] == "failed" and bug["bug"] == "mlm-tied-weight-guard"
    assert "BUG_HIT mlm-tied-weight-guard" in bug["reason"]
    hang = runs["fn-hang"]
    assert hang["status"] == "failed" and hang["timed_out"] is True
    assert "timed out after 4s" in hang["reason"]
    assert any("never completes" in line for line in hang["tail"])
    broken = runs["fn-probe-broken"]
    assert broken["status"] == "failed" and "probe" in " ".join(broken["tail"])
    assert time.monotonic() - t0 < 400, "the hung run was not cut off"

    # reports
    suite = ET.parse(out / "junit.xml").getroot()
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert len(cases) == len(runs) == int(suite.get("tests"))
    assert cases["fn-pass"].find("failure") is None and cases["fn-pass"].find("skipped") is None
    assert cases["fn-vacuous"].find("failure").get("type") == "vacuous"
    assert cases["mini"].find("skipped") is not None
    assert "clean" in cases["proofs[upstreamed]"].find("failure").text
    md = (out / "summary.md").read_text()
    assert md.startswith("# Nightly night-1: FAILED")
    assert "| demo | nrl-here | fn-vacuous | VACUOUS |" in md and "| demo | host | mini | skipped |" in md
    assert "## Bisection" in md and "threeway" in md
    cell = read_json(out / "cells" / ok["cell"] / "run.json")
    assert cell["status"] == "passed" and cell["run_id"] == "night-1"
    assert "bisect: demo--host--beta-unchanged:" in res.stdout
    hist = [json.loads(x) for x in (night["tmp"] / "history.jsonl").read_text().splitlines()]
    assert len(hist) == len(runs) and {h["run_id"] for h in hist} == {"night-1"}


def test_history_flags_a_metric_that_repeats_bit_identically(night):
    common = ("--tests", "fn-pass,fn-gate", "--no-bisect")
    nightly(night, night["tmp"] / "a", "--run-id", "night-a", *common, check=1)
    res = nightly(night, night["tmp"] / "b", "--run-id", "night-b", *common, check=1)
    runs = by_test(night["tmp"] / "b")
    flags = runs["fn-pass"]["flags"]
    assert any("train/token_mult_prob_error" in f and "night-a" in f for f in flags), flags
    assert runs["fn-pass"]["status"] == "passed"  # a flag, not a verdict
    assert "deterministic" in res.stdout and "## Flags" in (night["tmp"] / "b" / "summary.md").read_text()
    hist = [json.loads(x) for x in (night["tmp"] / "history.jsonl").read_text().splitlines()]
    assert [h["run_id"] for h in hist].count("night-b") == 2 and len(hist) == 4
    # Only watched metrics count: train/loss repeats too but is neither gated nor watched here.
    assert not any("train/loss" in f for f in flags)


def test_bad_matrix_is_a_usage_error(night, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(night["config"].read_text().replace('kind = "command"', 'knd = "command"', 1))
    res = tool("nightly", "--config", bad, "--out", tmp_path / "o", check=2)
    assert "unknown key 'knd'" in res.stderr and "kind" in res.stderr
    bad.write_text(night["config"].read_text().replace("< 1.05", "is small", 1))
    res = tool("nightly", "--config", bad, "--out", tmp_path / "o", check=2)
    assert "gate" in res.stderr


def test_print_commands_docker_and_srun(tmp_path):
    """The shipped matrix: the command lines the README documents, without running anything."""
    env = {"GTP_TE219_SQUASHFS": str(tmp_path / "gtp-te219.sqsh")}
    res = tool("nightly", "--out", tmp_path / "o", "--print-commands", "--tests", "grpo-megatron-generation-gtp",
               env=env, check=0)
    line = next(x for x in res.stdout.splitlines() if x.startswith("docker run"))
    assert "--gpus all" in line and "gtp-te219:latest" in line
    assert "integration/nemo_rl_gtp/run-in-image.sh tests/functional/grpo_megatron_generation_gtp.sh /carry/out" in line
    assert "-e CARRY_NEMO_RL_ROOT=/opt/nemo-rl" in line and "/carry/trees/megatron-lm" in line
    res = tool("nightly", "--out", tmp_path / "o", "--print-commands", "--launcher", "slurm",
               "--tests", "grpo-megatron-generation-gtp", env=env, check=0)
    line = next(x for x in res.stdout.splitlines() if x.startswith("srun"))
    assert f"--container-image={tmp_path / 'gtp-te219.sqsh'}" in line and "--gpus=2" in line
    assert "--container-mounts=" in line and "--time=91" in line
    # A cell that needs no container: a plain job step, its id printed first (carry.nightly.slurm).
    res = tool("nightly", "--out", tmp_path / "o", "--print-commands", "--launcher", "slurm",
               "--tests", "gtp-refit-mini-gloo", env=env, check=0)
    line = next(x for x in res.stdout.splitlines() if " srun " in x)
    assert line.startswith(f"cd {ROOT} && PYTHONPATH=") and "--job-name=gtp--host--gtp-refit-mini-gloo" in line
    assert "--time=21 " in line and "--gpus=1 " in line and "--container-image" not in line
    assert "[carry] slurm step ${SLURM_JOB_ID}.${SLURM_STEP_ID} on" in line and "integration/gtp_refit_mini/run.py" in line
    # So are the proofs (each run: the proof's pytest) and the upstream-tests cells (tools/upstream_tests.py).
    res = tool("nightly", "--out", tmp_path / "o", "--print-commands", "--launcher", "slurm",
               "--tests", "proofs,upstream-tests", env=env, check=0)
    cells = [x for x in res.stdout.splitlines() if x.startswith("# ")]
    steps = [x for x in res.stdout.splitlines() if " srun --nodes=1 --ntasks=1 --job-name=gtp--host--" in x]
    assert len(steps) == len(cells) > 3, res.stdout
    proofs = [x for x in steps if " -m pytest " in x]
    assert len(proofs) == len(steps) - 3 and all("CARRY_PROOF_PARENT=launcher " in x for x in proofs), proofs
    assert " --time=16 " in proofs[0] and " --junitxml=" in proofs[0] and " -p carry_proof_plugin " in proofs[0]
    ups = [x for x in steps if "/tools/upstream_tests.py " in x]
    assert [x.split(" --only ")[1].split()[0] for x in ups] == ["megatron-lm", "megatron-bridge", "nemo-rl"], ups
    assert all(" --time=121 " in x and " --budget 2880 " in x for x in ups), ups
    # Without the squashfs variable, srun cannot be planned: a usage error naming the variable.
    res = tool("nightly", "--out", tmp_path / "o", "--print-commands", "--launcher", "slurm",
               "--tests", "grpo-megatron-generation-gtp", env={"GTP_TE219_SQUASHFS": ""}, check=2)
    assert "GTP_TE219_SQUASHFS" in res.stderr


@pytest.mark.network
def test_real_capability_guard_and_mini(tmp_path, pin_cache):
    """The pinned megatron-core, really imported: HAVE_GTP is False without TransformerEngine, so
    the functional wrapper's guard prints its SKIP line (judged skipped), and the mini test's
    --dry-check finds every API it uses."""
    sdir = tmp_path / "patches" / "pins"
    sdir.mkdir(parents=True)
    # The real pins' [series] and megatron-core tables, no patches (NeMo-RL needs a network fetch).
    text = (SERIES / "series.toml").read_text().split("\n[upstreams.megatron-bridge]")[0]
    text = text.replace('name = "gtp"', 'name = "pins"')
    (sdir / "series.toml").write_text(text)
    nrl = tmp_path / "nemo-rl"
    (nrl / "tests" / "functional").mkdir(parents=True)
    (nrl / "tests" / "functional" / "grpo_fake_gtp.sh").write_text(FUNCTIONAL_SCRIPT)
    config = tmp_path / "nightly.toml"
    config.write_text(f'''
[nightly]
series = [{json.dumps(str(sdir))}]

[images.host]
launcher = "local"

[images.nrl-here]
launcher = "local"
workdir = {json.dumps(str(nrl))}
pythonpath = ["megatron-lm"]

{functional_test("guard", "pass", "{python}", timeout=300)}
[[tests]]
name = "mini-dry-check"
kind = "command"
images = ["host"]
argv = {_toml_list(["{python}", str(MINI), "--dry-check"])}
env = {{ PYTHONPATH = "{{tree:megatron-lm}}" }}
metrics = "result-line"
gates = ['len(data["problems"]) == 0']
timeout_s = 300
''')
    out = tmp_path / "out"
    tool("nightly", "--config", config, "--out", out, "--workdir", tmp_path / "w", "--cache", pin_cache,
         "--series", str(sdir), "--run-id", "pins", check=0, timeout=900)
    runs = by_test(out)
    guard = runs["guard"]
    assert guard["status"] == "skipped", guard
    assert "HAVE_GTP is not True" in guard["reason"] and "grpo_fake_gtp.sh" in guard["reason"]
    assert "metrics.json" not in guard["artifacts"]  # the test itself never ran
    probe_log = (out / "cells" / guard["cell"] / "artifacts" / "probe.log").read_text()
    assert "HAVE_GTP False" in probe_log and str(tmp_path / "w") in probe_log  # our tree answered
    dry = runs["mini-dry-check"]
    assert dry["status"] == "passed", dry
    doc = result_line((out / "cells" / dry["cell"] / "artifacts" / "console.log").read_text())
    assert doc["dry_check"] is True and doc["ok"] is True and doc["problems"] == []
    assert doc["have_gtp"] is False and doc["cuda"] is False


def test_mini_rejects_bad_arguments():
    import subprocess
    res = subprocess.run([sys.executable, str(MINI), "--nproc", "3"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "multiple of --gtp" in res.stderr


def test_judge_reads_the_gates_as_nemo_rl_writes_them():
    g = parse_gate('max(data["train/token_mult_prob_error"]) < 1.05')
    assert (g.agg, g.key, g.op, g.threshold) == ("max", "train/token_mult_prob_error", "<", 1.05)
    v = judge(rc=0, timed_out=False, text=f"{MARK_GTP}\n", metrics={"x": {"1": 1.0}}, gates=[g],
              markers=[MARK_GTP])
    assert v.status == "failed" and "missing" in v.reason  # a gated metric that is absent never passes
    line = '{"token_mult_prob_error": 1.0001, "ok": true, "per_rank": [1, 2]}'
    assert numeric_metrics(result_line(f"noise\n{line}\n")) == {"token_mult_prob_error": 1.0001}


def _gpu_runs() -> list[dict]:
    # Committed with the series: a missing index is a failure, never a skip.
    return json.loads((GPU_LOGS / "runs.json").read_text())["runs"]


def test_judge_on_committed_gpu_logs_of_the_mini_test():
    """The mini test's standard output from H200s (integration/gtp_refit_mini/h200/, recorded as
    run), judged with the markers of the nightly cell it was recorded for (and the gates of its
    day where runs.json lists them): the full series passes with both markers and an exact refit;
    the pristine tree and a series without a patch fail naming a series patch they lack; a bug the
    series does not fix fails on a gate, with no patch named."""
    from carry.nightly.judge import parse_gate
    from carry.series.manifest import load
    from carry.nightly.config import load as load_matrix

    cells = {t.name: t for t in load_matrix(ROOT / "integration" / "nightly.toml").tests}
    ids = {p.id for p in load(SERIES).patches}
    seen = set()
    for run in _gpu_runs():
        spec = cells[run["cell"]]
        gates = [parse_gate(g) for g in run["gates"]] if "gates" in run else spec.gates
        text = (GPU_LOGS / run["file"]).read_text()
        v = judge(rc=run["exit_status"], timed_out=False, text=text, metrics=result_line(text),
                  gates=gates, markers=spec.markers, step_markers=spec.step_markers, metrics_source=spec.metrics)
        applied = set(run["patches"])
        expect = run["expect"]
        if expect == "passed" and spec.name.startswith("gtp-refit-mini-moe"):
            assert v.status == "passed", (run["file"], v)
            assert v.metrics["expert_gtp_sharded_params"] > 0 and v.metrics["refit_expert_gathered"] > 0
            assert v.metrics["ckpt_tensors_checked"] > 0 and v.metrics.get("inference_gtp_sharded_params", 0) == 0
        elif expect == "passed":
            assert v.status == "passed", (run["file"], v)
            # An exact refit: fp32 log-probs agree to float noise; bf16 ones within NeMo-RL's gate.
            exact = (result_line(text) or {}).get("dtype", "fp32") == "fp32"
            assert 1.0 <= v.metrics["token_mult_prob_error"] < (1.0001 if exact else 1.05)
            assert v.metrics["gtp_sharded_params"] > 0 and v.metrics.get("inference_gtp_sharded_params", 0) == 0
            assert v.metrics["grad_norm"] > 0
        elif expect.startswith("failed:"):
            bug = expect.split(":", 1)[1]
            assert bug in ids and bug not in applied, run
            assert (v.status, v.bug) == ("failed", bug), (run["file"], v)
        else:
            assert expect == "failed" and run["why"], run
            assert v.status == "failed" and v.bug is None, (run["file"], v)
        seen.add(expect.split(":")[0])
    assert seen == {"passed", "failed"}


def test_mini_shape_names_the_target_and_flags_still_win():
    """--shape qwen2.5-0.5b is the series' target shape (what the cost cell runs); a size flag
    given beside it wins."""
    with mini_test_module("mini_run") as mini:
        pass  # parse_args needs nothing the module's siblings hold
    s, _ = mini.parse_args(["--nproc", "2", "--shape", "qwen2.5-0.5b"])
    assert (s.vocab, s.hidden, s.layers, s.heads, s.query_groups, s.ffn) == (151936, 896, 24, 14, 2, 4864)
    s, _ = mini.parse_args(["--shape", "qwen2.5-0.5b", "--layers", "2"])
    assert (s.layers, s.hidden) == (2, 896)
    assert mini.parse_args([])[0].vocab == 512  # no shape: the tiny default
    from carry.nightly.config import load as load_matrix

    cost = next(t for t in load_matrix(ROOT / "integration" / "nightly.toml").tests if t.name == "gtp-refit-mini-cost")
    assert "--shape" in cost.argv and cost.argv[cost.argv.index("--shape") + 1] == "qwen2.5-0.5b"


def test_a_corrupt_history_line_is_reported_and_skipped(night):
    """A history file that a killed run, a bad merge or a disk error left corrupt: each bad line is
    named (file and line number) and skipped, the good ones still count, and the night's verdicts,
    nightly.json and the history line are written all the same."""
    hist = night["tmp"] / "history.jsonl"
    cell = "demo--nrl-here--fn-pass"
    good = {"run_id": "night-0", "cell": cell, "status": "passed",
            "metrics": {"train/token_mult_prob_error": 1.0125}}
    hist.write_bytes(b"[1, 2]\n" + b"42\n" + b'{"cell": "' + cell.encode() + b'", "metr\n'
                     + b"\x00\x01\x02\x7f binary\n" + b'{"cell": "caf\xe9"}\n'
                     + b'{"cell": "' + cell.encode() + b'", "run_id": "night-x", "metrics": [1, 2]}\n'
                     + json.dumps(good).encode() + b"\n" + b'{"cell": "torn last line, no newline')
    res = nightly(night, night["tmp"] / "c", "--run-id", "night-c", "--tests", "fn-pass", "--no-bisect", check=0)
    for n, what in [(1, "not a JSON object"), (2, "not a JSON object"), (3, "not valid JSON"), (4, "not valid JSON"),
                    (5, "not UTF-8"), (6, "metrics"), (8, "not valid JSON")]:
        assert f"warning: {hist}:{n}: " in res.stderr and what in res.stderr.split(f"{hist}:{n}: ")[1].splitlines()[0], \
            (n, res.stderr)
    doc = read_json(night["tmp"] / "c" / "nightly.json")
    run = doc["runs"][0]
    assert run["status"] == "passed", run
    assert len(doc["history_warnings"]) == 7 and f"{hist.name}:1" in (night["tmp"] / "c" / "summary.md").read_text()
    # The good line still counts: tonight's value repeats night-0's bit for bit.
    assert any("night-0" in f for f in run["flags"]), run["flags"]
    # Tonight's record is a line of its own, not glued to the torn one.
    last = hist.read_bytes().splitlines()[-1]
    assert json.loads(last)["run_id"] == "night-c"


def test_hostile_runs_fail_through_the_nightly_with_their_reason_in_the_summary(night):
    """Section 2's hostile functional runs, really run by tools/nightly.py: each exits 0 and each
    must not pass; the summary row says why."""
    out = night["tmp"] / "h"
    nightly(night, out, "--run-id", "night-h", "--tests", "fn-nan,fn-quoted,fn-bug0", "--no-bisect", check=1)
    runs = by_test(out)
    md = (out / "summary.md").read_text()
    nan = runs["fn-nan"]
    assert nan["status"] == "failed", nan
    why = 'gate max(data["train/token_mult_prob_error"]) < 1.05: train/token_mult_prob_error is NaN at step 2'
    assert nan["reason"] == why
    assert why.replace("|", "\\|") in md
    quoted = runs["fn-quoted"]
    assert quoted["status"] == "vacuous" and not any(quoted["markers"].values()), quoted
    assert "| fn-quoted | VACUOUS |" in md and "passed without its marker(s)" in md
    bug0 = runs["fn-bug0"]
    assert (bug0["status"], bug0["bug"], bug0["returncode"]) == ("failed", "mlm-tied-weight-guard", 0), bug0
    assert "BUG_HIT mlm-tied-weight-guard: supplied weight's shape is (256, 128), not (512, 128) (it exited 0)" in md
    # The files stay strict JSON (jq, a browser, a dashboard): a NaN metric is written as the
    # string "NaN", not as a NaN token that only Python reads.
    def strict(text):
        return json.loads(text, parse_constant=lambda token: pytest.fail(f"non-JSON token {token}"))

    doc = strict((out / "nightly.json").read_text())
    (nan_run,) = [r for r in doc["runs"] if r["test"] == "fn-nan"]
    assert "NaN" in json.dumps(nan_run["metrics"]), nan_run["metrics"]
    cells = list((out / "cells").glob("*/run.json"))
    assert len(cells) == len(doc["runs"]), cells
    for run_json in cells:
        strict(run_json.read_text())
    for line in (night["tmp"] / "history.jsonl").read_text().splitlines():
        strict(line)


def test_proof_cells_with_the_te_site_and_an_environment_error(demo, tmp_path, monkeypatch):
    """--te-site reaches the proofs cell and the command cells; a proof that cannot import its
    dependency is an ``error`` of the environment: named so, never bisected, and not green.
    The proof cells' runs go three at a time (forced), and the command cell after them still
    runs alone, on its own."""
    monkeypatch.setenv("CARRY_PROOF_JOBS", "3")
    site = tmp_path / "te-site"
    site.mkdir()
    add_proofs(demo["series"], {"site": SITE_PROOF.format(site=str(site.resolve())), "dep": MISSING_DEPENDENCY},
               {"clean": "site", "threeway": "dep"}, SERIES / "proofs" / "pytest.ini")
    check = ["{python}", "-c", f"import sys; assert {str(site.resolve())!r} in sys.path, sys.path; print('site on path')"]
    config = tmp_path / "nightly.toml"
    config.write_text(proofs_matrix(str(demo["series"]), patches=["clean", "threeway"]) + f'''
[[tests]]
name = "site-on-path"
kind = "command"
images = ["host"]
argv = {_toml_list(check)}
env = {{ PYTHONPATH = "{{tree:megatron-lm}}:${{CARRY_TE_SITE:-}}" }}
markers = ["site on path"]
''')
    d = dict(demo, config=config)
    out = tmp_path / "n"
    res = nightly(d, out, "--te-site", site, check=1)
    runs = by_test(out)
    assert runs["proofs[clean]"]["status"] == "passed", runs["proofs[clean]"]
    assert runs["site-on-path"]["status"] == "passed", runs["site-on-path"]
    dep = runs["proofs[threeway]"]
    assert dep["status"] == "error" and "carry_test_no_such_dependency" in dep["reason"], dep
    assert "bisect" not in dep, "an environment error is not bisected"
    suite = ET.parse(out / "junit.xml").getroot()
    assert suite.get("errors") == "1"
    assert "| demo | host | proofs[threeway] | ERROR |" in (out / "summary.md").read_text()
    assert "ERROR" not in res.stdout.split("proofs[clean]")[1].splitlines()[0]
    # Without it, the command cell does not see the site.
    nightly(d, tmp_path / "n2", "--tests", "site-on-path", "--no-bisect", check=1)
    assert by_test(tmp_path / "n2")["site-on-path"]["status"] == "failed"


# A run that leaves a hostile output (issue 32, item 7): MODE picks what. Every cell gates x.
HOSTILE_CELL = r'''
import json, os, sys
mode, out = sys.argv[1], sys.argv[2]
m = os.path.join(out, "metrics.json")
good = {"x": {"1": 1.0, "2": 1.0}}
if mode == "good":
    json.dump(good, open(m, "w"))
elif mode == "dir":
    os.mkdir(m)
elif mode == "deep":
    open(m, "w").write('{"x": ' + "[" * 200000 + "]" * 200000 + "}")
elif mode == "deep-line":
    print("{" + '"a": {' * 200000 + "}" * 200000 + "}")
elif mode == "not-utf8":
    open(m, "wb").write(b'{"x": {"1": 1.0}, "note": "\xff\xfe"}')
elif mode == "zero-link":
    os.symlink("/dev/zero", m)
elif mode == "out-link":
    json.dump(good, open(os.path.join(out, "..", "elsewhere.json"), "w"))
    os.symlink(os.path.join(out, "..", "elsewhere.json"), m)
elif mode == "fifo":
    os.mkfifo(m)
elif mode == "huge":
    with open(m, "wb") as f:
        f.truncate(65 * 1024 * 1024)  # sparse: past the nightly's bound without the disk
elif mode == "digits":
    open(m, "w").write('{"x": {"1": ' + "9" * 5000 + "}}")
elif mode == "log-dir":
    json.dump(good, open(m, "w"))
    os.unlink(os.path.join(out, "console.log"))
    os.mkdir(os.path.join(out, "console.log"))
elif mode == "runlog-fifo":
    json.dump(good, open(m, "w"))
    os.mkfifo(os.path.join(out, "run.log"))
elif mode == "deep-tree":
    json.dump(good, open(m, "w"))
    d = out
    for _ in range(1500):
        d = os.path.join(d, "d")
        os.mkdir(d)
'''
HOSTILE_MODES = ("dir", "deep", "deep-line", "not-utf8", "zero-link", "out-link", "fifo", "huge", "digits", "log-dir",
                 "runlog-fifo")


def test_no_cell_output_stops_the_night(demo, tmp_path):
    """Issue 32, item 7: each hostile output fails its own cell, named, and the night goes on:
    nightly.json, the summary and the history are written, the good cells after them pass. A
    run folder nested 1500 deep is listed without recursion."""
    script = tmp_path / "hostile.py"
    script.write_text(HOSTILE_CELL)
    body = proofs_matrix(str(demo["series"]), timeout_s=120)
    modes = HOSTILE_MODES + ("good", "deep-tree")
    for mode in modes:
        metrics = "result-line" if mode == "deep-line" else "file:metrics.json"
        body += f'''
[[tests]]
name = "c-{mode}"
kind = "command"
images = ["host"]
argv = ["{{python}}", {json.dumps(str(script))}, "{mode}", "{{out}}"]
metrics = "{metrics}"
gates = ['max(data["x"]) < 2']
timeout_s = 60
'''
    config = tmp_path / "nightly.toml"
    config.write_text(body)
    out = tmp_path / "n"
    res = tool("nightly", "--config", config, "--out", out, "--workdir", tmp_path / "nwork", "--cache", demo["cache"],
               "--source", f"megatron-lm={demo['up']}", "--history", tmp_path / "h.jsonl", "--no-bisect",
               "--tests", ",".join(f"c-{m}" for m in modes), timeout=300)
    try:
        _night_went_on(res, out, tmp_path, modes)
    finally:
        for deep in (out / "cells").glob("*c-deep-tree/artifacts/d"):
            _remove_deep(deep)


def _night_went_on(res, out: Path, tmp_path: Path, modes: tuple[str, ...]) -> None:
    assert res.returncode == 1, (res.returncode, res.stdout[-3000:], res.stderr[-3000:])
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    runs = by_test(out)
    why = {m: runs[f"c-{m}"]["reason"] for m in HOSTILE_MODES}
    assert {m: runs[f"c-{m}"]["status"] for m in HOSTILE_MODES} == dict.fromkeys(HOSTILE_MODES, "failed"), why
    assert "metrics.json is a directory, not a file" in why["dir"]
    assert "metrics.json is nested too deeply to read" in why["deep"]
    assert "the result line (log line 2) is nested too deeply to read" in why["deep-line"]
    assert "metrics.json is not UTF-8" in why["not-utf8"]
    assert "metrics.json is a symlink, not a file" in why["zero-link"] and "symlink" in why["out-link"]
    assert "metrics.json is a FIFO, not a file" in why["fifo"]
    assert "metrics.json is 68157440 bytes, past the" in why["huge"]
    assert "metrics.json is not valid JSON" in why["digits"]
    assert "console.log is a directory, not a file" in why["log-dir"]
    assert "run.log is a FIFO, not a file" in why["runlog-fifo"]
    assert runs["c-good"]["status"] == "passed", runs["c-good"]
    assert runs["c-deep-tree"]["status"] == "passed", runs["c-deep-tree"]
    assert any(a.endswith("/d/d/d") for a in runs["c-deep-tree"]["artifacts"]) is False  # directories are not files
    assert "metrics.json" in runs["c-deep-tree"]["artifacts"]
    md = (out / "summary.md").read_text()
    assert md.startswith("# Nightly") and "| c-fifo | FAILED |" in md
    assert len((tmp_path / "h.jsonl").read_text().splitlines()) == len(modes)


def _remove_deep(top: Path) -> None:
    """The 1500-deep folder, bottom up (shutil.rmtree, pytest's cleanup too, recurses per level)."""
    chain = [top]
    while (chain[-1] / "d").is_dir():
        chain.append(chain[-1] / "d")
    for d in reversed(chain):
        d.rmdir()


NRL_CASE_LOGS = sorted(p for card in ("h100", "h200") for p in (ROOT / "integration" / card).glob("*/runs.json"))


def _device_merge_as_today(merged: dict, again: dict, log: str) -> dict:
    """The harness series of AGAIN (today's merge) as the device that wrote MERGED computed them. Merges written
    before the swaps past the last step were judged (1aa4d22, 2026-12-05) took the last step's drift from that
    step's own swap, today's from the latest swap: where MERGED's last drift is not today's, it must be the
    last step's own swap's, recomputed here from the log with the later swaps' drift lines left out."""
    import re
    from carry.nightly.runlog import log_lines
    from harness.host import cases as casing
    from harness.host import learning
    mine = {k: v for k, v in again.items() if k.startswith("harness/")}
    steps = sorted(mine.get(learning.CHANGED) or {}, key=int)
    if not steps or merged.get(learning.CHANGED, {}).get(steps[-1]) == mine[learning.CHANGED][steps[-1]]:
        return mine
    drift = re.compile(casing.WEIGHT_CHANGE_LINE)
    own = "\n".join(ln for ln in log_lines(log)
                     if not ((d := drift.fullmatch(ln)) and int(d["step"]) > int(steps[-1])))
    old = learning.harness_metrics(own, steps, 2)
    for key in (learning.DRIFT, learning.CHANGED):
        mine[key] = {**mine[key], steps[-1]: old[key][steps[-1]]}
    return mine


def test_judge_on_committed_gpu_cases_of_the_nemo_rl_harness(tmp_path):
    """NeMo-RL's GRPO cases from the H200 (integration/h200/<day>/runs.json), judged again from their
    files by today's harness: each as its entry expects, a red one red for its own reason (the
    case's red_by), a green learning case with every rank's refit check line at every step."""
    sys.path.insert(0, str(ROOT / "integration" / "nemo_rl_gtp"))
    from harness.host import caserun
    from harness.host import cases as casing

    from harness.host import learning

    assert NRL_CASE_LOGS, "integration/h200/*/runs.json: the committed NeMo-RL case logs are gone"
    seen, by_gain = set(), {}
    for index in NRL_CASE_LOGS:
        for run in json.loads(index.read_text())["runs"]:
            rec = index.parent / run["dir"]
            rc = int((rec / "exit_status").read_text().strip())
            # The case as it ran (its recorded overrides), and every harness series recomputed from the raw
            # files alone (run.log, the script's own metrics), never read from the metrics.json the device merged.
            case = casing.as_recorded(run["case"], json.loads((rec / "case.json").read_text())["args"])
            d = tmp_path / index.parent.name / run["dir"]
            d.mkdir(parents=True)
            raw = rec / "script-metrics.json" if (rec / "script-metrics.json").exists() else rec / "metrics.json"
            shutil.copy2(raw, d / "script-metrics.json")
            for name in ("run.log", "case.log", "exit_status"):
                (d / name).write_text(read_recorded(rec / name))   # from NAME.gz where the evidence gzipped it
            if case.refit_check or case.validation:
                learning.merge_metrics(d, 2, refit=case.refit_check, tensors=learning.model_tensors(case),
                                       last_step=casing.configured_steps(case))
            else:
                shutil.copy2(raw, d / "metrics.json")
            merged = json.loads((rec / "metrics.json").read_text())
            again = json.loads((d / "metrics.json").read_text())
            device = {k: v for k, v in merged.items() if k.startswith("harness/")}
            assert device == _device_merge_as_today(merged, again, read_recorded(rec / "run.log")), \
                (run["dir"], "the device's merge differs")
            got = caserun.summarize(case, d, rc)
            # A run that went against its case's expectation is recorded so (as_expected false), with the one
            # reason it is red: the replay must find that reason and no other.
            assert got["observed"] == run["expect"], (run["dir"], got["reasons"], got["red_by_missing"])
            assert got["as_expected"] is run.get("as_expected", True), (run["dir"], got["reasons"])
            if "red_only_by" in run:   # each named gate failed, and nothing else is a reason
                failed = [f"gate {g}: {got['gates'][g]['detail']}" for g in run["red_only_by"]
                          if not got["gates"][g]["ok"]]
                assert got["reasons"] == failed and len(failed) == len(run["red_only_by"]), (run["dir"], got["reasons"])
            if run["expect"] == "green" and casing.CASES[run["case"]].refit_check:
                assert got["step_markers"]["missing"] == [] and len(got["steps_run"]) >= 4, got
            seen.add((run["case"], run["expect"]))
            # What the learning gate itself showed, and from which pretrain (SIGN_DROP: the gap only reward closes)
            gain = [g for g in got["gates"] if f'data["{casing.GAIN}"]' in g]
            if gain and (rec / "pretrain.json").exists():
                drop = json.loads((rec / "pretrain.json").read_text())["inputs"].get("sign_drop")
                if drop:
                    by_gain[(run["case"], got["gates"][gain[0]]["ok"])] = got["reasons"]
    # Issue 40: the correct run learns with GTP2 and with GTP off, and the sign-flipped loss is red by the
    # learning gate alone, each judged again here from the same (SIGN_DROP) pretrain's runs.
    assert ("learning", True) in by_gain and ("learning-gtp-off", True) in by_gain, sorted(by_gain)
    flip = by_gain.get(("learning-sign-flip", False))
    assert flip is not None and len(flip) == 1 and casing.GAIN in flip[0], (sorted(by_gain), flip)
    assert {("learning", "green"), ("learning-frozen-weights", "red"), ("learning-stale-refit", "red"),
            ("learning-corrupt-tensor", "red"), ("learning-gtp-off", "green"), ("learning-no-cuda-graphs", "green"),
            ("learning-gtp-off-no-cuda-graphs", "green"), ("moe", "green")} <= seen


def test_a_night_whose_every_proof_skipped_is_not_green(demo, tmp_path):
    """Every proof cell skipped (a GPU proof on a host without one): the night proved nothing of the series;
    it is not green (exit 1, nightly.json's ok false) and says why. One proof that ran makes it green again."""
    from helpers import proofs_matrix
    add_proofs(demo["series"], {"gpu": GPU, "good": GOOD}, {"conflict": "gpu", "clean": "good"},
               SERIES / "proofs" / "pytest.ini")

    def night(patches, name, check):
        cfg = tmp_path / f"{name}.toml"
        cfg.write_text(proofs_matrix(str(demo["series"]), patches=patches))
        out = tmp_path / name
        res = tool("nightly", "--config", cfg, "--out", out, "--workdir", tmp_path / f"w-{name}", "--cache",
                   demo["cache"], "--source", f"megatron-lm={demo['up']}", "--no-bisect", "--history",
                   tmp_path / f"{name}.jsonl", check=check)
        return res, read_json(out / "nightly.json")

    res, doc = night(["conflict"], "skipped", 1)
    assert [r["status"] for r in doc["runs"]] == ["skipped"] and doc["all_proofs_skipped"] and doc["ok"] is False
    assert "every proof cell skipped: the night proved nothing" in res.stderr
    res, doc = night(["conflict", "clean"], "one-ran", 0)
    assert sorted(r["status"] for r in doc["runs"]) == ["passed", "skipped"] and doc["ok"] is True


# A proof that must see only the trees the night gives it, and none of the settings of the
# environment the night was started from.
ONLY_ITS_TREES = '''
import os

import megatron.core.alpha as alpha

PRISTINE_FAILS = r"^AssertionError: assert .*'patched'"


def test_value_5_is_patched():
    assert sorted(k for k in os.environ if k.startswith("CARRY_TREE_")) == ["CARRY_TREE_MEGATRON_LM"]
    assert "CARRY_PROOF_FRESH" not in os.environ
    assert alpha.value_5 == "patched"
'''
# A proof whose body waits for good, after saying which process runs it.
WAITS = '''
import os
import time


def test_waits():
    with open(os.environ["CARRY_TEST_PIDS"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(300)
'''


def test_a_proof_cell_is_a_command_that_sees_its_trees_alone_and_dies_with_the_night(demo, tmp_path):
    """A proof cell's run is a command (the proof's pytest) like any cell's, with its command line in
    its record: variables of the night's environment that would hand it another tree or another
    setting are taken out of its environment; and it is tied to the process that launched it, so a
    night killed outright (SIGKILL: nothing of it can clean up) leaves no proof running."""
    import os
    import signal
    import subprocess

    from helpers import TOOLS, process_alive

    add_proofs(demo["series"], {"trees": ONLY_ITS_TREES, "waits": WAITS}, {"clean": "trees", "conflict": "waits"},
               SERIES / "proofs" / "pytest.ini")
    cfg = tmp_path / "trees.toml"
    cfg.write_text(proofs_matrix(str(demo["series"]), patches=["clean"]))
    out = tmp_path / "n"
    env = {"CARRY_TREE_NEMO_RL": str(tmp_path / "another-tree"), "CARRY_PROOF_FRESH": "1"}
    tool("nightly", "--config", cfg, "--out", out, "--workdir", tmp_path / "w", "--cache", demo["cache"],
         "--source", f"megatron-lm={demo['up']}", "--history", tmp_path / "h.jsonl", env=env, check=0)
    (run,) = read_json(out / "nightly.json")["runs"]
    assert run["status"] == "passed", run
    assert " -u CARRY_TREE_NEMO_RL" in run["command"] and " -u CARRY_PROOF_FRESH" in run["command"], run["command"]
    assert " -m pytest " in run["command"] and "megatron_lm/test_trees.py" in run["command"], run["command"]
    assert run["pristine"]["command"] != run["command"] and run["pristine"]["returncode"] == 1, run["pristine"]

    cfg.write_text(proofs_matrix(str(demo["series"]), patches=["conflict"]))
    pids = tmp_path / "pids"
    night = subprocess.Popen([sys.executable, str(TOOLS / "nightly.py"), "--config", str(cfg), "--out",
                              str(tmp_path / "killed"), "--workdir", str(tmp_path / "w"), "--cache", str(demo["cache"]),
                              "--source", f"megatron-lm={demo['up']}", "--history", str(tmp_path / "h.jsonl")],
                             env=dict(os.environ, CARRY_TEST_PIDS=str(pids)), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (not pids.exists() or len(pids.read_text().split()) < 2):
            time.sleep(0.2)
        running = [int(p) for p in pids.read_text().split()]  # the patched and the pristine run, at once
        assert len(running) == 2 and all(process_alive(p) for p in running), running
    finally:
        night.send_signal(signal.SIGKILL)
        night.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(process_alive(p) for p in running):
        time.sleep(0.2)
    assert not [p for p in running if process_alive(p)], "a proof outlived the night that launched it"


def test_a_run_in_another_thread_is_stopped_with_the_night(tmp_path):
    """The proofs' runs go in a pool's threads, where a signal never arrives: a night stopped
    (carry.nightly.stop) ends them with runner.kill_groups(), as it ends every run(group=True)."""
    import threading

    from carry.nightly.launch import local_plan, run_logged
    from carry.runner import kill_groups

    done = {}
    plan = local_plan(argv=["sleep", "300"], env={}, cwd=None)
    t = threading.Thread(target=lambda: done.update(fin=run_logged(plan, tmp_path / "console.log", timeout=240)))
    t.start()
    deadline = time.monotonic() + 30
    killed = 0
    while not killed and time.monotonic() < deadline:
        killed = kill_groups()
        time.sleep(0.1)
    t.join(30)
    assert killed == 1 and not t.is_alive(), "the run was not stopped"
    assert done["fin"].returncode == -9 and not done["fin"].timed_out, done
