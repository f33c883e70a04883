"""run-on-gpu-host, the host's setup: the environment from the image recipe's steps.

Setup (once per warm machine, idempotent), after checking first that this machine's glibc is
as new as the staged wheels' manylinux tags need (nvidia-resiliency-ext's: 2.39):
  1. the payload of the ``nrl`` ferry is unpacked into the run root;
  2. a venv with the host's torch visible (``--system-site-packages`` plus a .pth naming
     the site that holds torch: a venv of the host's venv does not see it otherwise);
  3. images/gtp-te219/steps/run-local.sh on that venv: step 10 (check), 20 (TE 2.20.2 from
     the "te" ferry's wheels, the prebuilt torch extension), 30 (the patched megatron-core
     and megatron-bridge wheels), 40 (the series' NeMo-RL patches onto a clone at the pin),
     90 (verify: versions, RECORD hashes, HAVE_GTP True);
  4. NeMo-RL's own dependencies: the staged wheels, each file checked against its RECORD,
     zipped again and installed with ``--no-index --no-deps``. (The image gets these from
     its NeMo-RL base; there is no such base here.) Then megatron-core is asked whether it
     sees FlashAttention-4 (``HAVE_FA4``, which its dynamic-batching attention needs: the
     staged flash-attn-4 is the only FlashAttention there); the answer goes into the setup
     log and on stdout. Step 90 runs before these wheels are in, so it cannot ask.
  5. the model: the staged config and tokenizer copied into ROOT/model, and its weights
     (Qwen2.5-0.5B's shape, ~1 GB in bf16) built there from the config and the stage's seed
     with the venv's torch on the CPU (fixtures.build_weights); their sha256 goes into the
     setup log and OUT/model.json. Built once: a later setup keeps them while config, seed
     and bytes still match.
The setup leaves setup.log, verify.json and model.json (the weights' sha256) in OUT, and
ROOT/venv-ready.json once the venv holds NeMo-RL's dependency wheels too (what runs in it waits for that).

This module also holds what both halves share: where everything lives on the host
(:class:`Layout`) and how the harness runs a child (:func:`stream`: carry.runner.stream, its output
to a log; :func:`child_env`).
Running a case is caserun.py.
"""

from __future__ import annotations

import json
import lzma
import os
import shutil
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from carry import progress, runner
from carry.errors import CommandError, IntegrityError, OperationError, UsageError
from carry.runner import run

from ..staging import wheel_lock, wheels
from . import cases as casing

HARNESS = Path(__file__).resolve().parents[1]
HERE = HARNESS.parent   # integration/nemo_rl_gtp
REPO = HERE.parents[1]
STUBS = HERE / "stubs"
HOOKS = HERE / "hooks"   # sitecustomize + the refit check, on PYTHONPATH for the cases that check their refit
FIXTURES_PY = HARNESS / "models" / "fixtures.py"     # run as scripts in the host's venv
MOE_FIXTURES_PY = HARNESS / "models" / "moe_fixtures.py"
PROBE_PY = HARNESS / "probes" / "probe_imports.py"
FA4_FLAG = "megatron.core.transformer.attention:HAVE_FA4"
SHIMS = HERE / "shims"
TE_SO = "transformer_engine_torch.cpython-312-x86_64-linux-gnu.so"
# Kept set in every child (shared/gpu/README.md): NVLink multicast must stay off.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@dataclass
class Layout:
    """Where everything lives on the GPU host (all under /tmp: gone when the machine goes cold)."""
    parts: Path          # where recv.sh unpacked the ferry: PARTS/nrl/{payload.tar.xz, manifest.json}
    root: Path           # the run root: the unpacked payload and what setup builds
    te: Path             # the unpacked "te" ferry (its te/ folder: wheels/, the .so)
    python: str = sys.executable
    model_dir: Path | None = None   # where the model is built (default ROOT/model; the dry-run keeps its own)

    @property
    def payload(self) -> Path:
        return self.root / "payload"

    @property
    def model(self) -> Path:
        return self.model_dir or self.root / "model"

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def vpython(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def nemo_rl_patched(self) -> Path:
        return self.root / "nemo-rl"

    @property
    def nemo_rl_pristine(self) -> Path:
        return self.root / "nemo-rl-pristine"

    @property
    def mcore_pristine(self) -> Path:
        return self.root / "pristine-site"

    @property
    def venv_ready(self) -> Path:
        """Written once the venv holds everything it gets (the image steps, then NeMo-RL's dependency wheels):
        what a step that runs in it waits for. verify.json alone came before the wheels: Megatron-LM's tests
        started in the venv while omegaconf was still being installed, and a side's only launch died of it
        (2026-12-06, h100/2026-12-06-mlm-three-shards)."""
        return self.root / "venv-ready.json"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def resume_checkpoints(self) -> Path:
        return self.root / "resume-checkpoints"

    def stage_doc(self) -> dict:
        return json.loads((self.payload / "stage.json").read_text())


# -- setup -------------------------------------------------------------------------------------
def require_parts(lay: Layout) -> Path:
    src = lay.parts / "nrl"
    if not (src / "manifest.json").exists():
        raise UsageError(f"no nrl ferry unpacked in {lay.parts} ({src / 'manifest.json'} is missing)",
                         hint="bash .ferry/recv.sh nrl /tmp/nrl (with each part), or pass --parts DIR")
    return src


def unpack_payload(lay: Layout) -> dict:
    src = require_parts(lay)
    manifest = json.loads((src / "manifest.json").read_text())
    xz = src / "payload.tar.xz"
    done = lay.root / ".payload-ok"
    if done.exists() and done.read_text().strip() == manifest["payload_sha256"] and lay.payload.exists():
        return manifest
    from carry.workspace.artifacts import sha256_file
    got = sha256_file(xz)
    if got != manifest["payload_sha256"]:
        raise IntegrityError(f"{xz}: sha256 {got}, the ferry's manifest says {manifest['payload_sha256']}")
    if lay.payload.exists():
        shutil.rmtree(lay.payload)
    lay.payload.mkdir(parents=True)
    progress.say(f"unpacking {xz} ({xz.stat().st_size / 1e6:.0f} MB)")
    with lzma.open(xz) as f, tarfile.open(fileobj=f, mode="r|") as tf:
        tf.extractall(lay.payload, filter="data")
    done.write_text(manifest["payload_sha256"] + "\n")
    return manifest


def host_site() -> str:
    """The site-packages that holds this interpreter's torch (the host's own venv)."""
    import importlib.util
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        raise OperationError(f"{sys.executable} has no torch: run-on-gpu-host needs the host's Python with torch")
    return str(Path(spec.origin).parents[1])


def make_venv(lay: Layout) -> None:
    if not lay.vpython.exists():
        run([lay.python, "-m", "venv", "--system-site-packages", str(lay.venv)])
    purelib = run([str(lay.vpython), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    # Appended after the venv's own site, so what the venv installs wins over the host's copies.
    Path(purelib, "zz-host-site.pth").write_text(host_site() + "\n")


def te_args(te: Path, nvcc: str | None) -> list[str]:
    """Step 20's TransformerEngine arguments from the te folder (the te ferry's te/): its wheels/ always; the
    torch extension prebuilt when te/ holds one, else built there from the source the stage put in wheels/
    (against the venv's torch: that needs NVCC, the path of nvcc on this host, or None)."""
    wheelhouse, so = te / "wheels", te / TE_SO
    if not wheelhouse.is_dir():
        raise UsageError(f"{wheelhouse} is missing (the te ferry's wheels)",
                         hint="copy .ferry/ from the staging machine and run: bash .ferry/recv.sh te /tmp/te")
    args = ["--te-wheelhouse", str(wheelhouse), "--te-no-deps"]
    if so.exists():
        return args + ["--te-torch-prebuilt", str(so)]
    if not list(wheelhouse.glob("transformer_engine_torch-*.tar.gz")):
        raise UsageError(f"{wheelhouse} has neither the TE torch extension's source nor {so.name} beside it",
                         hint="stage again (its te ferry carries the source), or put a prebuilt extension in " + str(te))
    if not nvcc:
        raise UsageError("the TE torch extension is built here from its source, and this host has no nvcc",
                         hint="install the CUDA toolkit that matches the host's torch (or put nvcc on PATH)")
    return args


def run_steps(lay: Layout, log) -> dict:
    ctx = lay.payload / "context"
    # Step 20 installs every wheel of the te folder (pybind11 among them), then builds the extension if need be.
    te = te_args(lay.te, shutil.which("nvcc"))
    if not (lay.nemo_rl_patched / ".git").exists():
        run(["git", "clone", "-q", str(lay.payload / "sources" / "nemo-rl.git"), str(lay.nemo_rl_patched)])
    argv = ["bash", str(ctx / "steps" / "run-local.sh"), "--wheelhouse", str(ctx / "wheelhouse"),
            "--venv", str(lay.venv), *te, "--nemo-rl", str(lay.nemo_rl_patched), "--cuda-archs", "90",
            "--json", str(lay.root / "verify.json")]
    rc = stream(argv, log, env=child_env({}))
    if rc != 0:
        raise OperationError(f"the image steps failed (exit {rc}): see {log.name}")
    return json.loads((lay.root / "verify.json").read_text())


def install_deps(lay: Layout, log) -> list[str]:
    house = lay.root / "wheelhouse-deps"
    shutil.rmtree(house, ignore_errors=True)
    built = [wheels.rezip(d, house) for d in sorted((lay.payload / "wheels").iterdir()) if d.is_dir()]
    argv = [str(lay.vpython), "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
            "--disable-pip-version-check", *map(str, built)]
    rc = stream(argv, log, env=child_env({}))
    if rc != 0:
        raise OperationError(f"installing NeMo-RL's dependency wheels failed (exit {rc}): see {log.name}")
    return [w.name for w in built]


def fa4_status(lay: Layout, log) -> dict:
    """Whether megatron-core in the venv sees FlashAttention-4: said in LOG and on stdout.

    Without it Megatron generation's dynamic-batching attention stops at its first forward.
    Informative only: the red cases do not generate, and a case's own log shows the failure.
    """
    try:
        res = run([str(lay.vpython), str(PROBE_PY), "--call", "importlib.metadata:version:flash-attn-4",
                   "--flag", FA4_FLAG, "flash_attn.cute"], check=False, env=child_env({}), cwd=lay.root, timeout=600)
        stdout, stderr = res.stdout, res.stderr
    except CommandError as exc:   # it hung: say so, the cases still run
        stdout, stderr = "", exc.message
    recs = [json.loads(x) for x in stdout.splitlines() if x.startswith("{")]
    get = lambda key: next((r for r in recs if key in r), {})  # noqa: E731
    flag, mod, ver = get("flag"), get("module"), get("call")
    out = {"have_fa4": flag.get("ok") is True, "flash_attn_4": ver.get("value", "").strip("'") or None,
           "import_flash_attn_cute": mod.get("error") or ("ok" if mod else None),
           "error": flag.get("error") or (None if flag else stderr.strip()[-500:] or "the probe said nothing")}
    line = (f"[run-on-gpu-host] {FA4_FLAG.replace(':', '.')} = {flag.get('value', '?')} (flash-attn-4 "
            f"{out['flash_attn_4'] or 'not installed'}; import flash_attn.cute: {out['import_flash_attn_cute']})"
            + (f"; {out['error']}" if out["error"] else ""))
    log.write(line + "\n")
    log.flush()
    print(line, flush=True)
    return out


def prepare_pristine(lay: Layout, python: str | None = None) -> None:
    """The red cases' trees: NeMo-RL at the pin without the series; pristine megatron-core."""
    if not (lay.nemo_rl_pristine / ".git").exists():
        run(["git", "clone", "-q", str(lay.payload / "sources" / "nemo-rl.git"), str(lay.nemo_rl_pristine)])
    if not lay.mcore_pristine.exists():
        run([python or str(lay.vpython), "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
             "--disable-pip-version-check", "--target", str(lay.mcore_pristine), str(pinned_mcore_wheel(lay))])


def pinned_mcore_wheel(lay: Layout) -> Path:
    """The pinned (pristine) megatron-core wheel among the staged sources."""
    src = lay.payload / "sources"
    found = sorted(src.glob("megatron_core-*.whl"))
    if len(found) != 1:
        raise IntegrityError(f"expected one pinned megatron-core wheel in {src}, found {len(found)}")
    return found[0]


def build_model(lay: Layout, log, python: str | None = None) -> dict:
    """ROOT/model: the staged config and tokenizer, and the weights built from them (fixtures.build_weights).

    The build runs in PYTHON (the venv's: the torch and transformers the run uses). Returns
    what build_weights reports: the seed, the config's sha256, each weight file's sha256.
    """
    doc = lay.stage_doc()["fixtures"]
    return build_weights_from_stage(log, lay.payload / doc["model"], lay.model, FIXTURES_PY, doc["seed"],
                                    "model", python or str(lay.vpython))


def build_weights_from_stage(log, src: Path, dest: Path, script: Path, seed: int, what: str, python: str) -> dict:
    """Copy a staged model folder (config, tokenizer) to DEST and build its weights there with
    ``SCRIPT weights DEST --seed SEED`` in PYTHON; log and return what the script reports."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.iterdir()):
        if f.is_file():
            shutil.copy2(f, dest / f.name)
    report = dest.parent / f".{dest.name}-weights.json"
    report.unlink(missing_ok=True)
    argv = [python, str(script), "weights", str(dest), "--seed", str(seed), "--json", str(report)]
    rc = stream(argv, log, env=child_env({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}), echo=False)
    if rc != 0 or not report.exists():
        raise OperationError(f"building the {what}'s weights in {dest} failed (exit {rc}): see {log.name}")
    built = json.loads(report.read_text())
    log.write(f"[run-on-gpu-host] {what} {dest}: seed {built['seed']}, {built['parameters']} parameters, "
              + ", ".join(f"{n} sha256 {h}" for n, h in built["files"].items())
              + (" (kept from an earlier build)" if built["reused"] else f" (built in {built['seconds']}s)") + "\n")
    log.flush()
    return built


def model_for(lay: Layout, case: casing.Case) -> Path:
    """The built model a case runs on: the dense one, or the MoE case's (models/moe_fixtures.py)."""
    from ..models import moe_fixtures

    return require_moe_model(lay) if case.shape == moe_fixtures.MODEL else require_model(lay)


def moe_model_dir(lay: Layout) -> Path:
    """Where the MoE model is built: beside the dense one (ROOT/model, or the dry-run's own)."""
    from ..models import moe_fixtures

    return lay.model.parent / moe_fixtures.DIR


def require_moe_model(lay: Layout) -> Path:
    from ..models import moe_fixtures

    if not (moe_model_dir(lay) / moe_fixtures.WEIGHTS_STAMP).exists():
        raise UsageError(f"no built MoE model in {moe_model_dir(lay)} (its weights are made by the setup)",
                         hint="run once without --skip-setup, from a stage that has fixtures/moe-model")
    return moe_model_dir(lay)


def build_moe_model(lay: Layout, log, python: str | None = None) -> dict | None:
    """As build_model, for the MoE model; None when the stage carries none."""
    doc = lay.stage_doc()["fixtures"]
    if "moe_model" not in doc:
        return None
    return build_weights_from_stage(log, lay.payload / doc["moe_model"], moe_model_dir(lay), MOE_FIXTURES_PY,
                                    doc["seed"], "MoE model", python or str(lay.vpython))


def require_model(lay: Layout) -> Path:
    """The built model, for a case (--skip-setup reuses what the setup built)."""
    from ..models.fixtures import WEIGHTS_STAMP
    if not (lay.model / WEIGHTS_STAMP).exists():
        raise UsageError(f"no built model in {lay.model} (its weights are made by the setup)",
                         hint="run once without --skip-setup")
    return lay.model


def check_platform() -> str:
    """Before anything else: pip would refuse a wheel whose manylinux tag needs a newer glibc."""
    need = wheels.check_glibc([a.file for a in wheel_lock.load(HERE / "wheels.toml").wheels])
    have = wheels.this_glibc()
    return f"glibc {have[0]}.{have[1]}" + (f" (the staged wheels need >= {need[0]}.{need[1]})" if need else "")


def setup(lay: Layout, log_path: Path) -> dict:
    require_parts(lay)
    libc = check_platform()
    lay.root.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(log_path, "a") as log:
        log.write(f"[run-on-gpu-host] {libc}\n")
        lay.venv_ready.unlink(missing_ok=True)   # a setup run again installs again: nothing waits on the old one
        manifest = unpack_payload(lay)
        make_venv(lay)
        verify = run_steps(lay, log)
        deps = install_deps(lay, log)
        lay.venv_ready.write_text(json.dumps({"verify_ok": verify.get("ok"), "deps": deps}, indent=2) + "\n")
        fa4 = fa4_status(lay, log)
        prepare_pristine(lay)
        model = build_model(lay, log)
        moe = build_moe_model(lay, log)
    (log_path.parent / "model.json").write_text(json.dumps(model, indent=2, sort_keys=True) + "\n")
    if moe is not None:
        (log_path.parent / "moe-model.json").write_text(json.dumps(moe, indent=2, sort_keys=True) + "\n")
    return {"manifest": manifest, "libc": libc, "verify_ok": verify.get("ok"), "deps": len(deps), "fa4": fa4,
            "model": model, "moe_model": moe, "seconds": round(time.monotonic() - t0, 1)}


# -- running a child -------------------------------------------------------------------------
def child_env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    for k, v in NO_MULTICAST.items():
        env.setdefault(k, v)
    env.update(extra)
    return env


def stream(argv: list[str], log, env: dict[str, str], cwd: Path | None = None, timeout: float | None = None,
           echo: bool = True) -> int:
    """Run ARGV with carry.runner.stream in its own process group; its output goes to LOG and (echo)
    to our stdout as it comes.

    A timeout takes down the whole group (Ray, the workers), and says so in the log: exit 124.
    """
    def put(text: str) -> None:
        log.write(text)
        log.flush()
        if echo:
            sys.stdout.write(text)
            sys.stdout.flush()

    put(f"$ {' '.join(argv)}\n")
    try:
        return runner.stream(argv, put, env=env, cwd=cwd, timeout=timeout or None, group=True, keepends=True)
    except CommandError as exc:
        if exc.returncode != 124:
            raise
        put(f"\n[run-on-gpu-host] killed after {timeout:g}s\n")
        return 124
