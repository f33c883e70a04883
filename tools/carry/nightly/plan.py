"""The nightly matrix unrolled into cells, and the command line each cell runs.

A cell is one (series x image x test), or one proof of one patch for a
``proof`` test. ``plan`` turns a cell into a carry.nightly.launch Plan: placeholders
expanded, the trees put on PYTHONPATH or mounted, the container's paths
substituted on a container launcher; ``proof_plan`` is a proof cell's run (the proof's
pytest, as carry.evidence.prove runs it). Nothing runs here (``--print-commands``
prints these plans).
"""

from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from ..errors import ConfigError
from ..evidence.prove import ProofCommand, proof_command
from ..series.manifest import PatchMeta, Series
from ..series.repo import REPO_ROOT
from .config import Image, NightlyConfig, Spec, expand, expand_env
from .gpus import SHARED_GPU_ENV, needs_gpus
from .launch import CONTAINER_ROOT, Mount, Plan, docker_plan, local_plan, slurm_plan

FUNCTIONAL_WRAPPER = "integration/nemo_rl_gtp/run-in-image.sh"


@dataclass
class Options:
    out: Path
    workdir: Path
    cache: Path
    history: Path
    run_id: str
    seed: int
    sources: dict[str, Path] = field(default_factory=dict)
    only: list[str] | None = None
    series: list[str] | None = None
    images: list[str] | None = None
    tests: list[str] | None = None
    launcher: str | None = None
    bisect: bool = True
    timeout: float | None = None
    canary: dict[str, Path] = field(default_factory=dict)  # NAME -> checkout of its main (carry.evidence.canary)
    shared_gpu: bool = False  # the shared-GPU mode: a cell's ranks share one GPU (gpus.py)
    tests_sources: dict[str, Path] = field(default_factory=dict)  # --tests-source: upstreams' own tests


@dataclass
class Cell:
    series: Series
    image: Image
    spec: Spec
    launcher: str
    patch: PatchMeta | None = None
    proof: str | None = None  # for proof cells: which of the patch's proofs
    upstream: str | None = None  # for upstream-tests cells: whose own tests

    @property
    def test(self) -> str:
        if self.upstream:
            return f"{self.spec.name}[{self.upstream}]"
        if not self.patch:
            return self.spec.name
        first = _proofs(self.patch)[0]
        extra = "" if self.proof in (None, first) else "/" + Path(self.proof.split("::")[0]).stem
        return f"{self.spec.name}[{self.patch.id}{extra}]"

    @property
    def id(self) -> str:
        raw = f"{self.series.name}--{self.image.name}--{self.test}"
        return raw.replace("[", "-").replace("]", "").replace("/", "-")


def default_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def seed_for(run_id: str) -> int:
    """A fresh seed per run: two nights never sample the same tokens on purpose."""
    return int(hashlib.sha256(run_id.encode()).hexdigest()[:8], 16) % (2**31 - 1)


# -- the matrix --------------------------------------------------------------------------------
def cells(cfg: NightlyConfig, series: Series, opts: Options) -> list[Cell]:
    out = []
    for spec in cfg.tests:
        if opts.tests and spec.name not in opts.tests:
            continue
        for name in spec.images:
            if opts.images and name not in opts.images:
                continue
            image = cfg.images[name]
            launcher = image.launcher if image.launcher == "local" or not opts.launcher else opts.launcher
            if spec.kind == "upstream-tests":
                out += [Cell(series, image, spec, launcher, upstream=u.name) for u in series.upstreams if u.tests]
            elif spec.kind == "proof":
                wanted = set(spec.patches)
                for p in series.patches:
                    if not wanted or p.id in wanted:
                        out += [Cell(series, image, spec, launcher, p, proof) for proof in _proofs(p)]
            else:
                out.append(Cell(series, image, spec, launcher))
    return out


def _proofs(p: PatchMeta) -> tuple[str, ...]:
    """A patch's proofs (one file or several); none when it has no proof."""
    return p.proofs


# -- planning a run ----------------------------------------------------------------------------
def plan(cell: Cell, trees: dict[str, Path], out: Path, opts: Options, timeout: float) -> Plan:
    spec, image = cell.spec, cell.image
    where = f"test {spec.name!r} on image {image.name!r}"
    local = cell.launcher == "local"
    values = {"seed": str(opts.seed), "run_id": opts.run_id}
    if local:
        values.update(python=image.python or sys.executable, repo=str(REPO_ROOT), out=str(out))
        values.update({f"tree:{k}": str(v) for k, v in trees.items()})
    else:
        values.update(python=image.python or "python3", repo=f"{CONTAINER_ROOT}/repo", out=f"{CONTAINER_ROOT}/out")
        values.update({f"tree:{k}": f"{CONTAINER_ROOT}/trees/{k}" for k in trees})
    env = {k: _tidy(k, expand(v, values, f"{where}: env {k}")) for k, v in spec.env}
    if opts.shared_gpu and needs_gpus(cell):
        env[SHARED_GPU_ENV] = "1"
    if image.pythonpath:
        # The trees go first, so they win over the image's installed copies (megatron is a
        # namespace package: megatron.core and megatron.bridge may come from different trees).
        front = []
        for name in image.pythonpath:
            if f"tree:{name}" not in values:
                raise ConfigError(f"image {image.name!r}: pythonpath names {name!r}, which has no tree here")
            sub = cell.series.upstream(name).python_path
            front.append(values[f"tree:{name}"] if sub in (".", "") else f"{values[f'tree:{name}']}/{sub}")
        env["PYTHONPATH"] = _tidy("PYTHONPATH", ":".join(front + [env.get("PYTHONPATH", "")]))
    if spec.kind == "functional" and image.functional:
        values["script"] = spec.script or ""
        argv = [expand(a, values, f"{where}: functional") for a in image.functional]
    elif spec.kind == "functional":
        if not image.workdir:
            raise ConfigError(f"{where}: a functional test needs the image's workdir (the NeMo-RL checkout)")
        argv = ["bash", f"{values['repo']}/{FUNCTIONAL_WRAPPER}", spec.script or "", values["out"]]
        env["CARRY_NEMO_RL_ROOT"] = expand_env(image.workdir, f"image {image.name!r}: workdir")
    else:
        argv = [expand(a, values, f"{where}: argv") for a in spec.argv]
    if local:
        return local_plan(argv=argv, env=env, cwd=REPO_ROOT)
    mounts = [Mount(REPO_ROOT, f"{CONTAINER_ROOT}/repo"), Mount(out, f"{CONTAINER_ROOT}/out", read_only=False)]
    mounts += [Mount(path, f"{CONTAINER_ROOT}/trees/{name}") for name, path in trees.items()]
    for tm in image.tree_mounts:
        if tm.upstream not in trees:
            raise ConfigError(f"image {image.name!r}: tree_mounts names {tm.upstream!r}, which has no tree here")
        mounts.append(Mount(trees[tm.upstream] / tm.subdir, expand_env(tm.target, f"image {image.name!r}")))
    for raw in image.mounts:
        text = expand_env(raw, f"image {image.name!r}: mounts")
        src, _, rest = text.partition(":")
        if not src:
            continue  # an optional mount whose variable is unset
        dst, _, mode = rest.partition(":")
        mounts.append(Mount(Path(src), dst or src, read_only=mode != "rw"))
    workdir = expand_env(image.workdir, f"image {image.name!r}: workdir") if image.workdir else None
    if cell.launcher == "docker":
        if not image.docker:
            raise ConfigError(f"image {image.name!r} has no docker reference for --launcher docker")
        # Unique per run, cell and attempt (bisection probes follow each other quickly).
        tag = hashlib.sha256(str(out).encode()).hexdigest()[:8]
        name = re.sub(r"[^a-z0-9_.-]", "-", f"carry-{opts.run_id}-{cell.id}"[:110].lower()) + f"-{tag}"
        return docker_plan(image=expand_env(image.docker, f"image {image.name!r}"), argv=argv, env=env,
                           mounts=mounts, workdir=workdir, name=name, gpus="all" if image.gpus else "",
                           pass_env=image.env)
    squashfs = expand_env(image.squashfs or "", f"image {image.name!r}: squashfs")
    if not squashfs:
        raise ConfigError(f"image {image.name!r} has no squashfs for --launcher slurm "
                          f"(its setting: {image.squashfs or 'none'}, empty here)",
                          hint="point it at the image exported with mksquashfs (integration/README.md)")
    return slurm_plan(squashfs=squashfs, argv=argv,
                      env=env, mounts=mounts, workdir=workdir, gpus=image.gpus,
                      time_limit_s=timeout)


def proof_plan(cell: Cell, trees: dict[str, Path], out: Path, python: str | None,
               cache: Path) -> tuple[Plan, ProofCommand]:
    """One run of a proof cell's proof on ``trees`` (the patched ones, its pristine base, a prefix):
    the pytest carry.evidence.prove runs, as a command of its own, its report files in ``out``. It is
    tied to whatever launches it (``launcher``: this process, or a Slurm step's daemon)."""
    assert cell.patch is not None
    cmd = proof_command(cell.series, cell.patch, trees, out, cell.proof, python, cache, parent="launcher")
    return local_plan(argv=cmd.argv, env=cmd.env, cwd=cmd.cwd, unset=cmd.unset), cmd


def _tidy(key: str, value: str) -> str:
    """Drop the empty entries an unset optional variable leaves in a *PATH list (they mean cwd)."""
    if key.endswith("PATH"):
        return ":".join(x for x in value.split(":") if x)
    return value


def timeout_for(cell: Cell, opts: Options, cfg_default: float) -> float:
    return float(opts.timeout or cell.spec.timeout_s or cfg_default)
