"""run-on-gpu-host, running one case on what the setup (setup.py) left.

Per case: a fresh copy of the NeMo-RL tree, ``ray start``, the functional script through a
``uv`` stand-in, ``ray stop`` always, and OUT/{run.log, metrics.json, exit_status, case.json};
then :func:`summarize` says what the case showed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from carry.errors import OperationError, UsageError
from carry.series.repo import load_series
from carry.workspace.artifacts import left_out_members

from . import cases as casing
from . import learning
from .setup import (
    HOOKS,
    REPO,
    SHIMS,
    STUBS,
    Layout,
    child_env,
    pinned_mcore_wheel,
    stream,
)


@dataclass
class Trees:
    """The trees a case runs on; None: what setup installed (patched) or prepared (pristine)."""
    nemo_rl: Path
    front: list[Path] = field(default_factory=list)   # first on PYTHONPATH (megatron trees)


def case_trees(lay: Layout, case: casing.Case, given: Trees | None) -> Trees:
    if given is not None:   # the nightly's trees (tonight's, or a bisection prefix)
        return Trees(given.nemo_rl, [with_compiled_parts(lay, t) for t in given.front])
    nrl = lay.nemo_rl_patched if case.nemo_rl == "patched" else lay.nemo_rl_pristine
    front = [lay.mcore_pristine] if case.megatron_core == "pristine" else []
    return Trees(nrl, front)


def with_compiled_parts(lay: Layout, tree: Path) -> Path:
    """A megatron-lm tree from tools/apply.py as the pinned wheel installs it.

    apply keeps the wheel's sources and leaves out what the pin's ``exclude`` names (its compiled
    extension, the dataset helpers ``helpers_cpp``): carry.workspace.artifacts.left_out_members says
    which, as for the upstream tests' trees. Run from such a tree, megatron-core cannot import them and
    Bridge's initialize_megatron stops at compile_helpers on rank 0. Returns TREE itself when it lacks
    nothing, else a fresh copy under ROOT/fronts with the pinned wheel's members added (the tree is
    left as the nightly made it).
    """
    if not (tree / "megatron" / "core").is_dir():
        return tree   # not a megatron-core tree (megatron-bridge's src)
    wheel = pinned_mcore_wheel(lay)
    pypi = load_series(lay.stage_doc()["series"]).upstream("megatron-lm").pypi   # the series the ferry was staged for
    missing = {name: got for name, got in left_out_members(wheel, pypi).items() if not (tree / name).exists()}
    if not missing:
        return tree
    dest = lay.root / "fronts" / tree.name
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(tree, dest, ignore=shutil.ignore_patterns(".git"), symlinks=True)
    for name, (data, mode) in missing.items():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_bytes(data)
        (dest / name).chmod(mode)
    return dest


def copy_tree(src: Path, dest: Path, script_from: Path | None) -> Path:
    """A scratch copy to run in (the script writes its logs under tests/functional/)."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns(".git"), symlinks=True)
    script = dest / casing.SCRIPT
    if not script.exists() and script_from is not None:
        # Pristine NeMo-RL has no such script (patch nrl 0004 adds it): run the series' script on it.
        script.write_bytes((script_from / casing.SCRIPT).read_bytes())
        script.chmod(0o755)
    return dest


def case_env(lay: Layout, trees: Trees, nrl: Path, out: Path, *, record: Path | None = None,
             case: casing.Case | None = None, shared_gpu: bool = False) -> dict[str, str]:
    # The hooks' sitecustomize runs in every Python of the case, Ray's workers included: the refit
    # check, and the shared-GPU mode's NCCL_HOSTID per process.
    hooked = case is not None and (case.refit_check or case.validation or bool(case.learning_mutation))
    hooks = [str(HOOKS)] if shared_gpu or hooked else []
    pythonpath = [str(p) for p in trees.front] + [str(nrl), str(STUBS), *hooks]
    env = {
        "PATH": f"{lay.venv / 'bin'}:{SHIMS}:{os.environ.get('PATH', '')}",
        "PYTHONPATH": ":".join(pythonpath),
        "NEMO_RL_PY_EXECUTABLES_SYSTEM": "1",      # workers run this venv's python, not uv venvs
        "HF_HOME": str(lay.root / "hf"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": str(out / "hf-datasets"),
        "NRL_MEGATRON_CHECKPOINT_DIR": str(out / "megatron-from-hf"),  # converted afresh per case
        "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1",
        # The script adds its checkout to git's safe.directory: keep that out of the host's config.
        "GIT_CONFIG_GLOBAL": str(out / "gitconfig"),
    }
    if hooks:
        # Every rank's refit-check line must reach run.log as printed: Ray would fold lines that differ
        # only in their numbers ("[repeated 2x across cluster]").
        env["RAY_DEDUP_LOGS"] = "0"
    if shared_gpu:
        env[SHARED_GPU_ENV] = "1"
    if case is not None:
        env.update(casing.case_env(case))
    if record is not None:
        env["CARRY_UV_RECORD"] = str(record)
    return child_env(env)


SHARED_GPU_ENV = "CARRY_SHARED_GPU"
SHARED_GPU_NOTE = ("shared-gpu: the Megatron workers share GPU 0, each process with its own "
                   "NCCL_HOSTID (NCCL over its socket transport); times are not GTP's price, per-rank memory is")


def ray_env(env: dict[str, str], gpus: int, shared_gpu: bool) -> dict[str, str]:
    """``ray start``'s environment, without CUDA_VISIBLE_DEVICES: Ray counts the GPUs itself, and
    in the shared-GPU mode takes ``--num-gpus`` logical GPUs over the one it counts (it refuses more
    than a CUDA_VISIBLE_DEVICES lists). The hooks' carry_shared_gpu then puts every logical GPU id on
    GPU 0 in each worker."""
    return {k: v for k, v in env.items() if k != "CUDA_VISIBLE_DEVICES"}


def ray_start(env: dict[str, str], log, gpus: int, shared_gpu: bool = False) -> int:
    return stream(["ray", "start", "--head", f"--num-gpus={gpus}", "--include-dashboard=false",
                    "--disable-usage-stats"], log, ray_env(env, gpus, shared_gpu))


@contextlib.contextmanager
def ray_cluster(env: dict[str, str], log, gpus: int, shared_gpu: bool, running: bool = False):
    """``ray start`` for one case, and ``ray stop --force`` after it, whatever happens in between, but
    only for a cluster this case started: when ``ray start`` fails (one is already running: another
    case's, another user's), stopping would kill that one ("Stopped all 32 Ray processes", seen on the
    H200 when a case started while another still ran). Yields ray start's exit status.

    RUNNING: a cluster started outside the harness is used as it is (NeMo-RL's init_ray attaches to
    it): neither started nor stopped here, so that cases side by side can share one (each takes its
    placement group of ``gpus`` logical GPUs from it)."""
    if running:
        log.write("[run-on-gpu-host] using the Ray cluster already running (--ray-running): "
                  "this case neither starts nor stops it\n")
        yield 0
        return
    rc = ray_start(env, log, gpus, shared_gpu)
    try:
        yield rc
    finally:
        if rc == 0:
            ray_stop(env, log)
        else:
            log.write("[run-on-gpu-host] not stopping Ray: this case did not start it\n")


def ray_stop(env: dict[str, str], log) -> int:
    return stream(["ray", "stop", "--force"], log, env, timeout=120)


def run_case(lay: Layout, case: casing.Case, out: Path, *, trees: Trees | None = None, timeout: float = 540,
             gpus: int = 2, model_form: str = "default", shared_gpu: bool = False, ray_running: bool = False) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("run.log", "metrics.json", "exit_status", "case.json", "case.log", "script-metrics.json",
                  "pretrain.json"):
        (out / stale).unlink(missing_ok=True)  # never judge what an earlier run left
    t = case_trees(lay, case, trees)
    nrl = copy_tree(t.nemo_rl, out / "nemo-rl", lay.nemo_rl_patched)
    doc = lay.stage_doc()
    data = lay.payload / doc["fixtures"]["data"]
    ckpt = lay.checkpoints
    if case.checkpoint == "save" and ckpt.exists():
        shutil.rmtree(ckpt)
    if case.checkpoint == "resume":
        ckpt = resume_folder(lay, case)
    env = case_env(lay, t, nrl, out, case=case, shared_gpu=shared_gpu)
    console = out / "case.log"
    t0 = time.monotonic()
    args: list[str] = []
    with open(console, "w") as log:
        log.write(f"[run-on-gpu-host] case {case.name}: {case.shows}\n[run-on-gpu-host] trees: nemo-rl "
                  f"{t.nemo_rl}, first on PYTHONPATH: {[str(p) for p in t.front] or 'none (the venv)'}\n")
        if shared_gpu:
            log.write(f"[run-on-gpu-host] {SHARED_GPU_NOTE}\n")
        rc = None
        try:
            try:
                model, more_env, _ = learning.model_for(lay, case, log, stream, model_form)
            except OperationError as exc:
                log.write(f"[run-on-gpu-host] FAIL: {exc.message}\n")
                raise _NoRun(1) from None
            env.update(more_env)
            args = casing.script_args(case, model, str(data), str(ckpt), validation_file(lay, case, out))
            with ray_cluster(env, log, gpus, shared_gpu, running=ray_running) as rc_ray:
                if rc_ray != 0:
                    rc = rc_ray
                    log.write(f"[run-on-gpu-host] ray start failed (exit {rc_ray})\n")
                else:
                    rc = stream(["bash", casing.SCRIPT, *args], log, env, cwd=nrl, timeout=timeout)
        except _NoRun as no:
            rc = no.rc
    exp_dir = nrl / Path(casing.SCRIPT).parent / Path(casing.SCRIPT).stem
    for name in ("run.log", "metrics.json"):
        if (exp_dir / name).exists():
            shutil.copy2(exp_dir / name, out / name)
    (out / "exit_status").write_text(f"{rc}\n")
    if case.refit_check or case.validation:
        learning.merge_metrics(out, gpus, refit=case.refit_check, tensors=learning.model_tensors(case),
                               last_step=casing.configured_steps(case))
    result = {"case": case.name, "expect": case.expect, "shows": case.shows, "exit_status": rc,
              "seconds": round(time.monotonic() - t0, 1), "args": args, "nemo_rl_tree": str(t.nemo_rl),
              "front": [str(p) for p in t.front],
              "gpu_mode": "shared-gpu" if shared_gpu else "gpu-per-rank", "ray": "running" if ray_running else "own",
              **({"timing_note": SHARED_GPU_NOTE} if shared_gpu else {}),
              "checkpoints": sorted(p.name for p in ckpt.glob("step_*")) if case.checkpoint != "none" else None}
    result.update(summarize(case, out, rc))
    (out / "case.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def validation_file(lay: Layout, case: casing.Case, folder: Path) -> str | None:
    """FOLDER/validation.jsonl for a validating case: the held-out set, the same rows the pretrain step
    left out (fixtures.write_validation, from the staged seed and GRPO prompts); None for the others."""
    if not case.validation:
        return None
    from ..models import fixtures
    doc = lay.stage_doc()["fixtures"]
    return str(fixtures.write_validation(folder / fixtures.VALIDATION_FILE, doc["seed"], lay.payload / doc["data"]))


class _NoRun(Exception):
    """The case stopped before its run started (its model could not be made)."""

    def __init__(self, rc: int):
        super().__init__(rc)
        self.rc = rc


# Lines with "Error" that are no error of the run: Ray's dashboard agent polling a metrics port it
# never got (no dashboard is started), and GRPO's step summary naming a metric ("Generation KL Error").
NOISE = ("Error fetching metrics from", "Generation KL Error:")
TEST = "grpo-megatron-generation-gtp"   # integration/nightly.toml: the script's gates and markers


def grpo_test(name: str = TEST):
    """A nightly entry for the functional script: the gates and markers a case is judged by (Case.test)."""
    from carry.nightly.config import load

    return next(t for t in load(REPO / "integration" / "nightly.toml").tests if t.name == name)


def case_spec(case: casing.Case):
    """The entry a case is judged by: its own, or the script's for the matrix cases (no entry of theirs)."""
    return grpo_test(case.test if case.test != casing.MATRIX_TEST else TEST)


def resume_folder(lay: Layout, case: casing.Case) -> Path:
    """A checkpoint folder holding only step RESUME_FROM of the patched case's, hard-linked (GBs)."""
    src = lay.checkpoints / f"step_{casing.RESUME_FROM}"
    if not src.is_dir():
        have = sorted(p.name for p in lay.checkpoints.glob("step_*"))
        raise UsageError(f"case {case.name}: no {src.name} in {lay.checkpoints} (there: {have or 'nothing'})",
                         hint="run the patched case first: it saves a checkpoint at every step")
    dest = lay.resume_checkpoints
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)

    def link_or_copy(a, b):
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    shutil.copytree(src, dest / src.name, copy_function=link_or_copy)
    return dest


STEP_LINE = re.compile(r"=+ Step (\d+)/(\d+) =+")
# Reported per step in case.json (the 1.1011 table, and what the learning gates read).
PER_STEP = ("validation/accuracy", "train/token_mult_prob_error", "train/baseline_reward/pct_mixed", "train/advantages/min",
            "train/advantages/max", "train/mean_total_reward", "train/approx_entropy", "train/grad_norm",
            learning.DRIFT, learning.CHANGED, learning.UNVERIFIED)


def summarize(case: casing.Case, out: Path, rc: int | None) -> dict:
    """What the case showed, for the lead's table (the nightly judges the patched case itself)."""
    from carry.nightly.judge import evaluate_gate, gated_steps, markers_found, numeric_metrics, step_markers_missing

    from carry.nightly.runlog import loads_object

    metrics, unreadable = {}, ""
    if (out / "metrics.json").exists():
        try:   # the judge's reader: a key twice is ambiguous, not the last value's
            metrics = numeric_metrics(loads_object((out / "metrics.json").read_text()))
        except ValueError as exc:
            metrics, unreadable = {}, f"metrics.json cannot be read: {str(exc)[:200]}"
    spec = case_spec(case)
    # The learning gate reads the held-out validation: every learning case has it (cases.py), a learning run
    # of the matrix too; a run recorded before it (cases.as_recorded) cannot show it and is judged without.
    gates = [g for g in spec.gates if case.validation or g.key != casing.GAIN]
    if case.validation and case.test != casing.LEARNING_TEST:
        gates += [g for g in grpo_test(casing.LEARNING_TEST).gates if g.key == casing.GAIN]
    results = [evaluate_gate(g, metrics) for g in gates]
    gate = results[0]   # token_mult_prob_error, the one the control reports
    # The nightly's rule too: every gated series shows every step (the case's configured count where it
    # sets one), so that last() cannot read step 4 of a series whose step 5 is missing.
    first = casing.RESUME_FROM + 1 if case.checkpoint == "resume" else 1
    _, gaps = gated_steps(gates, metrics, casing.configured_steps(case), first)
    gates_ok = all(r.ok for r in results) and not gaps
    log = (out / "run.log").read_text(errors="replace") if (out / "run.log").exists() else ""
    marks = markers_found(log, list(spec.markers) + list(case.markers))
    text = (out / "case.log").read_text(errors="replace") if (out / "case.log").exists() else ""
    errors = [ln.strip() for ln in text.splitlines()
              if ("Error" in ln or ln.startswith(("FAIL:", "BUG_HIT:"))) and "[run-on-gpu-host]" not in ln
              and not any(n in ln for n in NOISE)]
    # What the run said of its own outcome: a FAIL or BUG_HIT line is red whatever the exit status (the
    # nightly judge's rule); the gtp-off control reads its FAIL lines by its own rule below, its BUG_HIT lines so.
    said_failed = [e for e in errors if e.startswith(("FAIL:", "BUG_HIT:"))]
    steps_run = sorted({int(m.group(1)) for m in STEP_LINE.finditer(log)})
    # Every rank's refit-check line for every step the metrics name: the entry's step_markers, read
    # by the judge's own rule (whole lines, Ray's prefix allowed).
    steps = sorted(metrics.get(learning.STEPS_FROM) or {}, key=lambda x: int(x) if str(x).isdigit() else 0)
    unmarked = step_markers_missing(log, spec.step_markers, steps) if spec.step_markers else []
    errors += [f"FAIL: {u}" for u in unmarked]
    # Why it is red, named: each gate that failed, each marker or step marker missing, the exit status.
    reasons = ([unreadable] if unreadable else []) + (
               [f"gate {r.gate}: {r.detail}" for r in results if not r.ok] + [f"gated steps: {g}" for g in gaps]
               + [f"marker missing: {m!r}" for m, ok in marks.items() if not ok] + unmarked
               + ([f"exit status {rc}"] if rc != 0 else []))
    if case.name == "gtp-off" or casing.GTP_OFF in case.overrides:
        # The script's marker checks fail by design without GTP; the control is the metric.
        # The script stops (exit 1) at the first marker it misses and quotes it in its FAIL line; a FAIL
        # that quotes none of the entry's markers, or an exit without any FAIL line, is red.
        fails = [e for e in errors if e.startswith("FAIL:")]
        only_markers = rc == 0 or (bool(fails) and all(any(f"'{m}'" in e for m in spec.markers) for e in fails))
        said = [e for e in said_failed if e.startswith("BUG_HIT:")]   # its FAIL lines: the rule above
        observed = "green" if gate.value is not None and gates_ok and only_markers and not said else "red"
    else:
        said = said_failed
        observed = "green" if rc == 0 and gates_ok and all(marks.values()) and not unmarked and not said else "red"
    reasons += [f"the run said: {e[:200]}" for e in said]
    if case.checkpoint == "resume" and steps_run[:1] != [casing.RESUME_FROM + 1]:
        observed = "red"  # it did not pick up where the checkpoint left off
        errors.append(f"FAIL: resumed from step {casing.RESUME_FROM}, the run's steps were {steps_run}")
    # Per step, for the open question (1.1011 in NeMo-RL's GTP pull request): the issue asks whether
    # step 1's generation precedes the first refit; compare step 1 with step 2, GTP on vs off.
    per_step = metrics.get("train/token_mult_prob_error")
    # A mutation is as expected only when it is red for its own reason: a gate on each red_by metric failed.
    failed_keys = {g.key for g, r in zip(gates, results) if not r.ok}
    missing_red = [k for k in case.red_by if k not in failed_keys] if observed == "red" else []
    as_expected = observed == case.expect and not missing_red
    return {"observed": observed, "as_expected": as_expected, "gate": gate.gate, "gate_value": gate.value,
            "red_by": list(case.red_by), "red_by_missing": missing_red,
            "token_mult_prob_error_per_step": per_step if isinstance(per_step, dict) else None,
            "gate_detail": gate.detail,
            "gates": {r.gate: {"value": r.value, "ok": r.ok, "detail": r.detail} for r in results},
            "markers": marks, "step_markers": {"missing": unmarked, "patterns": [m.text for m in spec.step_markers]},
            "steps_run": steps_run,
            "validation": {k.rsplit("/", 1)[-1]: metrics[k] for k in (learning.START, learning.END, learning.GAIN)
                           if k in metrics} or None,
            "validation_by_sign": learning.validation_by_sign(log) if case.validation else None,
            "per_step": {k: metrics[k] for k in PER_STEP if isinstance(metrics.get(k), dict)},
            "reasons": reasons if observed == "red" else [], "first_error": errors[0][:300] if errors else None,
            "last_error": errors[-1][:300] if errors else None}
