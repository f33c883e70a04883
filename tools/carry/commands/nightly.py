"""gtp-carry nightly / tools/nightly.py."""

from __future__ import annotations

import sys
from pathlib import Path

from .. import progress
from ..errors import ConfigError
from ..evidence import canary, proofenv, tesite
from ..nightly import config as nightly_config
from ..nightly import slurm, stop, upstream
from ..nightly.gpus import needs_gpus
from ..nightly.config import NightlyConfig
from ..nightly.plan import Options, cells, default_run_id, plan, proof_plan, seed_for, timeout_for
from ..nightly.run import all_proofs_skipped, night_ok, run_canaries, run_nightly, write_outputs
from ..report import table
from ..series.manifest import Series, load
from ..series.repo import REPO_ROOT, load_series
from . import options


def _load_series(name: str, cfg: NightlyConfig) -> Series:
    """A series the matrix names: a name in patches/, or a folder relative to the matrix."""
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
            timeout = timeout_for(cell, opts, cfg.timeout_s)
            note = ""
            if cell.spec.kind == "proof":
                python = proofenv.python_path(series, cell.proof, opts.cache)
                p, _ = proof_plan(cell, trees, out, python, opts.cache)
                note = (f": {cell.proof} on the patched trees; then the same command, in "
                        f"{out.parent / 'pristine'}, on the pristine base of {cell.patch.upstream}")
            elif cell.spec.kind == "upstream-tests":
                pin = cell.series.upstream(cell.upstream).tests
                p = upstream.plan(cell, out, opts, timeout)
                note = f": {cell.upstream}'s own tests ({pin.describe()}, {pin.launch}), pristine against patched"
            else:
                p = plan(cell, trees, out, opts, timeout)
            if slurm.as_step(cell, opts.launcher):
                p = slurm.step_plan(p, cell.id, timeout, needs_gpus(cell))
            print(f"# {cell.id} ({cell.launcher}){note}\n{p.shell()}\n")


def fetch_mains(cfg: NightlyConfig, opts: Options) -> dict[str, str]:
    """Each --canary PATH brought up to its upstream's main (carry.evidence.canary.fetch_main), before
    the night; NAME -> why, for each that could not be."""
    if not opts.canary:
        raise ConfigError("--fetch-mains fetches into the --canary paths, and none is given",
                          hint="add --canary NAME=PATH for each upstream (a bare repository, kept between nights)")
    errors = {}
    for name, path in opts.canary.items():
        url = cfg.mains.get(name)
        if not url:
            raise ConfigError(f"--fetch-mains: the matrix's [canary] mains has no URL for {name!r}",
                              hint=f"add {name} = \"<git URL>\" to [canary] mains in {cfg.path}")
        progress.say(f"canary: fetching {name} {cfg.main_branch} from {url} into {path}")
        head, why = canary.fetch_main(url, path, cfg.main_branch)
        if why:
            errors[name] = why
            progress.say(f"canary: {name}: {why}")
    return errors


DESCRIPTION = """\
Run the nightly matrix (series x image x test) and judge every cell:
passed, failed, skipped or vacuous (passed without its markers). A failed cell
is bisected over its series. Writes OUT/nightly.json, OUT/junit.xml,
OUT/summary.md and OUT/cells/<cell>/run.json; appends to the history file."""


def main(argv: list[str], prog: str) -> int:
    p = options.parser(prog, DESCRIPTION, options.EPILOG + "; a vacuous cell counts as a failure")
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
    options.add_sources(p)
    p.add_argument("--canary", action="append", metavar="NAME=PATH",
                   help="also run the canary against upstream NAME's main: PATH a git checkout or mirror whose "
                        "HEAD is main (repeat per upstream); its verdicts go into the summary as warnings")
    p.add_argument("--fetch-mains", action="store_true",
                   help="before the night, fetch each --canary PATH (a bare repository, made on the first night and "
                        "reused after) from the upstream main the matrix's [canary] mains names; an upstream whose "
                        "main cannot be fetched is the canary's error, never last night's verdicts")
    options.add_only(p, help="as tools/apply.py --only: patch ids and/or upstreams to apply (e.g. "
                             "megatron-lm,megatron-bridge where NeMo-RL cannot be fetched)")
    options.add_cache(p)
    p.add_argument("--run-id", help="name of this run (default: UTC time); also seeds {seed}")
    p.add_argument("--seed", type=int, help="the {seed} placeholder (default: derived from the run id)")
    p.add_argument("--timeout", type=float, help="seconds per check, overriding the matrix")
    p.add_argument("--no-bisect", action="store_true", help="do not bisect failed cells")
    p.add_argument("--shared-gpu", action="store_true",
                   help="the shared-GPU mode: a cell whose ranks take a GPU each runs them all on one GPU, each "
                        "process with its own NCCL_HOSTID (CARRY_SHARED_GPU=1 in its environment); its times are "
                        "marked as not GTP's price, its per-rank memory counts (integration/README.md)")
    options.add_tests_source(p,
                   help="for the upstream-tests cells: a git clone, or a folder of the pinned paths, holding upstream "
                        "NAME's tests commit (default: fetched once into the cache)")
    p.add_argument("--print-commands", action="store_true",
                   help="print each cell's command line (docker run / srun / local) and exit")
    tesite.add_option(p)
    a = p.parse_args(argv)
    tesite.use(a.te_site)  # before the matrix: its ${CARRY_TE_SITE:-} is expanded from the environment
    cfg = nightly_config.load(a.config.resolve())
    run_id = a.run_id or default_run_id()
    out = a.out.absolute()
    opts = Options(out=out, workdir=(a.workdir or out / "work").absolute(), cache=options.cache(a),
                   history=(a.history or out.parent / "nightly-history.jsonl").absolute(), run_id=run_id,
                   seed=a.seed if a.seed is not None else seed_for(run_id),
                   sources=options.name_paths(a.source, "--source"), only=options.comma_list(a.only),
                   series=options.comma_list(a.series, "--series"), images=options.comma_list(a.images, "--images"),
                   tests=options.comma_list(a.tests, "--tests"), launcher=a.launcher,
                   bisect=not a.no_bisect, timeout=a.timeout, canary=options.name_paths(a.canary, "--canary"),
                   shared_gpu=a.shared_gpu,
                   tests_sources=options.tests_sources(a))
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
    slurm.preflight((c for s in opts.series or list(cfg.series) for c in cells(cfg, _load_series(s, cfg), opts)),
                    opts.launcher)
    with stop.catching():
        return _night(cfg, opts, a.fetch_mains)


def _night(cfg: NightlyConfig, opts: Options, fetch: bool) -> int:
    fetch_errors, canaries = {}, []
    try:
        fetch_errors = fetch_mains(cfg, opts) if fetch else {}
    except stop.Stopped:
        pass  # run_nightly names every cell as not run
    warnings: list[str] = []
    runs = run_nightly(cfg, opts, _load_series, warnings)
    if not runs:
        raise ConfigError("the selection matched no cell", hint="check --series, --images and --tests")
    if opts.canary and not stop.stopped():
        try:
            canaries = run_canaries(cfg, opts, _load_series, fetch_errors)
        except stop.Stopped:
            canaries = []
    halted = stop.stopped()
    write_outputs(runs, opts, cfg, warnings, canaries, halted)
    out = opts.out
    rows = [[r["series"], r["image"], r["test"], r["status"], (r.get("reason") or "")[:90]] for r in runs]
    print(table(rows, ["series", "image", "test", "status", "reason"]))
    for r in runs:
        for flag in r.get("flags") or []:
            print(f"flag: {r['cell']}: {flag}")
        if r.get("bisect"):
            print(f"bisect: {r['cell']}: {r['bisect']['note']}")
    for c in canaries:
        counts = ", ".join(f"{sum(r.verdict == k for r in c.rows)} {k}" for k in canary.VERDICTS)
        print(f"canary {c.upstream} main {c.head[:12] or '?'}: {counts}")
    for w in canary.warnings(canaries):
        print(f"warning: {w}")
    print(f"results in {out} (summary.md, junit.xml, nightly.json); history {opts.history}")
    if halted:
        left = sum(bool(r.get("stopped")) for r in runs)
        print(f"stopped by {halted}: {len(runs) - left} cell(s) judged, {left} not; the next night starts afresh",
              file=sys.stderr)
        return halted.exit_code
    if all_proofs_skipped(runs):
        print("error: every proof cell skipped: the night proved nothing of the series (not green)", file=sys.stderr)
    return 0 if night_ok(runs) else 1
