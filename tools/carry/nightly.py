"""The nightly: every (series x image x test) cell of integration/nightly.toml, judged.

For each series the patched trees are built (carry.apply, all upstreams); then
each cell runs where its image says (this machine, ``docker run``, ``srun``
with a squashfs), bounded by a timeout, and is judged by carry.judge from
what it left: exit status, log, metrics. A failed cell is bisected over the
series (carry.bisect) when its check depends on the trees. Results go to
``OUT/cells/<cell>/run.json``, ``OUT/nightly.json``, ``OUT/junit.xml``,
``OUT/summary.md`` and one line per cell appended to the history file.

Test kinds:
- ``functional``: a NeMo-RL functional test script inside an image, through
  integration/nemo_rl_gtp/run-in-image.sh (capability guard, run.log and
  metrics.json collected);
- ``command``: any command line (e.g. integration/gtp_refit_mini/run.py);
- ``proof``: the series' proofs via carry.prove.run_proof, on the patched
  trees (must pass) and the pristine base (must fail, else ``vacuous``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from . import progress
from . import nightly_report as reports
from .apply import Options as ApplyOptions
from .apply import apply
from .bisect import BisectResult, PrefixTrees, bisect
from .errors import CarryError, ConfigError
from .judge import Verdict, deterministic_flags, judge, numeric_metrics, result_line
from .launch import (CONTAINER_ROOT, Mount, Plan, docker_killer, docker_plan, local_plan, run_logged,
                     slurm_plan)
from .manifest import PatchMeta, Series
from .nightly_config import Image, NightlyConfig, Spec, expand, expand_env
from .prove import run_proof
from .report import write_json
from .runner import run

REPO_ROOT = Path(__file__).resolve().parents[2]
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


@dataclass
class Cell:
    series: Series
    image: Image
    spec: Spec
    launcher: str
    patch: PatchMeta | None = None
    proof: str | None = None  # for proof cells: which of the patch's proofs

    @property
    def test(self) -> str:
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
            if spec.kind == "proof":
                wanted = set(spec.patches)
                for p in series.patches:
                    if not wanted or p.id in wanted:
                        out += [Cell(series, image, spec, launcher, p, proof) for proof in _proofs(p)]
            else:
                out.append(Cell(series, image, spec, launcher))
    return out


def _proofs(p: PatchMeta) -> tuple[str, ...]:
    """A patch's proofs (one file or several); none when it has no proof."""
    many = getattr(p, "proofs", None)
    return tuple(many) if many else ((p.proof,) if p.proof else ())


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
                           extra=[a for n in image.env for a in ("-e", n)])
    squashfs = expand_env(image.squashfs or "", f"image {image.name!r}: squashfs")
    if not squashfs:
        raise ConfigError(f"image {image.name!r} has no squashfs for --launcher slurm "
                          f"(its setting: {image.squashfs or 'none'}, empty here)",
                          hint="point it at the image exported with mksquashfs (integration/README.md)")
    return slurm_plan(squashfs=squashfs, argv=argv,
                      env=env, mounts=mounts, workdir=workdir, gpus=image.gpus,
                      time_limit_s=timeout)


def _tidy(key: str, value: str) -> str:
    """Drop the empty entries an unset optional variable leaves in a *PATH list (they mean cwd)."""
    if key.endswith("PATH"):
        return ":".join(x for x in value.split(":") if x)
    return value


def timeout_for(cell: Cell, opts: Options, cfg_default: float) -> float:
    return float(opts.timeout or cell.spec.timeout_s or cfg_default)


def visible_gpus() -> int:
    try:
        res = run(["nvidia-smi", "-L"], check=False, timeout=60)
    except CarryError:
        return 0
    return sum(1 for line in res.stdout.splitlines() if line.startswith("GPU ")) if res.ok else 0


# -- running one check ---------------------------------------------------------------------------
def run_check(cell: Cell, trees: dict[str, Path], out: Path, opts: Options, timeout: float) -> tuple[Verdict, dict]:
    """Run the cell's check once on the given trees; judge it. Used for the run and for bisection."""
    if out.exists():
        shutil.rmtree(out)  # never judge what an earlier run left here
    out.mkdir(parents=True)
    if cell.spec.kind == "proof":
        assert cell.patch is not None
        if cell.patch.upstream not in trees:
            return Verdict(status="skipped", reason=f"{cell.patch.upstream} was not applied in this run "
                                                    f"(--only): its proof has no tree"), {}
        o = run_proof(cell.series, cell.patch, trees, timeout, out, "patched", proof=cell.proof)
        v = Verdict(status={"pass": "passed", "skipped": "skipped"}.get(o.result, "failed"),
                    reason=o.detail if o.result != "error" else f"error: {o.detail}")
        return v, {"seconds": round(o.seconds, 1), "proof": cell.proof,
                   "log": str(out / f"{cell.patch.id}.patched.log")}
    need = cell.spec.gpus or (cell.image.gpus if cell.launcher == "local" else 0)
    if need and cell.launcher == "local":
        have = visible_gpus()
        if have < need:
            return Verdict(status="skipped", reason=f"needs {need} GPU(s), {have} visible (nvidia-smi)"), {}
    p = plan(cell, trees, out, opts, timeout)
    log = out / "console.log"
    killer = docker_killer(p.container) if p.container else None
    fin = run_logged(p, log, timeout=timeout, on_timeout=killer)
    text = log.read_text(errors="replace")
    metrics: dict = {}
    src = cell.spec.metrics
    if src == "result-line":
        metrics = numeric_metrics(result_line(text))
    elif src.startswith("file:"):
        f = out / src[5:]
        if f.exists():
            try:
                metrics = numeric_metrics(json.loads(f.read_text()))
            except ValueError as exc:
                text += f"\n[carry] {f.name} is not valid JSON: {exc}\n"
    marker_text = text
    run_log = out / "run.log"
    if run_log.exists():
        marker_text = run_log.read_text(errors="replace")
    v = judge(rc=fin.returncode, timed_out=fin.timed_out, text=text, metrics=metrics, gates=cell.spec.gates,
              markers=cell.spec.markers, timeout_s=timeout, launch_error=fin.error, marker_text=marker_text)
    info = {"seconds": round(fin.seconds, 1), "command": p.shell(), "log": str(log), "returncode": fin.returncode,
            "timed_out": fin.timed_out,
            "artifacts": sorted(str(x.relative_to(out)) for x in out.rglob("*") if x.is_file())}
    return v, info


def _proof_pristine(cell: Cell, trees: dict[str, Path], prefix: PrefixTrees, out: Path,
                    timeout: float) -> Verdict | None:
    """A passing proof must fail on its pristine base; else it proves nothing (vacuous)."""
    assert cell.patch is not None
    base = {**trees, cell.patch.upstream: prefix.pristine(cell.patch.upstream)}
    o = run_proof(cell.series, cell.patch, base, timeout, out, "pristine", proof=cell.proof)
    if o.result == "fail":
        return None
    return Verdict(status="vacuous",
                   reason=f"the proof does not fail on the pristine base ({o.result}: {o.detail[:200]})")


def depends_on_trees(cell: Cell) -> str | None:
    """Why bisecting this cell is pointless, or None when its check depends on the trees."""
    if cell.spec.kind == "proof" or cell.image.swaps_trees:
        return None
    if any("{tree:" in a for a in cell.spec.argv + cell.image.functional) or any("{tree:" in v for _, v in cell.spec.env):
        return None
    return (f"neither the test nor image {cell.image.name!r} puts the series' trees in play "
            f"({{tree:NAME}}, pythonpath, tree_mounts): a prefix would change nothing")


# -- the whole night -----------------------------------------------------------------------------
def run_nightly(cfg: NightlyConfig, opts: Options, load_series) -> list[dict]:
    history = reports.read_history(opts.history)
    runs: list[dict] = []
    for sname in opts.series or list(cfg.series):
        series = load_series(sname, cfg)
        wd_path = opts.workdir / series.name
        apply_error, digest, trees = None, "", {}
        try:
            rep = apply(series, ApplyOptions(workdir=wd_path, cache=opts.cache, sources=dict(opts.sources),
                                             only=opts.only))
            digest = rep.digest
            if rep.ok:
                trees = {u.name: Path(u.workspace) for u in rep.upstreams}
            else:
                apply_error = rep.error or "apply failed"
        except CarryError as exc:
            apply_error = exc.message
        scratch = opts.out / "trees" / series.name
        prefix = PrefixTrees(series, wd_path, scratch) if not apply_error else None
        for cell in cells(cfg, series, opts):
            progress.say(f"{cell.id}: running")
            timeout = timeout_for(cell, opts, cfg.timeout_s)
            cell_out = opts.out / "cells" / cell.id
            t0 = time.monotonic()
            if apply_error:
                v, info = Verdict(status="failed", reason=f"the series did not apply: {apply_error}"), {}
                cell_out.mkdir(parents=True, exist_ok=True)
            else:
                try:
                    v, info = run_check(cell, trees, cell_out / "artifacts", opts, timeout)
                    if cell.spec.kind == "proof" and v.status == "passed":
                        v = _proof_pristine(cell, trees, prefix, cell_out / "pristine", timeout) or v
                except CarryError as exc:
                    v, info = Verdict(status="failed", reason=f"could not run: {exc.message}"), {}
            record = {
                "run_id": opts.run_id, "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "cell": cell.id, "series": series.name, "image": cell.image.name, "test": cell.test,
                "kind": cell.spec.kind, "launcher": cell.launcher, "digest": digest, "seed": opts.seed,
                "patch": cell.patch.id if cell.patch else None, "watched": list(cell.spec.watched),
                **v.to_dict(), **info,
            }
            record["seconds"] = info.get("seconds", round(time.monotonic() - t0, 1))
            record["flags"] = list(v.flags) + deterministic_flags(
                v.metrics, reports.previous_run(history, cell.id, opts.run_id), cell.spec.watched)
            if v.status == "failed" and not apply_error and opts.bisect and cfg.bisect and cell.spec.bisect:
                why_not = depends_on_trees(cell)
                if why_not:
                    record["bisect"] = BisectResult(target=v.signature(), note=f"not bisected: {why_not}").to_dict()
                else:
                    record["bisect"] = _bisect(cell, v, prefix, cell_out / "bisect", opts, timeout).to_dict()
            write_json(cell_out / "run.json", record)
            runs.append(record)
    return runs


def _bisect(cell: Cell, v: Verdict, prefix: PrefixTrees, out: Path, opts: Options, timeout: float) -> BisectResult:
    order = prefix.order

    def probe(k: int) -> tuple[str, str, str]:
        progress.say(f"{cell.id}: bisect: patches 1..{k}")
        try:
            pv, _ = run_check(cell, prefix.trees(k), out / f"k{k:03d}", opts, timeout)
        except CarryError as exc:
            pv = Verdict(status="failed", reason=f"could not run: {exc.message}")
        return pv.signature(), pv.status, pv.reason

    return bisect(order, v.signature(), probe)


def write_outputs(runs: list[dict], opts: Options, cfg: NightlyConfig) -> None:
    ok = not any(r["status"] in ("failed", "vacuous") for r in runs)
    write_json(opts.out / "nightly.json", {"ok": ok, "run_id": opts.run_id, "seed": opts.seed,
                                           "config": str(cfg.path), "runs": runs})
    (opts.out / "junit.xml").write_text(reports.junit(runs))
    (opts.out / "summary.md").write_text(reports.summary(runs, opts.run_id, {
        "seed": opts.seed, "history": opts.history.name, "cells": len(runs)}))
    reports.append_history(opts.history, [reports.history_record(r) for r in runs])

# -- command line --------------------------------------------------------------------------------
def _load_series(name: str, cfg: NightlyConfig) -> Series:
    from .cli import load_series
    from .manifest import load

    if "/" in name:
        path = Path(name)
        return load((path if path.is_absolute() else cfg.root / path).resolve())
    return load_series(name)


def print_plans(cfg: NightlyConfig, opts: Options) -> None:
    """The command line each cell would run, without applying or running anything."""
    for sname in opts.series or list(cfg.series):
        series = _load_series(sname, cfg)
        trees = {u.name: (opts.workdir / series.name / u.name).absolute() for u in series.upstreams}
        for cell in cells(cfg, series, opts):
            out = (opts.out / "cells" / cell.id / "artifacts").absolute()
            if cell.spec.kind == "proof":
                print(f"# {cell.id}\nproof {cell.proof} (carry.prove.run_proof on the patched trees, "
                      f"then on the pristine {cell.patch.upstream})\n")
                continue
            p = plan(cell, trees, out, opts, timeout_for(cell, opts, cfg.timeout_s))
            print(f"# {cell.id} ({cell.launcher})\n{p.shell()}\n")


def nightly_main(argv: list[str]) -> int:
    from . import nightly_config
    from .cli import Parser, EPILOG, csv, name_paths
    from .sources import default_cache

    p = Parser(prog="tools/nightly.py", epilog=EPILOG + "; a vacuous cell counts as a failure",
                formatter_class=argparse.RawDescriptionHelpFormatter,
                description="Run the nightly matrix (series x image x test) and judge every cell:\n"
                            "passed, failed, skipped or vacuous (passed without its markers). A failed cell\n"
                            "is bisected over its series. Writes OUT/nightly.json, OUT/junit.xml,\n"
                            "OUT/summary.md and OUT/cells/<cell>/run.json; appends to the history file.")
    p.add_argument("--config", type=Path, default=REPO_ROOT / "integration" / "nightly.toml",
                   help="the matrix (default integration/nightly.toml)")
    p.add_argument("--out", type=Path, required=True, help="where this run's results go")
    p.add_argument("--workdir", type=Path, help="patched workspaces, one folder per series (default OUT/work)")
    p.add_argument("--history", type=Path, help="JSON-lines history to compare with and append to "
                                                "(default OUT/../nightly-history.jsonl)")
    p.add_argument("--series", help="comma-separated series (default: the matrix's)")
    p.add_argument("--images", help="comma-separated images to run on (e.g. host for CPU-only CI)")
    p.add_argument("--tests", help="comma-separated test names")
    p.add_argument("--launcher", choices=("docker", "slurm"), help="run container images with this launcher")
    p.add_argument("--source", action="append", metavar="NAME=PATH", help="as tools/apply.py --source")
    p.add_argument("--only", help="as tools/apply.py --only: patch ids and/or upstreams to apply (e.g. "
                                  "megatron-lm,megatron-bridge where NeMo-RL cannot be fetched)")
    p.add_argument("--cache", type=Path, help="download/base cache (as tools/apply.py)")
    p.add_argument("--run-id", help="name of this run (default: UTC time); also seeds {seed}")
    p.add_argument("--seed", type=int, help="the {seed} placeholder (default: derived from the run id)")
    p.add_argument("--timeout", type=float, help="seconds per check, overriding the matrix")
    p.add_argument("--no-bisect", action="store_true", help="do not bisect failed cells")
    p.add_argument("--print-commands", action="store_true",
                   help="print each cell's command line (docker run / srun / local) and exit")
    a = p.parse_args(argv)
    cfg = nightly_config.load(a.config.resolve())
    run_id = a.run_id or default_run_id()
    out = a.out.absolute()
    opts = Options(out=out, workdir=(a.workdir or out / "work").absolute(), cache=a.cache or default_cache(),
                   history=(a.history or out.parent / "nightly-history.jsonl").absolute(), run_id=run_id,
                   seed=a.seed if a.seed is not None else seed_for(run_id), sources=name_paths(a.source, "--source"),
                   only=csv(a.only), series=csv(a.series), images=csv(a.images), tests=csv(a.tests), launcher=a.launcher,
                   bisect=not a.no_bisect, timeout=a.timeout)
    for name in opts.images or []:
        if name not in cfg.images:
            raise ConfigError(f"--images names an unknown image {name!r}", hint=f"known: {', '.join(cfg.images)}")
    for name in opts.tests or []:
        if name not in [t.name for t in cfg.tests]:
            raise ConfigError(f"--tests names an unknown test {name!r}",
                              hint=f"known: {', '.join(t.name for t in cfg.tests)}")
    if a.print_commands:
        print_plans(cfg, opts)
        return 0
    runs = run_nightly(cfg, opts, _load_series)
    if not runs:
        raise ConfigError("the selection matched no cell", hint="check --series, --images and --tests")
    write_outputs(runs, opts, cfg)
    rows = [[r["series"], r["image"], r["test"], r["status"], (r.get("reason") or "")[:90]] for r in runs]
    from .report import table
    print(table(rows, ["series", "image", "test", "status", "reason"]))
    for r in runs:
        for flag in r.get("flags") or []:
            print(f"flag: {r['cell']}: {flag}")
        if r.get("bisect"):
            print(f"bisect: {r['cell']}: {r['bisect']['note']}")
    print(f"results in {out} (summary.md, junit.xml, nightly.json); history {opts.history}")
    return 1 if any(r["status"] in ("failed", "vacuous") for r in runs) else 0
