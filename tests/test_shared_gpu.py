"""The shared-GPU mode: two-rank runs on one GPU, every rank's process with its own NCCL_HOSTID.

What runs here without a GPU, for real: the mini test's argument handling and skip reasons, its
rendezvous (a parent-held store on a kernel-chosen port, two spawned gloo ranks joining it), the
per-process NCCL_HOSTID of the mini test's ranks and of the NeMo-RL hooks' sitecustomize (real
interpreters, an inherited value overwritten), the harness's Ray and case environments, and the
nightly end to end: the plan puts the mode into the cells that need GPUs, a skip names it, and
run.json, the history and the summary carry its label and the note on times.
"""

from __future__ import annotations

import errno
import fnmatch
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest

from carry.nightly import gpus as nightly_gpus
from carry.nightly import report
from helpers import MINI, ROOT, mini_test_module, read_json, tool

HOOKS = ROOT / "integration" / "nemo_rl_gtp" / "hooks"
NCCL_CELLS = ("gtp-refit-mini-nccl-bf16", "gtp-refit-mini-moe-nccl", "gtp-refit-mini-cost")


@pytest.fixture
def mini(monkeypatch):
    monkeypatch.delenv("CARRY_SHARED_GPU", raising=False)
    with mini_test_module("shared_gpu_mini") as run:
        # run.py's command line (settings.py) and its launcher (launcher.py), as the run imports them
        yield SimpleNamespace(parse_args=run.parse_args, gpu_mode=sys.modules["settings"].gpu_mode,
                              gpu_shortfall=sys.modules["launcher"].gpu_shortfall,
                              rank_store=sys.modules["launcher"].rank_store)


def test_the_mode_is_opt_in_and_only_for_nccl(mini, monkeypatch):
    s, _ = mini.parse_args(["--backend", "nccl"])
    assert not s.shared_gpu and mini.gpu_mode(s) == "gpu-per-rank"
    s, _ = mini.parse_args(["--backend", "nccl", "--shared-gpu"])
    assert s.shared_gpu and mini.gpu_mode(s) == "shared-gpu"
    monkeypatch.setenv("CARRY_SHARED_GPU", "1")   # the night's switch: NCCL runs share, gloo runs are as ever
    assert mini.parse_args(["--backend", "nccl"])[0].shared_gpu
    s, _ = mini.parse_args(["--backend", "gloo"])
    assert not s.shared_gpu and mini.gpu_mode(s) == "gloo-one-gpu"
    res = subprocess.run([sys.executable, str(MINI), "--backend", "gloo", "--shared-gpu"], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2 and "--shared-gpu is for --backend nccl" in res.stderr


def test_nccl_on_too_few_gpus_skips_naming_the_mode(mini):
    plain = mini.parse_args(["--backend", "nccl", "--nproc", "2"])[0]
    why = mini.gpu_shortfall(plain, 1)
    assert why.startswith("--backend nccl with --nproc 2 needs 2 GPU(s), 1 visible") and "--shared-gpu" in why
    assert mini.gpu_shortfall(plain, 2) is None
    shared = mini.parse_args(["--backend", "nccl", "--nproc", "2", "--shared-gpu"])[0]
    assert mini.gpu_shortfall(shared, 1) is None
    assert "needs 1 GPU(s), 0 visible" in mini.gpu_shortfall(shared, 0)


def test_a_skipped_shared_run_carries_its_label_and_the_note_on_times(tmp_path):
    res = subprocess.run([sys.executable, str(MINI), "--backend", "nccl", "--shared-gpu", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    doc = json.loads((tmp_path / "result.json").read_text())
    assert doc["status"] == "skipped" and doc["gpu_mode"] == "shared-gpu"
    assert "not GTP's price" in doc["timing_note"] and "per-rank memory" in doc["timing_note"]


HOSTID_PROBE = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
import sharedgpu
before = os.environ.get("NCCL_HOSTID")
sharedgpu.enter()
print(json.dumps({"pid": os.getpid(), "before": before, "after": os.environ["NCCL_HOSTID"]}))
"""


def _two(cmd: list[str], env: dict[str, str]) -> list[dict]:
    outs = []
    for _ in range(2):
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        assert res.returncode == 0, res.stderr
        outs.append(json.loads(res.stdout.strip().splitlines()[-1]))
    return outs


def test_each_mini_rank_process_gets_its_own_nccl_hostid_over_an_inherited_one():
    env = {**os.environ, "NCCL_HOSTID": "inherited-from-the-parent"}
    a, b = _two([sys.executable, "-c", HOSTID_PROBE, str(MINI.parent)], env)
    assert a["before"] == b["before"] == "inherited-from-the-parent"
    assert a["after"] != b["after"] and "inherited" not in a["after"] + b["after"]
    assert a["after"].endswith(f"-{a['pid']}") and a["after"].startswith(socket.gethostname())


ENV_PROBE = "import json, os; print(json.dumps({'pid': os.getpid(), 'id': os.environ.get('NCCL_HOSTID')}))"


def test_the_hooks_give_every_python_of_a_case_its_own_nccl_hostid():
    """sitecustomize runs at interpreter start in every Python with the hooks on PYTHONPATH (Ray's
    workers too): in the mode it overwrites what the driver's environment handed down."""
    env = {**os.environ, "PYTHONPATH": str(HOOKS), "NCCL_HOSTID": "driver", "CARRY_SHARED_GPU": "1"}
    env.pop("CARRY_REFIT_CHECK", None)
    a, b = _two([sys.executable, "-c", ENV_PROBE], env)
    assert a["id"] != b["id"] and "driver" not in (a["id"], b["id"])
    assert a["id"].endswith(f"-{a['pid']}") and b["id"].endswith(f"-{b['pid']}")
    off = {**env, "CARRY_SHARED_GPU": "0"}
    assert {x["id"] for x in _two([sys.executable, "-c", ENV_PROBE], off)} == {"driver"}


RANK = r"""
import sys
from types import SimpleNamespace
sys.path.insert(0, sys.argv[1])
import torch, torch.distributed as dist
import rank
r, port = int(sys.argv[2]), int(sys.argv[3])
rank.connect(r, 2, port, "gloo")
t = torch.tensor([float(r + 1)])
dist.all_reduce(t)
print(f"rank {r} sum {t.item()}")
dist.destroy_process_group()
"""


def test_ranks_join_a_store_the_parent_holds_on_a_port_the_kernel_chose(mini):
    """No port is picked free and bound later (the EADDRINUSE race seen on the H200): the parent's
    store listens before any rank starts, so nothing else can take the port in between."""
    store = mini.rank_store(2)
    port = store.port
    assert port > 0
    with socket.socket() as other, pytest.raises(OSError) as taken:
        other.bind(("127.0.0.1", port))
    assert taken.value.errno == errno.EADDRINUSE
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(MINI.parent), str(r), str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    assert sorted(o.strip() for o, _ in outs) == ["rank 0 sum 3.0", "rank 1 sum 3.0"]
    del store


def _harness():
    sys.path[:0] = [str(ROOT / "integration" / "nemo_rl_gtp")]
    try:
        from harness.host import caserun
    finally:
        del sys.path[0]
    return caserun


RAY_STAND_IN = """
def get_gpu_ids():
    import os
    return [os.environ["LOGICAL_GPU"]]
"""
GPU_PROBE = ("import json, os, ray; "
             "print(json.dumps({'ids': ray.get_gpu_ids(), 'id': os.environ.get('NCCL_HOSTID')}))")


def test_every_logical_ray_gpu_is_gpu_0_in_the_mode(tmp_path):
    """The hook wraps ``ray.get_gpu_ids`` as ``ray`` is imported (a stand-in package here: Ray is not
    installed on this machine; on the H200 it is the real one), so NeMo-RL's worker sets device 0
    whichever logical GPU Ray gave it; without the mode Ray's answer is untouched."""
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text(RAY_STAND_IN)
    base = {**os.environ, "PYTHONPATH": f"{HOOKS}:{tmp_path}", "NCCL_HOSTID": "driver"}
    base.pop("CARRY_REFIT_CHECK", None)
    for logical in ("0", "1"):
        on = _two([sys.executable, "-c", GPU_PROBE], {**base, "CARRY_SHARED_GPU": "1", "LOGICAL_GPU": logical})
        assert [x["ids"] for x in on] == [["0"], ["0"]] and len({x["id"] for x in on}) == 2
        off = _two([sys.executable, "-c", GPU_PROBE], {**base, "LOGICAL_GPU": logical})
        assert [x["ids"] for x in off] == [[logical], [logical]] and {x["id"] for x in off} == {"driver"}


def test_ray_start_counts_gpus_itself(tmp_path):
    caserun = _harness()
    env = {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,0"}
    assert "CUDA_VISIBLE_DEVICES" not in caserun.ray_env(env, 2, True)
    assert "CUDA_VISIBLE_DEVICES" not in caserun.ray_env(env, 2, False)


def test_a_case_in_the_mode_runs_the_hooks_and_says_so(tmp_path):
    caserun = _harness()
    from harness.host import cases as casing
    from harness.host.setup import Layout

    lay = Layout(parts=tmp_path / "parts", root=tmp_path / "root", te=tmp_path / "te")
    trees = caserun.Trees(tmp_path / "nrl", [])
    patched = casing.CASES["patched"]
    env = caserun.case_env(lay, trees, tmp_path / "nrl", tmp_path / "out", case=patched, shared_gpu=True)
    assert env["CARRY_SHARED_GPU"] == "1" and str(HOOKS) in env["PYTHONPATH"].split(":")
    plain = caserun.case_env(lay, trees, tmp_path / "nrl", tmp_path / "out", case=patched)
    assert "CARRY_SHARED_GPU" not in plain and str(HOOKS) not in plain["PYTHONPATH"].split(":")


def test_the_nightly_plan_puts_the_mode_into_the_gpu_cells_only(tmp_path, pin_cache):
    shared = tool("nightly", "--images", "host", "--out", tmp_path / "out", "--print-commands", "--shared-gpu",
                  "--only", "megatron-lm,megatron-bridge", "--cache", pin_cache, check=0).stdout
    plain = tool("nightly", "--images", "host", "--out", tmp_path / "out2", "--print-commands",
                 "--only", "megatron-lm,megatron-bridge", "--cache", pin_cache, check=0).stdout
    for name in NCCL_CELLS:
        assert name in shared
    assert "CARRY_SHARED_GPU" not in plain
    # the GPU command cells of the host image carry the switch (the gloo ones ignore it); proofs do not
    gpu_cells = [line for line in shared.splitlines() if "gtp_refit_mini/run.py" in line]
    assert len(gpu_cells) == len(NCCL_CELLS) + 2
    assert all("CARRY_SHARED_GPU=1" in line for line in gpu_cells)
    assert shared.count("CARRY_SHARED_GPU=1") == len(gpu_cells)


def test_the_qwen_shape_is_what_the_nccl_bf16_cell_runs():
    from carry.nightly.config import load

    cells = {t.name: t for t in load(ROOT / "integration" / "nightly.toml").tests}
    argv = cells["gtp-refit-mini-nccl-bf16"].argv
    assert argv[argv.index("--shape") + 1] == "qwen2.5-0.5b" and "nccl" in argv and "bf16" in argv


def test_a_night_in_the_mode_labels_its_cells_and_summary(tmp_path, pin_cache):
    """On this CPU machine: the NCCL cell skips, naming the mode's need (a GPU to share), and its
    run.json, the history line and the summary carry the label and the note on times."""
    out = tmp_path / "out"
    tool("nightly", "--images", "host", "--tests", "gtp-refit-mini-nccl-bf16", "--out", out, "--shared-gpu",
         "--only", "megatron-lm,megatron-bridge", "--no-bisect", "--run-id", "shared", "--cache", pin_cache,
         check=0, timeout=900)
    cell = read_json(out / "cells" / "gtp--host--gtp-refit-mini-nccl-bf16" / "run.json")
    assert cell["status"] == "skipped" and "needs a GPU for its 2 rank(s) to share" in cell["reason"]
    assert cell["gpu_mode"] == "shared-gpu" and "not GTP's price" in cell["timing_note"]
    hist = [json.loads(x) for x in (tmp_path / "nightly-history.jsonl").read_text().splitlines()]
    assert hist[-1]["gpu_mode"] == "shared-gpu"
    assert "- gpu mode: shared-gpu" in (out / "summary.md").read_text()
    tool("nightly", "--images", "host", "--tests", "gtp-refit-mini-nccl-bf16", "--out", tmp_path / "plain",
         "--only", "megatron-lm,megatron-bridge", "--no-bisect", "--run-id", "plain", "--cache", pin_cache,
         check=0, timeout=900)
    plain = read_json(tmp_path / "plain" / "cells" / "gtp--host--gtp-refit-mini-nccl-bf16" / "run.json")
    assert plain["gpu_mode"] == "gpu-per-rank" and "timing_note" not in plain
    assert "needs 2 GPU(s), 0 visible" in plain["reason"]


def test_the_cost_table_marks_shared_gpu_times_and_keeps_memory_plain():
    m = {"gtp_setup_mib": 600.0, "off_setup_mib": 1000.0, "ratio_setup_mib": 0.6,
         "gtp_train_state_mib": 900.0, "off_train_state_mib": 2000.0, "ratio_train_state_mib": 0.45,
         "gtp_peak_mib": 3000.0, "off_peak_mib": 4000.0, "ratio_peak_mib": 0.75,
         "gtp_step_seconds": 0.5, "off_step_seconds": 0.25, "ratio_step_seconds": 2.0}
    run = {"cell": "gtp--host--gtp-refit-mini-cost", "metrics": m, "gpu_mode": nightly_gpus.SHARED_GPU,
           "timing_note": nightly_gpus.TIMING_NOTE}
    lines = report.cost_section([run])
    table = "\n".join(lines)
    assert "| + optimiser state (MiB) | 900 | 2000 | 0.45 |" in table
    assert "| step (s) (shared-GPU: not GTP's price) | 0.5 | 0.25 | 2 |" in table
    assert "peak (MiB) (shared" not in table and nightly_gpus.TIMING_NOTE in table
    own = report.cost_section([{**run, "gpu_mode": "gpu-per-rank"}])
    assert not any("shared" in x for x in own)
    assert report.cost_section([{"cell": "x", "metrics": {"token_mult_prob_error": 1.0}}]) == []


RAY_PROGRAM = """#!/bin/sh
echo "$@" >> "$RAY_CALLS"
if [ "$1" = start ] && [ -n "$RAY_ALREADY_RUNNING" ]; then
  echo "ConnectionError: Ray is trying to start at 127.0.0.1:6379, but is already running at 127.0.0.1:6379."
  exit 1
fi
exit 0
"""


def _stand_in_ray(tmp_path):
    """PATH with RAY_PROGRAM as ``ray``; (the environment, the file its calls are written to)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ray").write_text(RAY_PROGRAM)
    (bin_dir / "ray").chmod(0o755)
    calls = tmp_path / "calls"
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RAY_CALLS": str(calls)}, calls


@pytest.mark.parametrize("running", [False, True])
def test_a_case_stops_only_the_ray_it_started(tmp_path, running):
    """A stand-in ``ray`` program (Ray is not installed here) that answers ``start`` as Ray does when
    another cluster runs there: the case must not ``ray stop --force`` that cluster."""
    caserun = _harness()
    env, calls = _stand_in_ray(tmp_path)
    if running:
        env["RAY_ALREADY_RUNNING"] = "1"
    log_path = tmp_path / "case.log"
    with open(log_path, "w") as log, pytest.raises(RuntimeError, match="the case failed"):
        with caserun.ray_cluster(env, log, 2, True) as rc:
            assert (rc != 0) == running
            raise RuntimeError("the case failed")
    verbs = [line.split()[0] for line in calls.read_text().splitlines()]
    assert verbs == (["start"] if running else ["start", "stop"])
    assert ("not stopping Ray" in log_path.read_text()) == running


def test_a_case_on_a_ray_already_running_neither_starts_nor_stops_it(tmp_path):
    """--ray-running (two cases side by side on one cluster): the stand-in ray is never called."""
    caserun = _harness()
    env, calls = _stand_in_ray(tmp_path)
    log_path = tmp_path / "case.log"
    with open(log_path, "w") as log, pytest.raises(RuntimeError, match="the case failed"):
        with caserun.ray_cluster(env, log, 2, True, running=True) as rc:
            assert rc == 0
            raise RuntimeError("the case failed")
    assert not calls.exists(), calls.read_text()
    assert "neither starts nor stops it" in log_path.read_text()


@pytest.mark.parametrize("value, running", [(None, False), ("0", False), ("1", True)])
def test_the_ray_running_switch_reaches_a_nightly_cell_through_its_environment(monkeypatch, value, running):
    """A nightly's gpu-host cell runs run-on-gpu-host with the night's environment and its own arguments:
    CARRY_NRL_RAY_RUNNING=1 is how such a cell joins a cluster that cases beside it share (the learning
    evidence on one H200), so --ray-running's default must follow it, and only when it is "1"."""
    _harness()
    from harness import cli

    if value is None:
        monkeypatch.delenv(cli.RAY_RUNNING_ENV, raising=False)
    else:
        monkeypatch.setenv(cli.RAY_RUNNING_ENV, value)
    assert cli._gpuhost_parser().parse_args([]).ray_running is running
    assert cli._gpuhost_parser().parse_args(["--ray-running"]).ray_running is True


def test_a_bisection_names_the_patch_the_trees_lack():
    """The nccl-bf16 cell on the series without mlm-gtp-tied-dummy-wgrad (seen on the H200): the run's
    BUG_HIT names a series patch that the bisected trees do not hold, and the note says so."""
    from carry.evidence.bisect import bisect
    from carry.series.manifest import load

    from helpers import SERIES

    series = load(SERIES)
    order = [p for p in series.patches if p.upstream == "megatron-lm" and p.id != "mlm-gtp-tied-dummy-wgrad"]
    target = "failed:bug:mlm-gtp-tied-dummy-wgrad"
    at = [p.id for p in order].index("mlm-gtp-refit-plan") + 1

    def probe(k):
        return (target if k >= at else "failed:bug:mlm-inference-pg"), "failed", ""

    res = bisect(order, target, probe, [p.id for p in series.patches])
    assert res.first_patch == "mlm-gtp-refit-plan"
    assert res.note.endswith("; the run meets the bug of mlm-gtp-tied-dummy-wgrad, a patch of the series these "
                             "trees lack")
    whole = bisect(order + [series.patch("mlm-gtp-tied-dummy-wgrad")], target, probe, [p.id for p in series.patches])
    assert "lack" not in whole.note


def test_the_scheduled_gpu_night_runs_the_two_rank_cells_on_one_gpu_only_when_asked():
    """The workflow's gpu job passes --shared-gpu to tonight's nightly when the repository variable
    GTP_GPU_SHARED is "true", and never otherwise (the mode is opt-in); the cpu job never does."""
    import yaml

    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "nightly.yml").read_text())
    jobs = workflow["jobs"]
    nightly = next(s for s in jobs["gpu"]["steps"] if s.get("name") == "Nightly")
    assert nightly["env"]["SHARED"] == "${{ vars.GTP_GPU_SHARED == 'true' && '1' || '' }}"
    # The step's own script, run by bash with python3 standing in to print what it was given (the
    # Actions expressions filled in with placeholders), with and without the variable.
    import re

    script = re.sub(r"\$\{\{[^}]*\}\}", "X", nightly["run"])
    for shared in ("1", ""):
        argv = subprocess.run(["bash", "-c", 'python3() { printf "%s\\n" "$@"; }\n' + script],
                              env={"PATH": os.environ["PATH"], "OUT": "out", "SHARED": shared, "TESTS": ""},
                              capture_output=True, text=True, check=True).stdout.split()
        assert "tools/nightly.py" in argv and ("--shared-gpu" in argv) == bool(shared), argv
    assert not any("--shared-gpu" in (s.get("run") or "") for s in jobs["cpu"]["steps"])



def test_no_logged_exit_status_comes_after_a_command_substitution():
    """``echo "[$(date)] exit $?"`` logs date's status, always 0 (2026-12-01-shared-gpu/learning.console said
    "exit 0" for a failed cell): in every shell script of the repository no ``$?`` follows a ``$(...)`` in
    the same command. Bash itself shows why the rule is right: the status after ``false`` reads 0 there."""
    import re
    import subprocess
    said = subprocess.run(["bash", "-c", 'false; echo "[$(date -u +%H)] exit $?"'], capture_output=True, text=True,
                          check=False).stdout
    assert said.endswith("exit 0\n"), said
    scripts = [p for p in ROOT.rglob("*.sh") if ".git" not in p.parts]
    scripts += [ROOT / "integration" / "slurm" / "nightly.sbatch"]
    bad = [f"{p.relative_to(ROOT)}:{no}: {ln.strip()}" for p in scripts
           for no, ln in enumerate(p.read_text(errors="replace").splitlines(), 1)
           for command in re.split(r";|&&|\|\|", ln) if "$?" in command and "$(" in command[:command.find("$?")]]
    assert not bad, bad


def test_the_waits_pack_while_they_wait_and_each_pack_is_whole(tmp_path):
    """shared-gpu-h200.sh's waits (integration/shared-gpu-lib.sh) run their packs every PACK_EVERY
    seconds while the process they wait for runs, and once at the end: a call the device cuts short
    still brings back what there was a moment before (2026-12-04: a machine taken back mid-call).
    A pack is the whole archive or none: written aside, then moved, though a path it names is not
    there yet."""
    import tarfile
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "log.txt").write_text("what the run said\n")
    script = f"""
        set -uo pipefail
        . integration/shared-gpu-lib.sh
        count() {{ echo x >> "$OUT/packs"; }}
        sleep "$LIVES" > /dev/null 2>&1 & echo $! > "$OUT/pid"
        wait_packing "$LIMIT" "$OUT/pid" count; echo "rc=$?"
        kill "$(cat "$OUT/pid")" 2> /dev/null
        pack whole {tmp_path / 'log.txt'} {tmp_path / 'not-yet'}
    """

    def waits(lives: int, limit: int) -> tuple[str, int]:
        (out / "packs").unlink(missing_ok=True)
        res = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60,
                             env={**os.environ, "OUT": str(out), "PACK_EVERY": "1", "LIVES": str(lives),
                                  "LIMIT": str(limit)})
        rc = next(ln for ln in res.stdout.splitlines() if ln.startswith("rc="))
        return rc, len((out / "packs").read_text().split())

    rc, packs = waits(lives=30, limit=3)   # still running when the wait ends: packed each second and at the end
    assert rc != "rc=0" and packs == 4, (rc, packs)
    rc, packs = waits(lives=2, limit=20)   # ended: the wait returns true, packed at least once more at its end
    assert rc == "rc=0" and 1 <= packs <= 4, (rc, packs)
    with tarfile.open(out / "whole.tgz") as tar:
        assert [m.name for m in tar.getmembers()] == [str(tmp_path / "log.txt").lstrip("/")]
    assert sorted(p.name for p in out.iterdir()) == ["packs", "pid", "whole.tgz"]


def test_a_wait_on_the_setup_ends_when_no_setup_runs(tmp_path):
    """while_setup (integration/shared-gpu-lib.sh): what the upstream tests' step waits for (the payload,
    the venv, the model) comes from a setup running beside it. Once none runs and it is not there, the
    wait ends, false (2026-12-05: the nrl ferry's parts never arrived, the setup ended at once without a
    payload, and the step waited for one until the H200's whole 1,800 s were spent). It ends true when
    the setup made it."""
    import time
    marker = tmp_path / "made"
    script = """
        set -uo pipefail
        . integration/shared-gpu-lib.sh
        ( sleep "$LIVES"; [ "$MAKES" = 1 ] && touch "$MARKER" ) > /dev/null 2>&1 & echo $! > "$PIDS"
        [ "$LIVES" = none ] && kill "$(cat "$PIDS")" 2> /dev/null && rm -f "$PIDS"
        while_setup test -e "$MARKER"; echo "rc=$?"
    """

    def waits(lives: str, makes: int) -> tuple[str, float]:
        marker.unlink(missing_ok=True)
        t0 = time.monotonic()
        res = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60,
                             env={**os.environ, "LIVES": lives, "MAKES": str(makes), "MARKER": str(marker),
                                  "PIDS": str(tmp_path / "setup.pid"), "SETUP_PIDS": str(tmp_path / "setup.pid")})
        return next(ln for ln in res.stdout.splitlines() if ln.startswith("rc=")), time.monotonic() - t0

    rc, took = waits("none", 0)   # no setup at all: at once
    assert rc == "rc=1" and took < 5, (rc, took)
    rc, took = waits("4", 0)      # a setup that ends without it: once it ended
    assert rc == "rc=1" and 3 < took < 15, (rc, took)
    rc, took = waits("4", 1)      # one that makes it: true
    assert rc == "rc=0" and 3 < took < 15, (rc, took)


def test_nemo_rl_tests_find_the_model_of_the_setup_that_ran(tmp_path):
    """setup_model (integration/shared-gpu-lib.sh), what upstream-tests-bg waits for before NeMo-RL's tests:
    the model.json of setup-bg (TOP/setup) or of the pretrain (TOP/pretrain), whichever was written, or
    UT_SETUP's alone where it is set. The step had waited for TOP/pretrain only: after setup-bg, the
    documented order, NeMo-RL's tests would have been left out. Mutation, red: the default TOP/pretrain alone."""
    def ready(*made: str, setup: str | None = None) -> bool:
        top = tmp_path / "o"
        shutil.rmtree(top, ignore_errors=True)
        for d in made:
            (top / d).mkdir(parents=True)
            (top / d / "model.json").write_text("{}\n")
        env = {**os.environ, "UT_TOP": str(top)}
        env.pop("UT_SETUP", None)
        if setup is not None:
            env["UT_SETUP"] = str(top / setup)
        res = subprocess.run(["bash", "-c", ". integration/shared-gpu-lib.sh; setup_model"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=60)
        assert res.returncode in (0, 1), res.stderr
        return res.returncode == 0

    assert ready("setup") and ready("pretrain") and ready("setup", "pretrain")
    assert not ready() and not ready("elsewhere")
    assert ready("mine", setup="mine") and not ready("setup", "pretrain", setup="mine")
    step = (ROOT / "integration" / "shared-gpu-h200.sh").read_text().split("  upstream-tests-bg)", 1)[1]
    assert "while_setup setup_model ||" in step.split("\n  wait-upstream-tests)", 1)[0]


def test_no_background_step_waits_for_the_setup_beyond_it():
    """The class: a wait of shared-gpu-h200.sh's steps for what the setup makes (a file, the venv) is
    bounded (wait_for SECONDS) or lasts as long as the setup (while_setup), never a bare loop."""
    text = (ROOT / "integration" / "shared-gpu-h200.sh").read_text()
    bare = [ln.strip() for ln in text.splitlines()
            if re.search(r"\b(while|until)\s+(!\s*)?(\[\s*!?\s*-[ef]\b|test\s|venv_ok)", ln)]
    assert not bare, bare
    assert text.count("while_setup ") == 3, text.count("while_setup ")


def test_the_setup_venv_counts_only_when_its_verify_json_says_ok_and_its_wheels_are_in(tmp_path):
    """What shared-gpu-h200.sh's proofs and upstream tests wait for (integration/shared-gpu-lib.sh's
    venv_ok): a verify.json whose "ok" is true. A failed setup leaves one too ("ok": false); a file
    half written, or none yet, is not ok either. And the setup's venv-ready.json beside it: verify.json
    is written before NeMo-RL's dependency wheels go in, and Megatron-LM's tests that started then died
    of a missing omegaconf (h100/2026-12-06-mlm-three-shards)."""
    verify = tmp_path / "verify.json"

    def ok() -> bool:
        return subprocess.run(["bash", "-c", f". integration/shared-gpu-lib.sh; venv_ok {verify}"], cwd=ROOT,
                              check=False).returncode == 0

    assert not ok()   # none yet
    verify.write_text('{"ok": true, "steps": []}')
    assert not ok()   # the wheels not in yet
    (tmp_path / "venv-ready.json").write_text('{"verify_ok": true, "deps": []}\n')
    for text, want in (('{"ok": true, "steps": []}', True), ('{"ok": false}', False), ('{"ok": "yes"}', False),
                       ('{"ok": tr', False), ("{}", False)):
        verify.write_text(text)
        assert ok() is want, text


def test_the_setup_says_its_venv_is_ready_only_once_its_wheels_are_in(tmp_path, monkeypatch):
    """The setup's steps in order: venv-ready.json goes away when a setup begins (one run again installs
    again) and comes back only after NeMo-RL's dependency wheels are installed, after verify.json."""
    _harness()
    from harness.host import setup as hostsetup
    lay = hostsetup.Layout(parts=tmp_path / "parts", root=tmp_path / "root", te=tmp_path / "te")
    lay.root.mkdir()
    lay.venv_ready.write_text("{}\n")   # an earlier setup's
    seen = []

    def step(name, value=None):
        def run(*_a, **_k):
            seen.append((name, lay.venv_ready.exists()))
            return value
        return run

    for name, value in (("require_parts", None), ("check_platform", "glibc"), ("unpack_payload", {}),
                        ("make_venv", None), ("run_steps", {"ok": True}), ("install_deps", ["omegaconf.whl"]),
                        ("fa4_status", {}), ("prepare_pristine", None), ("build_model", {}),
                        ("build_moe_model", None)):
        monkeypatch.setattr(hostsetup, name, step(name, value))
    hostsetup.setup(lay, tmp_path / "setup.log")
    ready = {name: present for name, present in seen}
    assert [n for n, _ in seen][3:6] == ["make_venv", "run_steps", "install_deps"], seen
    assert not any(ready[n] for n in ("unpack_payload", "make_venv", "run_steps", "install_deps")), seen
    assert ready["fa4_status"], seen
    assert json.loads(lay.venv_ready.read_text()) == {"verify_ok": True, "deps": ["omegaconf.whl"]}


def _background_scripts(text: str) -> list[str]:
    """The scripts shared-gpu-h200.sh runs with ``setsid nohup bash -c '...'``, as bash reads them."""
    scripts, start = [], "setsid nohup bash -c '"
    at = text.find(start)
    while at >= 0:
        i, body = at + len(start), []
        while True:
            j = text.index("'", i)
            body.append(text[i:j])
            if text.startswith("'\"'\"'", j):  # '"'"': a quote inside the single-quoted script
                body.append("'")
                i = j + 5
                continue
            break
        scripts.append("".join(body))
        at = text.find(start, j)
    return scripts


def test_each_background_script_parses_and_takes_its_helpers_from_the_lib():
    """The background scripts of shared-gpu-h200.sh (the queue, the learning evidence, the upstream
    tests, the learning cell after the pretrain) run where no test sees them fail: each must parse, and each helper it calls (stamp,
    alive, venv_ok, wait_for) must come from integration/shared-gpu-lib.sh, sourced before its
    first use, not from a copy of its own."""
    import re

    text = (ROOT / "integration" / "shared-gpu-h200.sh").read_text()
    scripts = _background_scripts(text)
    assert len(scripts) == 4, [s[:60] for s in scripts]
    lib = ". integration/shared-gpu-lib.sh"
    for script in scripts:
        res = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True)
        assert res.returncode == 0, (res.stderr, script[:200])
        assert not re.search(r"\b(stamp|alive|venv_ok|wait_for|say)\s*\(\)", script), script[:200]
        used = [m.start() for m in re.finditer(r"\b(stamp|alive|venv_ok|wait_for) ", script)]
        assert used and lib in script and script.index(lib) < min(used), script[:200]


def test_the_upstream_tests_pack_holds_each_launch_console_tail_not_the_whole_log_nor_the_trees(tmp_path):
    """pack_ut brings back the rank records and each launch's console.log as its last 64 KB
    (console.tail.txt: the stacks a hung test's rank dumps as it ends are there), never the whole log
    nor the trees the runs copy."""
    import tarfile
    out, launch = tmp_path / "out", tmp_path / "o" / "ut" / "nemo-rl" / "patched" / "launch-01-n1"
    out.mkdir()
    launch.mkdir(parents=True)
    (launch / "rank-0.jsonl").write_text('{"ev": "start", "id": "t"}\n')
    (launch / "console.log").write_text("x" * 200_000 + "\nThread 0x1 (most recent call first):\n  File \"ray.py\"\n")
    (tmp_path / "o" / "ut" / "nemo-rl" / "trees" / "a").mkdir(parents=True)
    (tmp_path / "o" / "ut" / "nemo-rl" / "trees" / "a" / "console.log").write_text("a tree's\n")
    subprocess.run(["bash", "-c", ". integration/shared-gpu-lib.sh; pack_ut"], cwd=ROOT, check=True, timeout=60,
                   env={**os.environ, "OUT": str(out), "UT_TOP": str(tmp_path / "o")})
    with tarfile.open(out / "ut.tgz") as tar:
        names = sorted(m.name for m in tar.getmembers())
        tail = tar.extractfile("ut/nemo-rl/patched/launch-01-n1/console.tail.txt").read()
    assert names == ["ut/nemo-rl/patched/launch-01-n1/console.tail.txt", "ut/nemo-rl/patched/launch-01-n1/rank-0.jsonl"], names
    assert len(tail) == 65536 and tail.endswith(b'  File "ray.py"\n'), len(tail)


def test_nemo_rl_own_tests_get_the_environment_of_its_grpo_cases(tmp_path):
    """NeMo-RL's own tests on the GPU host (shared-gpu-h200.sh's upstream-tests-bg) run with what its GRPO
    cases run with (integration/shared-gpu-lib.sh's nrl_tests_env): in every Python, Ray's workers
    included, the shared-GPU mode's hook gives each process its own NCCL_HOSTID and puts each logical GPU
    id on GPU 0 (CARRY_SHARED_GPU from the launcher); the logger's stand-ins import; the workers run the
    venv's Python; Hugging Face is offline. Without it, on 2026-12-05, NeMo-RL's two-GPU generation test
    hung on both sides."""
    words = subprocess.run(["bash", "-c", '. integration/shared-gpu-lib.sh; nrl_tests_env "$PWD"'], cwd=ROOT,
                           capture_output=True, text=True, check=True, timeout=60).stdout.split()
    env = dict(w.split("=", 1) for w in words)
    assert {k: env[k] for k in ("NEMO_RL_PY_EXECUTABLES_SYSTEM", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                                "HF_DATASETS_OFFLINE")} == dict.fromkeys(
        ("NEMO_RL_PY_EXECUTABLES_SYSTEM", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"), "1"), env
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text(RAY_STAND_IN)
    probe = GPU_PROBE.replace("print(", "import mlflow, wandb, swanlab; print(")
    base = {**os.environ, **env, "PYTHONPATH": f"{tmp_path}:{env['PYTHONPATH']}", "NCCL_HOSTID": "driver",
            "CARRY_SHARED_GPU": "1", "LOGICAL_GPU": "1"}
    base.pop("CARRY_REFIT_CHECK", None)
    got = _two([sys.executable, "-c", probe], base)
    assert [x["ids"] for x in got] == [["0"], ["0"]] and len({x["id"] for x in got} - {"driver"}) == 2, got
    script = (ROOT / "integration" / "shared-gpu-h200.sh").read_text()
    step = script.split("  upstream-tests-bg)", 1)[1].split("\n  wait-upstream-tests)", 1)[0]
    assert '[ "$up" = nemo-rl ] && read -ra extra <<< "$(nrl_tests_env "$PWD")"' in step, "the step runs without it"
    assert 'env "${extra[@]}" timeout' in step and "python3 tools/upstream_tests.py" in step.split('env "${extra[@]}" timeout')[1][:200]



def test_a_background_step_runs_from_a_snapshot_the_next_call_cannot_change(tmp_path):
    """Each device call copies the checkout in again while the work a background step started still
    runs; on 2026-12-05 both applies of the upstream tests failed so (h100/2026-12-05-upstream-tests/resynced:
    "No module named 'carry.series.testspin'"). A step that starts background work re-runs itself from a
    snapshot of the checkout (not its ferries), so what it started never reads the checkout again. Shown
    with a copy of the checkout and a background step's name the script does not know: the error comes
    from the snapshot, which outlives the copy; a foreground step runs from the checkout."""
    copy = tmp_path / "checkout"
    shutil.copytree(ROOT / "integration", copy / "integration")
    (copy / ".ferry").mkdir()
    (copy / ".ferry" / "te.part00").write_text("a ferry part")
    trees = tmp_path / "trees"
    script = copy / "integration" / "shared-gpu-h200.sh"

    def step(name: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(script), name], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                              env={**os.environ, "CARRY_TREES": str(trees), "OUT": str(tmp_path / "out")})

    fg = step("no-such-step")
    assert fg.returncode == 2 and "unknown step no-such-step (run from the checkout)" in fg.stderr, fg.stderr
    assert not trees.exists()
    bg = step("no-such-step-bg")
    (snap,) = trees.iterdir()
    assert bg.returncode == 2 and f"unknown step no-such-step-bg (run from {snap})" in bg.stderr, bg.stderr
    assert (snap / "integration" / "shared-gpu-h200.sh").read_text() == script.read_text()
    assert not (snap / ".ferry").exists()
    shutil.rmtree(copy)   # the next call's copy, made while the step's work runs
    assert (snap / "integration" / "shared-gpu-lib.sh").is_file()


def test_every_step_that_starts_background_work_is_one_the_snapshot_takes():
    """The class, not the case: each step of shared-gpu-h200.sh whose body starts work that outlives the
    call (setsid nohup) has a name the snapshot's pattern takes (*-bg, setup-pretrain)."""
    text = (ROOT / "integration" / "shared-gpu-h200.sh").read_text()
    body = text[text.index("case ${1:?step} in"):]
    arms = re.split(r"^  ([a-z-]+)\)", body, flags=re.M)[1:]
    steps = dict(zip(arms[::2], arms[1::2]))
    background = {name for name, code in steps.items() if "setsid nohup" in code}
    assert {"setup-bg", "upstream-tests-bg", "learning-evidence-bg", "setup-pretrain"} <= background, background
    (pattern,) = re.findall(r"^case \$\{1:-\} in\n  ([^)]+)\)\n    if \[ -z \"\$\{CARRY_SNAPSHOT", text, re.M)
    assert all(any(fnmatch.fnmatchcase(name, p) for p in pattern.split("|")) for name in background), (pattern, background)


@pytest.mark.parametrize("total, width", [("143771", 2), ("81559", 1), ("", 1), ("[N/A]", 1), ("133000", 2)])
def test_the_learning_wave_is_as_wide_as_the_gpu_holds(total, width):
    """Two learning cases side by side peaked at 127.0 GB on an H200 (h200/2026-12-05-learning-at-3e-5):
    learning-evidence-bg runs two at a time on a GPU of 143 GB (an H200's nvidia-smi total, MiB) and one
    at a time on an H100's 80, or where the total cannot be read (shared-gpu-lib.sh's wave_width)."""
    got = subprocess.run(["bash", "-c", f'. integration/shared-gpu-lib.sh && wave_width "{total}"'], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.strip()
    assert got == str(width), (total, got)


@pytest.mark.parametrize("env, why", [({"NIGHTLY_CELL": "2"}, "NIGHTLY_CELL is 0 or 1, not '2'"),
                                      ({"NIGHTLY_CELL": "yes"}, "NIGHTLY_CELL is 0 or 1, not 'yes'"),
                                      ({"NIGHTLY_CELL": "0", "WAVE2": ""}, "NIGHTLY_CELL=0 with an empty WAVE2 runs nothing")])
def test_the_learning_evidence_refuses_a_night_without_a_case_to_run(tmp_path, env, why):
    """NIGHTLY_CELL=0 (the session of 2026-12-05 that recorded learning-gtp-off and learning-sign-flip after
    the cell had passed: h200/2026-12-05-learning-other-halves) runs WAVE2's cases alone; a value other than
    0 or 1, or 0 with nothing in WAVE2, is bad input: exit 2 before anything starts (no setup, no Ray).
    Where it is 0, WAVE2's cases are the wave and the nightly's cell is launched only in the other branch."""
    out = tmp_path / "o"
    proc = subprocess.run(["bash", "integration/shared-gpu-h200.sh", "learning-evidence-bg"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "CARRY_TREES": str(tmp_path / "trees"), "OUT": str(out), **env})
    assert proc.returncode == 2 and f"refused: {why}" in proc.stdout, (proc.stdout, proc.stderr)
    assert "learning evidence started" not in proc.stdout, proc.stdout
    text = (ROOT / "integration" / "shared-gpu-h200.sh").read_text()
    inner = text[text.index("  learning-evidence-bg)"):text.index("  wait-learning-evidence)")]
    branch = inner[inner.index('if [ "$NIGHTLY_CELL" = 0 ]; then   # the other halves'):]
    alone, other = branch.split("\n      else", 1)
    assert "side_by_side $WAVE2" in alone and "tools/nightly.py" not in alone, alone
    assert "tools/nightly.py" in other.split("\n      fi\n      /tmp/nrl-run/venv/bin/ray stop")[0], other[:600]


def _upstream_tests_refused(tmp_path, var: str, value: str, why: str) -> str:
    """shared-gpu-h200.sh upstream-tests-bg with VAR=VALUE: refused with exit 2 and WHY before anything starts;
    the step's text."""
    proc = subprocess.run(["bash", "integration/shared-gpu-h200.sh", "upstream-tests-bg"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "CARRY_TREES": str(tmp_path / "trees"), "OUT": str(tmp_path / "o"), var: value})
    assert proc.returncode == 2 and f"refused: {var} is {why}, not '{value}'" in proc.stdout, (proc.stdout, proc.stderr)
    assert "upstream tests started" not in proc.stdout, proc.stdout
    return (ROOT / "integration" / "shared-gpu-h200.sh").read_text().split("  upstream-tests-bg)", 1)[1]


@pytest.mark.parametrize("timeout", ["0", "two", "-5", "1.5", "60s"])
def test_the_upstream_tests_refuse_a_per_test_timeout_that_is_not_whole_seconds(tmp_path, timeout):
    """UT_TEST_TIMEOUT (default 120) is tools/upstream_tests.py's --test-timeout on the GPU host: longer, for the
    known failures that timed out on both sides run again (--look-again 'ran past the per-test timeout'); a value
    that is not whole seconds exits 2 before anything starts."""
    step = _upstream_tests_refused(tmp_path, "UT_TEST_TIMEOUT", timeout, "whole seconds")
    assert 'UT_TEST_TIMEOUT=${UT_TEST_TIMEOUT:-120}' in step and '--test-timeout "$UT_TEST_TIMEOUT"' in step


@pytest.mark.parametrize("value", ["2", "yes", "true", " "])
def test_the_upstream_tests_run_one_side_at_a_time_only_when_told_with_0_or_1(tmp_path, value):
    """UT_ONE_SIDE=1 (default 0) passes --one-side-at-a-time to each run: the pristine side, then the patched, half the
    processes on the GPU for the tests a side of which ran out of its memory beside the other's (no verdict, run
    again); any value but 0 or 1 exits 2 before anything starts."""
    step = _upstream_tests_refused(tmp_path, "UT_ONE_SIDE", value, "0 or 1")
    assert "UT_ONE_SIDE=${UT_ONE_SIDE:-0}" in step
    run = step.split("  run() {", 1)[1].split("\n      }", 1)[0]
    assert '[ "$UT_ONE_SIDE" = 0 ] || order=(--one-side-at-a-time)' in run and '"${order[@]}"' in run, run
    # the run's own timeout outlasts its sides, one after the other or both at once, and its bisection: never
    # tighter than before (2 budgets and 300 s) for both at once
    (limit,) = re.findall(r"timeout -k 30 \$\(\((.+?)\)\) python3 tools/upstream_tests.py", run)
    for one_side, budget, bisect in ((1, 1000, 250), (1, 600, 900), (0, 1000, 250), (0, 600, 900)):
        got = subprocess.run(["bash", "-c", f"UT_ONE_SIDE={one_side} UT_BUDGET={budget} UT_BISECT_BUDGET={bisect}; "
                              f"echo $(({limit}))"], capture_output=True, text=True, check=True).stdout
        need = budget * (2 if one_side else 1) + bisect
        assert int(got) > need + 120 and (one_side or int(got) >= 2 * budget + 300), (limit, one_side, got)


@pytest.mark.parametrize("budget", ["0", "none", "-5", "2.5"])
def test_the_upstream_tests_refuse_a_bisection_budget_that_is_not_whole_seconds(tmp_path, budget):
    """UT_BISECT_BUDGET (default 240) is tools/upstream_tests.py's --bisect-budget on the GPU host: the seconds
    the bisection's probes share after the sides, inside the session's device time (a hundred fixed tests each
    stopping rank 0 alone on the pristine base would take hours of probes); a value that is not whole seconds
    exits 2 before anything starts."""
    step = _upstream_tests_refused(tmp_path, "UT_BISECT_BUDGET", budget, "whole seconds")
    assert 'UT_BISECT_BUDGET=${UT_BISECT_BUDGET:-240}' in step and '--bisect-budget "$UT_BISECT_BUDGET"' in step


@pytest.mark.parametrize("budget", ["0", "none", "-5", "2.5"])
def test_a_bisection_again_has_a_budget_of_its_own_in_whole_seconds(tmp_path, budget):
    """UT_MLM_BISECT_AGAIN_BUDGET (default UT_BISECT_BUDGET) is --bisect-again's --bisect-budget: its probes start
    with the shards, so they may take as long as the shards' sides, while the shards' own bisection keeps
    UT_BISECT_BUDGET after them; a value that is not whole seconds exits 2 before anything starts."""
    step = _upstream_tests_refused(tmp_path, "UT_MLM_BISECT_AGAIN_BUDGET", budget, "whole seconds")
    assert 'UT_MLM_BISECT_AGAIN_BUDGET=${UT_MLM_BISECT_AGAIN_BUDGET:-$UT_BISECT_BUDGET}' in step
    bisect = step.split('if [ -n "$UT_MLM_BISECT_AGAIN" ]; then', 1)[1].split("\n      fi", 1)[0]
    assert '--bisect-budget "$UT_MLM_BISECT_AGAIN_BUDGET"' in bisect and "$((UT_MLM_BISECT_AGAIN_BUDGET + 300))" in bisect
    shard = step.split("  run() {", 1)[1].split("\n      }", 1)[0]
    assert '--bisect-budget "$UT_BISECT_BUDGET"' in shard and "AGAIN_BUDGET" not in shard


@pytest.mark.parametrize("shards", ["10", "two", "-1", "1.5"])
def test_the_upstream_tests_refuse_a_shard_count_they_cannot_run(tmp_path, shards):
    """UT_MLM_SHARDS=K runs Megatron-LM's files in K parts side by side (tools/upstream_tests.py --shard I/K),
    each part in a workspace and an out folder of its own (a run locks its workspace; one part's results would
    overwrite another's); a count that is not 0 to 9 exits 2 before anything starts."""
    step = _upstream_tests_refused(tmp_path, "UT_MLM_SHARDS", shards, "0 to 9")
    step = step.split("\n  wait-upstream-tests)", 1)[0]
    # each part: its own workspace (applied for it), its own out folder and JSON, its own --shard
    assert '--workdir "/tmp/ut-work/$name" --only "$up"' in step and '--out "$U/$name" --json "$U/$name.report.json"' in step
    assert 'for up in $UT_ONLY "${shards[@]}"; do' in step and 'shards+=("megatron-lm-$i")' in step
    assert 'sh=(--shard "$i/$UT_MLM_SHARDS")' in step and 'name=megatron-lm-$i' in step
    # the tests come from the tests ferry (stage --tests-source), unpacked by shared-gpu-lib.sh's unpack_tests_ferry
    assert 'P=/tmp/ut-src;' in step and 'unpack_tests_ferry "$P"' in step, step[:800]
    assert '--tests-source megatron-lm="$P/megatron-lm"' in step and '--tests-source megatron-bridge="$P/megatron-bridge"' in step
    # the ferry's site (its [[tests]] wheels) on Megatron-LM's and Bridge's test path, never NeMo-RL's (its stand-ins)
    assert '[ "$up" != nemo-rl ] && [ -d "$P/site" ] && extra=("PYTHONPATH=$P/site")' in step, step[:800]


def test_a_cut_bisection_is_finished_beside_the_shards_or_alone(tmp_path):
    """UT_MLM_BISECT_AGAIN=RESULT: a committed Megatron-LM result whose bisection its budget cut is bisected again
    beside the shards (--bisect-again): its own workspace (applied for Megatron-LM), its own out folder, never
    --compared (refused with it) nor --budget (no side runs). UT_MLM_SHARDS=0 runs that bisection alone (no part,
    no part's workspace applied: a short session's device time); 0 without it would run nothing of Megatron-LM's
    and exits 2 before anything starts."""
    step = _upstream_tests_refused(tmp_path, "UT_MLM_SHARDS", "0", "1 to 9 without UT_MLM_BISECT_AGAIN")
    step = step.split("\n  wait-upstream-tests)", 1)[0]
    assert '[ "$up" = megatron-lm ] && [ "$UT_MLM_SHARDS" = 0 ] && continue' in step
    assert 'for i in $(seq 1 "$UT_MLM_SHARDS"); do' in step
    assert '[ -z "$UT_MLM_BISECT_AGAIN" ] || shards+=(megatron-lm-bisect)' in step
    assert 'u=${up%-bisect}; python3 tools/apply.py --series gtp --workdir "/tmp/ut-work/$up" --only "${u%-[0-9]}"' in step
    bisect = step.split('if [ -n "$UT_MLM_BISECT_AGAIN" ]; then', 1)[1].split("\n      fi", 1)[0]
    assert '--workdir /tmp/ut-work/megatron-lm-bisect --bisect-again "$UT_MLM_BISECT_AGAIN"' in bisect
    assert "--compared" not in bisect and "--budget " not in bisect and '--out "$U/megatron-lm-bisect"' in bisect
    assert "UT_MLM_AGAIN=" not in step


def test_the_gpu_script_passes_each_committed_result_and_the_known_failures_to_look_at_again(tmp_path):
    """compared_args (shared-gpu-lib.sh), the upstream tests' arguments on the GPU host: --compared for each
    committed GPU run of the upstream's tests (integration/h100, h200; never a bisection's), and for Megatron-LM
    --look-again for each ;-separated TEXT of UT_MLM_LOOK_AGAIN, whole (spaces and quotes kept, empty pieces
    dropped); nothing at all with UT_COMPARED=none, nor for an upstream UT_COMPARED does not name, and no
    --look-again where no result is passed (it would be refused)."""
    for run, up in (("h100/a/run", "megatron-lm"), ("h200/b/run", "megatron-lm"), ("h100/a/run", "nemo-rl")):
        (tmp_path / "integration" / run / up / up).mkdir(parents=True)
        (tmp_path / "integration" / run / up / up / "result.json.gz").write_bytes(b"")
    (tmp_path / "integration" / "h100/a/run/megatron-lm/bisect/k1/megatron-lm").mkdir(parents=True)
    (tmp_path / "integration" / "h100/a/run/megatron-lm/bisect/k1/megatron-lm/result.json").write_text("{}")

    def args(upstream: str, **env: str) -> list[str]:
        proc = subprocess.run(["bash", "-c", f". {ROOT}/integration/shared-gpu-lib.sh && compared_args {upstream}"],
                              cwd=tmp_path, capture_output=True, check=True,
                              env={k: v for k, v in os.environ.items() if not k.startswith("UT_")} | env)
        return proc.stdout.decode().split("\0")[:-1]

    mlm = ["--compared", "integration/h100/a/run/megatron-lm/megatron-lm/result.json.gz",
           "--compared", "integration/h200/b/run/megatron-lm/megatron-lm/result.json.gz"]
    assert args("megatron-lm") == mlm
    texts = "async def functions are not natively supported;;No module named 'causal_conv1d'"
    assert args("megatron-lm", UT_MLM_LOOK_AGAIN=texts) == mlm + [
        "--look-again", "async def functions are not natively supported", "--look-again", "No module named 'causal_conv1d'"]
    assert args("nemo-rl", UT_MLM_LOOK_AGAIN=texts) == ["--compared", "integration/h100/a/run/nemo-rl/nemo-rl/result.json.gz"]
    assert args("megatron-lm", UT_MLM_LOOK_AGAIN=texts, UT_COMPARED="none") == []
    # UT_COMPARED names the upstreams that go on where their runs stopped; the others run whole again
    assert args("megatron-lm", UT_COMPARED="megatron-lm") == mlm
    assert args("nemo-rl", UT_COMPARED="megatron-lm") == [] == args("megatron-lm", UT_COMPARED="nemo-rl megatron")
    assert args("nemo-rl", UT_COMPARED="megatron-lm nemo-rl") == args("nemo-rl", UT_COMPARED="all") == args("nemo-rl")
    shutil.rmtree(tmp_path / "integration" / "h100")
    shutil.rmtree(tmp_path / "integration" / "h200")
    assert args("megatron-lm", UT_MLM_LOOK_AGAIN=texts) == []
