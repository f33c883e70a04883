"""run-on-gpu-host --dry-run: as much of the GPU host's run as a CPU machine can do, for real.

1. the ferry parts: joined, hash-checked, the manifest read (as recv.sh will);
2. the payload unpacked (as run-on-gpu-host will), every wheel checked against its RECORD
   and zipped again;
3. a Python 3.12 venv standing in for the GPU host: torch 2.11.0 and the host's other
   packages (wheels.toml [dryrun]) from the index, then the staged wheels exactly as they
   will be installed there (--no-index --no-deps); then the model's weights built from the
   staged config and seed exactly as the GPU host's setup builds them (fixtures.build_weights
   in that venv), once, in CACHE/dryrun-model, and kept while config, seed and bytes match;
4. the image steps that can run without a GPU: 10 (venvs), 30 (the patched megatron wheels),
   40 (the NeMo-RL patches onto the clone at the pin). Step 20 (TE) and 90 (verify:
   HAVE_GTP) need CUDA and the GPU host's glibc: not run, and said so;
5. the import closure of the GRPO path in that venv, for the patched trees and for each red
   case's trees (TransformerEngine cannot load here: the one Bridge module that imports it
   unconditionally gets a placeholder, and the report says so), megatron-core's
   get_async_strategy("nvrx") (Bridge's asynchronous checkpoint strategy: nvidia-resiliency-ext,
   imported at Megatron worker start), megatron-core's HAVE_FA4 (the dynamic-batching attention
   of Megatron generation needs a FlashAttention: FlashAttention-4's flash_attn.cute imports on
   this CPU, as the CuTe DSL only looks for a driver and picks its cu13 build without one, so the
   import and the flash-attn-4 version check are real here; no kernel is compiled or run), and
   NeMo-RL's calls into megatron-core and Bridge checked against the installed signatures
   (probe_signatures.py);
6. for each case, the functional script itself runs with the uv stand-in in record mode,
   which gives the exact examples/run_grpo.py command line; that command line is then
   loaded as run_grpo does it (config + every override, tokenizer, chat template,
   generation config, the dedicated-model decision), and with Ray started here
   (``ray start --head --num-gpus=0``), NeMo-RL's init_ray, a trivial actor, the data and the
   math environment actors are set up;
   (the learning cases load their config on the seed's model: the trained one has the same shape and
   is made on the GPU host; here the pretrain step runs end to end at --tiny, its acceptance
   failing as a model that learnt nothing must, and the refit check's hook is shown wrapping
   swap_model_weights in NeMo-RL's real worker module);
7. the commands the GPU host will run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from carry.errors import CarryError
from carry.runner import run

from ..host import caserun, setup
from ..host import cases as casing
from ..staging import ferry, wheel_lock, wheels
from .standin import (env_for, find_python312, grpo_args, install_staged, record_script, run_steps,
                      stand_in_venv, staged_version_conflicts, wheels_glibc_of)

PROBES = Path(__file__).resolve().parents[1] / "probes"   # scripts, run in the stand-in venv

GRPO_MODULES = (
    "nemo_rl.algorithms.grpo",
    "nemo_rl.models.policy.workers.megatron_policy_worker",
    "nemo_rl.models.generation.megatron.megatron_generation",
    "nemo_rl.models.generation.megatron.megatron_worker",
    "nemo_rl.models.megatron.setup",
    "nemo_rl.models.megatron.gtp",
    "nemo_rl.environments.math_environment",
    "nemo_rl.data.datasets.response_datasets",
    "megatron.bridge.training.checkpointing",
    "megatron.core.tensor_parallel.gtp_api",
    "megatron.core.dist_checkpointing.strategies.torch",
    "nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async",
    "hydra", "omegaconf", "ray", "datasets", "transformers",
    "flash_attn.cute",
)
# NeMo-RL's code on the GRPO + Megatron path whose calls into megatron.* are checked.
SIGNATURE_FILES = ("nemo_rl/models/policy/workers/megatron_policy_worker.py", "nemo_rl/models/megatron/**/*.py",
                   "nemo_rl/models/generation/megatron/*.py", "nemo_rl/algorithms/*.py", "nemo_rl/models/policy/*.py",
                   "nemo_rl/distributed/*.py")
# What a Megatron worker calls at start: Bridge's save path takes megatron-core's async strategy,
# "nvrx" by default, which imports nvidia-resiliency-ext's async checkpointing (the first H200
# attempt's workers died here when it was not staged).
CALLS = ("megatron.core.dist_checkpointing.strategies.torch:get_async_strategy:nvrx",)
# What megatron-core decides at import and the run needs True: FlashAttention-4 for the dynamic
# inference engine's attention (the second H200 attempt stopped at "No module named 'flash_attn'").
FLAGS = (setup.FA4_FLAG,)
SERIES_ONLY = ("nemo_rl.models.megatron.gtp",)  # added by the series: absent from pristine NeMo-RL by design


@dataclass
class Options:
    repo: Path
    cache: Path
    cases: list[casing.Case]
    python312: str | None = None
    work: Path | None = None          # scratch (default: a temp dir, removed at the end)
    venv: Path | None = None          # the stand-in venv (default CACHE/dryrun-venv, kept)
    model: Path | None = None         # where the model is built (default CACHE/dryrun-model, kept)
    ray: bool = True
    ferry_root: Path | None = None    # where .ferry/ is (default: the repo)
    parts_only: bool = False          # stop after the parts, the payload and the wheels' RECORDs
    results: list[dict] = field(default_factory=list)


def _say(o: Options, what: str, ok: bool | None, detail: str = "", **info) -> None:
    mark = {True: "ok  ", False: "FAIL", None: "n/a "}[ok]
    print(f"[dry-run] {mark} {what}" + (f": {detail}" if detail else ""), flush=True)
    o.results.append({"check": what, "ok": ok, "detail": detail, **info})


@dataclass
class _DryRun:
    """What a dry-run's steps hand on: its scratch, the payload's layout there, the wheels, the venv, Ray."""
    o: Options
    work: Path
    lay: setup.Layout | None = None
    built: list[Path] = field(default_factory=list)
    venv: Path | None = None
    ray_started: bool = False


def dry_run(o: Options) -> dict:
    own_work = o.work is None
    d = _DryRun(o, o.work or Path(tempfile.mkdtemp(prefix="nrl-dry-run.")))
    try:
        _steps(d)
    finally:
        if d.ray_started and d.venv is not None:
            subprocess.run(["ray", "stop", "--force"], env=env_for(d.venv, [setup.STUBS]), capture_output=True,
                           timeout=120)
        if own_work:
            shutil.rmtree(d.work, ignore_errors=True)
    return _finish(o)


def _steps(d: _DryRun) -> None:
    """The steps of the module's docstring, in its order; one whose failure leaves nothing to check ends the run."""
    if not _parts_and_payload(d) or d.o.parts_only:
        return
    _stand_in(d)
    _models(d)
    _image_steps(d)
    _import_closure(d)
    # 5a: the learning cases' pieces that run here (the GPU host trains the real shape)
    if any(c.refit_check for c in d.o.cases):
        check_refit_hook(d.o, d.lay, d.venv, PROBES / "probe_imports.py")
    if any(c.model == "trained" for c in d.o.cases):
        check_pretrain(d.o, d.lay, d.venv, d.work)
    _signatures(d)
    _cases(d)
    _host_commands(d.o)


def _parts_and_payload(d: _DryRun) -> bool:
    """1-2: the parts and the payload, every wheel against its RECORD; False when the run cannot go on."""
    o, work = d.o, d.work
    root = o.ferry_root or o.repo
    try:
        info = ferry.check(root, "nrl")
    except CarryError as exc:
        _say(o, "ferry nrl", False, exc.message)
        return False
    big = info["over_limit"]
    _say(o, "ferry nrl", not big, f"{len(info['parts'])} part(s), "
         + ", ".join(f"{b / 1e6:.1f} MB" for b in info["part_bytes"]) + (f"; too big for a call beside the working tree: {big}" if big else ""),
         sha256=info["sha256"])
    te = root / ".ferry" / "te.sha256"
    _say(o, "ferry te", te.exists() or None, f"{te.read_text().split()[1]} part(s)" if te.exists()
         else "not staged here (shared/gpu/stage-te.sh); needed on the GPU host")
    ferry.receive_local(root, "nrl", work / "parts")
    lay = setup.Layout(parts=work / "parts", root=work / "root", te=work / "te",
                       model_dir=o.model or o.cache / "dryrun-model")
    lay.root.mkdir(parents=True, exist_ok=True)
    manifest = setup.unpack_payload(lay)
    _say(o, "payload", True, f"{manifest['payload_bytes'] / 1e6:.1f} MB, series digest "
         f"{manifest['series_digest'][:12]}, {manifest['wheels']} wheels")
    d.lay = lay
    try:
        d.built = [wheels.rezip(w, work / "wheelhouse") for w in sorted((lay.payload / "wheels").iterdir())
                   if w.is_dir()]
    except CarryError as exc:
        _say(o, "wheels against RECORD", False, exc.message)
        return False
    _say(o, "wheels against RECORD", True, f"{len(d.built)} wheels checked and zipped again")
    return True


def _stand_in(d: _DryRun) -> None:
    """3: the stand-in of the GPU host: its venv, and the staged wheels installed as the host installs them."""
    o, built = d.o, d.built
    lk = wheel_lock.load(setup.HERE / "wheels.toml")
    venv = d.venv = stand_in_venv(o, lk, find_python312(o.python312))
    vpy = str(venv / "bin" / "python")
    need = wheels.glibc_needed([w.name for w in built])
    here = wheels_glibc_of(vpy)
    if need is not None:
        _say(o, "glibc the staged wheels need", None if here is None or here < need[0] else True,
             f">= {need[0][0]}.{need[0][1]} ({need[1]}); here " + ("unknown" if here is None else "%d.%d" % here)
             + "; run-on-gpu-host checks the host's first")
    res, foreign = install_staged(vpy, built, here, lk.python)
    _say(o, "staged wheels install (--no-index --no-deps)", res.ok, res.stderr.strip()[-300:] if not res.ok else
         f"{len(built)} into {venv}" + (f"; for the host's platform, as this glibc is older: "
                                        f"{', '.join(w.name for w in foreign)}" if foreign else ""))
    if res.ok:
        clash = staged_version_conflicts(vpy, [w.name for w in built])
        _say(o, "staged wheels' requirements against the host's packages", not clash,
             "; ".join(clash) if clash else "no staged wheel requires another version of what the host or "
                                             "the other staged wheels hold (pip check)")


def _models(d: _DryRun) -> None:
    """3b: the model, built as the GPU host's setup builds it (and the MoE model, when staged)."""
    o, lay, venv = d.o, d.lay, d.venv
    log_path = d.work / "model.log"
    with open(log_path, "w") as log:
        try:
            m = setup.build_model(lay, log, python=str(venv / "bin" / "python"))
        except CarryError as exc:
            m = None
            detail = exc.message + ": " + " | ".join(log_path.read_text().strip().splitlines()[-3:])
    if m is not None:
        detail = (f"{m['parameters']} parameters, seed {m['seed']}, "
                  + ", ".join(f"{n} sha256 {h}" for n, h in m["files"].items())
                  + (" (kept from an earlier dry-run)" if m["reused"] else f" (built in {m['seconds']}s)"))
    _say(o, "model weights (fixtures.build_weights, as the GPU host's setup)", m is not None, detail,
         model=str(lay.model), weights=m)
    with open(log_path, "a") as log:
        try:
            moe = setup.build_moe_model(lay, log, python=str(venv / "bin" / "python"))
            detail = "not staged" if moe is None else f"{moe['parameters']} parameters, seed {moe['seed']}"
        except CarryError as exc:
            moe, detail = False, exc.message
    _say(o, "MoE model weights (moe_fixtures.build_weights)", bool(moe) if moe is not None else None, detail,
         weights=moe or None)


def _image_steps(d: _DryRun) -> None:
    """4: the image steps that run without a GPU; the pristine trees of the red cases."""
    o, lay, venv = d.o, d.lay, d.venv
    run(["git", "clone", "-q", str(lay.payload / "sources" / "nemo-rl.git"), str(lay.nemo_rl_patched)])
    for step, ok, last in run_steps(lay, venv):
        _say(o, f"image step {step}", ok, last)
    _say(o, "image step 20-te", None, "not here: TransformerEngine's torch extension needs the GPU host "
         "(built there against torch 2.11+cu130, glibc >= 2.38)")
    _say(o, "image step 90-verify", None, "not here: it asks HAVE_GTP, which needs TE and CUDA")
    setup.prepare_pristine(lay, python=str(venv / "bin" / "python"))


def _import_closure(d: _DryRun) -> None:
    """5: the import closure of the GRPO path, per tree set a selected case runs on."""
    o, lay, venv = d.o, d.lay, d.venv
    probe = PROBES / "probe_imports.py"
    for label, front, nrl in (("patched", [], lay.nemo_rl_patched),
                              ("pristine-mcore", [lay.mcore_pristine], lay.nemo_rl_patched),
                              ("pristine-nemo-rl", [], lay.nemo_rl_pristine)):
        if not any(c.name == label or (label == "patched" and c.nemo_rl == c.megatron_core == "patched")
                   for c in o.cases):
            continue
        env = env_for(venv, front + [nrl, setup.STUBS])
        mods = [m for m in GRPO_MODULES if label != "pristine-nemo-rl" or m not in SERIES_ONLY]
        calls = [a for c in CALLS for a in ("--call", c)] + [a for f in FLAGS for a in ("--flag", f)]
        res = subprocess.run([str(venv / "bin" / "python"), str(probe), "--te-placeholder", *calls, *mods],
                             env=env, capture_output=True, text=True, timeout=900, cwd=nrl)
        recs = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
        for r in recs:
            if "module" in r:
                note = f" (TE placeholder in {', '.join(r['te_placeholder'])})" if r.get("te_placeholder") else ""
                ok, detail = r["ok"], (r.get("error") or "") + note
                if not ok and label == "pristine-nemo-rl":
                    # That tree lacks the series, its import fix (nrl-mcore-fsdp-names) too:
                    # the case is red by design, so this is what it shows, not a dry-run failure.
                    ok, detail = None, "expected without the series: " + detail
                _say(o, f"import [{label}] {r['module']}", ok, detail, where=r.get("where"))
            elif "call" in r:
                mod, func, arg = r["call"].split(":", 2)
                _say(o, f"call [{label}] {func}({arg!r}) of {mod}", r["ok"],
                     r.get("error") or f"returned a {r['returned']}", where=r.get("where"))
            elif "flag" in r:
                mod, name = r["flag"].split(":", 1)
                _say(o, f"flag [{label}] {mod}.{name}", r["ok"], r.get("error") or f"is {r['value']}",
                     where=r.get("where"))
        if not recs:
            _say(o, f"import [{label}]", False, res.stderr.strip()[-500:])


def _signatures(d: _DryRun) -> None:
    """5b: calls into megatron-core / Bridge the installed versions cannot take."""
    o, lay, venv = d.o, d.lay, d.venv
    sig = PROBES / "probe_signatures.py"
    nrl = lay.nemo_rl_patched
    files = sorted(p.relative_to(nrl).as_posix() for pat in SIGNATURE_FILES for p in nrl.glob(pat))
    res = subprocess.run([str(venv / "bin" / "python"), str(sig), str(nrl), *files],
                         env=env_for(venv, [nrl, setup.STUBS]), capture_output=True, text=True,
                         timeout=900, cwd=nrl)
    recs = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    found = [r for r in recs if "at" in r]
    summary = next((r for r in recs if r.get("summary")), None)
    _say(o, "calls into megatron-core/-bridge [patched]", summary is not None and not found,
         (f"{summary['files']} NeMo-RL files scanned" if summary else res.stderr.strip()[-300:])
         + "".join(f"; {r['at']} {r['call']}: {r['problem']}" for r in found[:8]))


def _cases(d: _DryRun) -> None:
    """6: each case's command line from its functional script, then its config, tokenizer, data and Ray set up."""
    o, lay, venv, work = d.o, d.lay, d.venv, d.work
    if o.ray:
        env = env_for(venv, [setup.STUBS])
        rs = subprocess.run(["ray", "start", "--head", "--num-gpus=0", "--num-cpus=2", "--include-dashboard=false",
                             "--disable-usage-stats"], env=env, capture_output=True, text=True, timeout=300)
        d.ray_started = rs.returncode == 0
        _say(o, "ray start --head (CPU)", d.ray_started, rs.stderr.strip()[-300:] if not d.ray_started else "")
    pconf = PROBES / "probe_config.py"
    for case in o.cases:
        t = caserun.case_trees(lay, case, None)
        recorded = record_script(lay, case, venv, work, t.front, t.nemo_rl)
        args = grpo_args(recorded)
        _say(o, f"[{case.name}] functional script's command line", args is not None,
             f"{len(args)} run_grpo.py arguments" if args else "the script never reached run_grpo.py",
             commands=[" ".join(r["argv"]) for r in recorded])
        if args is None:
            continue
        tree = work / f"nemo-rl-{case.name}"
        env = env_for(venv, t.front + [tree, setup.STUBS], {"HF_DATASETS_CACHE": str(work / "hf-datasets")})
        res = subprocess.run([str(venv / "bin" / "python"), str(pconf), "--nemo-rl", str(tree),
                              *(["--ray"] if d.ray_started else []), "--", *args],
                             env=env, capture_output=True, text=True, timeout=900, cwd=tree)
        try:
            doc = json.loads(res.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            doc = {"ok": False, "error": res.stderr.strip()[-800:], "steps": []}
        for s in doc.get("steps", []):
            detail = {k: v for k, v in s.items() if k != "step"}
            _say(o, f"[{case.name}] {s['step']}", True, json.dumps(detail, default=str)[:400])
        if not doc["ok"]:
            expected = case.expect == "red"
            _say(o, f"[{case.name}] run_grpo.py setup", False if not expected else None,
                 ("expected for this red case: " if expected else "") + doc.get("error", "")
                 + (f" (cause: {doc['cause']})" if doc.get("cause") else ""), where=doc.get("where"))


def _host_commands(o: Options) -> None:
    """7: what the GPU host will run."""
    print("[dry-run] on the GPU host, for each case:")
    for case in o.cases:
        print(f"  {case.name}: ray start --head --num-gpus=2 --include-dashboard=false; "
              f"(cd <nemo-rl copy> && bash {casing.SCRIPT} "
              + " ".join(casing.script_args(case, "<model>", "<train.jsonl>", "<checkpoints>",
                                                 "<validation.jsonl>"))
              + "); ray stop --force")


def check_refit_hook(o: Options, lay: setup.Layout, venv: Path, probe: Path) -> None:
    """hooks/sitecustomize with CARRY_REFIT_CHECK=1 wraps swap_model_weights in NeMo-RL's real worker module."""
    mod = "nemo_rl.models.generation.megatron.megatron_worker"
    env = env_for(venv, [lay.nemo_rl_patched, setup.STUBS, setup.HOOKS], {"CARRY_REFIT_CHECK": "1"})
    res = subprocess.run([str(venv / "bin" / "python"), str(probe), "--te-placeholder", "--flag",
                          f"{mod}:CARRY_REFIT_CHECK_WRAPPED", mod], env=env, capture_output=True, text=True,
                         timeout=900, cwd=lay.nemo_rl_patched, check=False)
    recs = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    flag = next((r for r in recs if "flag" in r), None)
    wrapped = "[refit-check] wrapping " + mod + ".swap_model_weights" in res.stdout
    _say(o, "refit check hook on the worker module", bool(flag and flag["ok"] and wrapped),
         (flag or {}).get("error") or ("wraps swap_model_weights" if wrapped else res.stderr.strip()[-300:]))


def check_pretrain(o: Options, lay: setup.Layout, venv: Path, work: Path) -> None:
    """pretrain.py end to end in the stand-in at --tiny: it trains, evaluates, writes its figures, fails the
    acceptance (a tiny model trained for 2 steps learns nothing: the failure path), and reuses its weights."""
    from ..host import learning

    fx = learning.pretrain_fixtures(lay)
    out = work / "pretrain-tiny"
    argv = [str(venv / "bin" / "python"), str(learning.PRETRAIN_PY), "--out", str(out), "--fixtures", str(fx),
            "--tiny", "--steps", "2", "--batch", "4", "--held-out", "16", "--device", "cpu"]
    env = env_for(venv, [])
    first = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=False)
    again = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=False)
    doc = json.loads((out / "pretrain.json").read_text()) if (out / "pretrain.json").exists() else {}
    ok = (first.returncode == again.returncode == 1 and "not accepted" in first.stderr
          and "reusing" in again.stdout and {"accuracy", "entropy", "train_seconds", "reward_rule"} <= set(doc))
    _say(o, "pretrain step plumbing (--tiny, acceptance expected to fail)", ok,
         f"accuracy {doc.get('accuracy')}, entropy {doc.get('entropy')}, {doc.get('reward_rule')}" if ok
         else (first.stderr.strip()[-400:] or first.stdout.strip()[-400:]))


def _finish(o: Options) -> dict:
    failed = [r for r in o.results if r["ok"] is False]
    print(f"[dry-run] {sum(r['ok'] is True for r in o.results)} ok, {len(failed)} failed, "
          f"{sum(r['ok'] is None for r in o.results)} not checkable here")
    return {"ok": not failed, "results": o.results}
