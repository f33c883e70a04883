"""The two command lines: ``stage`` (here) and ``run-on-gpu-host`` (there, or --dry-run here)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

from carry import progress
from carry.commands.options import EPILOG, Parser, name_paths
from carry.errors import UsageError
from carry.files import write_json
from carry.series.repo import load_series
from carry.workspace.sources import default_cache

from .host import cases as casing
from .host import learning

HERE = Path(__file__).resolve().parents[1]
REPO = HERE.parents[1]
RAY_RUNNING_ENV = "CARRY_NRL_RAY_RUNNING"   # --ray-running's default: on when it is "1"


def guarded(entry, argv: list[str] | None = None) -> int:
    """Run a command, turning the library's typed errors into its message and exit code."""
    import sys

    from carry.cli import guarded as run_guarded

    return run_guarded(entry, sys.argv[1:] if argv is None else argv)


def _cache_default() -> Path:
    return default_cache() / "nemo_rl_gtp"


# What stage imports beyond the standard library (pip downloads the wheels; the tokenizer is trained
# with tokenizers and written with transformers; packaging reads TE's requirements): the test extra holds them.
STAGE_NEEDS = ("pip", "tokenizers", "transformers", "packaging")


def _stage_needs(*modules: str) -> None:
    """A missing dependency is one clear error naming what to install, before anything is downloaded."""
    import importlib.util
    import sys

    from carry.shell import line

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        install = line(sys.executable, "-m", "pip", "install", "-e", f"{Path(__file__).resolve().parents[3]}[test]")
        if "pip" in missing:
            install = f"{line(sys.executable, '-m', 'ensurepip')} && {install}"
        raise UsageError(f"stage needs {', '.join(missing)}, which {sys.executable} does not have "
                         f"(the test extra holds them)", hint=f"install the test extra: `{install}`")


def stage_main(argv: list[str]) -> int:
    from .staging import stage as staging
    from .staging import wheels

    p = Parser(prog="integration/nemo_rl_gtp/stage", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
               description="Prepare NeMo-RL's GRPO + GTP run for an offline GPU host, on a machine that reaches the\n"
                           "package index: fetch and hash-check every wheel in wheels.toml, write the config of a\n"
                           "Qwen2.5-0.5B-shaped model (its ~1 GB of weights are built on the GPU host from it and\n"
                           "the seed), its tokenizer and the arithmetic data (fixed seed), apply the series (the patched\n"
                           "megatron wheels of images/gtp-te219, the pinned pristine sources), and pack it all as\n"
                           "the 'nrl' ferry under .ferry/ (in parts, --part-mib). TransformerEngine >= 2.19 goes to the GPU\n"
                           "host as the 'te' ferry: its pinned wheels ([[te]] of wheels.toml) and the torch extension's\n"
                           "source, which the host builds against its own torch and CUDA (--no-te: the host has TE).\n"
                           "Prints what to copy there and the commands to run there (docs/guide/offline-gpu-host.md).")
    p.add_argument("--series", default="gtp", help="series name or folder (default gtp)")
    p.add_argument("--source", action="append", metavar="NAME=PATH",
                   help="as tools/apply.py --source (e.g. nemo-rl=CHECKOUT with the pinned commit)")
    p.add_argument("--cache", type=Path, help="downloads, bases and the staging folder "
                                               "(default $GTP_CARRY_CACHE/nemo_rl_gtp or ~/.cache/gtp-carry/nemo_rl_gtp)")
    p.add_argument("--workdir", type=Path, help="apply workspaces (default CACHE/work)")
    p.add_argument("--seed", type=int, default=1234, help="seed of the model, tokenizer and data (default 1234)")
    p.add_argument("--no-pack", action="store_true", help="stop after the staging folder; write no parts")
    p.add_argument("--xz-level", type=int, default=9, choices=range(0, 10), metavar="0-9",
                   help="xz preset of the payload (default 9: the fewest parts; 1 packs in a fraction of the "
                        "time on a small machine, for about one part more)")
    p.add_argument("--part-mib", type=int, default=0, choices=range(16, 57), metavar="16-56",
                   help="size of a ferry part, for a link that limits each transfer (default: what fits 64 MB beside the working "
                        "tree that travels with it, less 2 MiB, at most 56)")
    p.add_argument("--no-te", action="store_true",
                   help="write no 'te' ferry (the GPU host has TransformerEngine >= 2.19 already)")
    p.add_argument("--tests-source", action="append", metavar="NAME=CLONE",
                   help="also write the 'tests' ferry: NAME's own unit tests at the commit series.toml pins "
                        "([upstreams.NAME.tests]), from CLONE (a clone that has the commit, or a folder of the pinned "
                        "paths), for tools/upstream_tests.py on the GPU host; repeatable (megatron-lm, megatron-bridge)")
    p.add_argument("--relock", action="store_true",
                   help="re-download the pins of wheels.toml and rewrite their file names and sha256; then stop")
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the report as JSON")
    a = p.parse_args(argv)
    _stage_needs("pip") if a.relock else _stage_needs(*STAGE_NEEDS)
    cache = (a.cache or _cache_default()).absolute()
    if a.relock:
        changed = wheels.relock(staging.LOCK, cache)
        print("\n".join(changed) if changed else "wheels.toml: every pin already matches the index")
        return 0
    series = load_series(a.series)
    opts = staging.Options(out=cache / "stage", cache=cache, workdir=(a.workdir or cache / "work").absolute(),
                           series=series, sources=name_paths(a.source, "--source"), seed=a.seed, pack=not a.no_pack,
                           xz_level=a.xz_level, part_mib=a.part_mib, te=not a.no_te,
                           tests_sources=name_paths(a.tests_source, "--tests-source"))
    res = staging.stage(opts)
    if a.json:
        write_json(a.json, res)
    doc = res["stage"]
    print(f"staged in {res['payload']} ({res['seconds']:.0f}s): {len(doc['wheels'])} wheels, series "
          f"{doc['series']} digest {doc['series_trees']['series_digest'][:12]}, seed {doc['fixtures']['seed']}")
    print("\n".join(stage_next(res)))
    return 0


def stage_next(res: dict) -> list[str]:
    """What stage's report tells the user to do next: on their own GPU host, not on any machine of ours."""
    if not res.get("parts"):
        return []
    lines = [f"ferry nrl: payload {res['payload_mb']} MB in {len(res['parts'])} part(s) under .ferry/: "
             + ", ".join(f"{Path(p).name} {mb} MB" for p, mb in zip(res["parts"], res["part_mb"]))]
    if res.get("te_parts"):
        lines.append(f"ferry te: TransformerEngine, {res['te_mb']} MB in {len(res['te_parts'])} part(s) under .ferry/ "
                     f"({', '.join(res['te_files'])})")
        te = ("`bash .ferry/recv.sh te /tmp/te` the same for TransformerEngine (its torch extension is built there: "
              "the host needs nvcc), ")
    else:
        te = "TransformerEngine >= 2.19 installed there (--no-te), "
    if res.get("tests_parts"):
        lines.append(f"ferry tests: {', '.join(res['tests_upstreams'])}'s own unit tests, {res['tests_mb']} MB in "
                     f"{len(res['tests_parts'])} part(s) under .ferry/; on the GPU host `bash .ferry/recv.sh tests DIR`, "
                     f"then each DIR/tests/NAME.tar.xz unpacked is tools/upstream_tests.py's --tests-source NAME=FOLDER")
    lines.append("next, on the GPU host: copy this repository there with its .ferry/ folder; there, "
                 "`bash .ferry/recv.sh nrl /tmp/nrl` joins the parts, checks their sha256 and unpacks them, " + te +
                 "then `integration/nemo_rl_gtp/run-on-gpu-host` runs the cases (docs/guide/offline-gpu-host.md)")
    return lines


def gpuhost_main(argv: list[str]) -> int:
    from .host import setup as hostsetup

    a = _gpuhost_parser().parse_args(argv)
    if a.setup_only and (a.skip_setup or a.pretrain_only or a.dry_run):
        other = "--skip-setup" if a.skip_setup else "--pretrain-only" if a.pretrain_only else "--dry-run"
        raise UsageError(f"--setup-only and {other} do not go together", hint="drop one of them")
    selected = casing.select([c.strip() for c in a.cases.split(",") if c.strip()])
    if a.dry_run:
        return _dry_run(a, selected)
    lay = hostsetup.Layout(parts=a.parts, root=a.root, te=a.te)
    out = (a.out or a.root / "out").absolute()
    report: dict = {"cases": []}
    if not a.skip_setup:
        report["setup"] = _setup(lay, out)
    elif not lay.vpython.exists():
        raise UsageError(f"--skip-setup, but there is no environment in {lay.root}", hint="run once without it")
    if a.setup_only:
        return 0
    if a.pretrain_only:
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "pretrain.log", "w") as log:   # trained_model leaves pretrain.json beside it
            learning.trained_model(lay, log, hostsetup.stream)
        return 0
    return _run_cases(a, lay, out, selected, report)


def _gpuhost_parser() -> Parser:
    p = Parser(prog="integration/nemo_rl_gtp/run-on-gpu-host", epilog=EPILOG,
               formatter_class=argparse.RawDescriptionHelpFormatter,
               description="On the offline GPU host, as root: build the environment with images/gtp-te219's steps from\n"
                           "the 'nrl' and 'te' ferries, then run NeMo-RL's GRPO functional test\n"
                           "(tests/functional/grpo_megatron_generation_gtp.sh) for each case: ray start, the run,\n"
                           "ray stop (always). Each case leaves run.log, metrics.json, exit_status, case.json and\n"
                           "case.log in OUT (OUT/<case>/ when several run). --dry-run does everything that can be\n"
                           "done on this CPU machine instead and prints the commands.\n\ncases:\n"
                           + "\n".join(f"  {c.name:31s} expected {c.expect}: {c.shows}" for c in casing.CASES.values()))
    p.add_argument("--cases", default=os.environ.get("CARRY_NRL_CASES") or "patched",
                   help="comma-separated cases (default $CARRY_NRL_CASES, else patched)")
    p.add_argument("--model", choices=learning.MODEL_FORMS, default="default",
                   help="default: each case's own (the seed's weights, or after the pretrain step for the learning "
                        "cases); released: Qwen/Qwen2.5-0.5B from Hugging Face for every case (a host that reaches it)")
    p.add_argument("--out", type=Path, help="where the results go (default ROOT/out)")
    p.add_argument("--parts", type=Path, default=Path("/tmp/nrl"), help="where recv.sh unpacked the nrl ferry")
    p.add_argument("--te", type=Path, default=Path("/tmp/te/te"), help="the unpacked te ferry's te/ folder")
    p.add_argument("--root", type=Path, default=Path("/tmp/nrl-run"), help="run root: the environment and scratch")
    p.add_argument("--timeout", type=float, default=float(os.environ.get("CARRY_NRL_CASE_TIMEOUT") or 480.0),
                   help="seconds per case before it is killed (default $CARRY_NRL_CASE_TIMEOUT, else 480; the "
                        "nightly's gpu-host cells inherit the variable)")
    p.add_argument("--gpus", type=int, default=2, help="GPUs given to ray start (default 2)")
    p.add_argument("--skip-setup", action="store_true", help="use the environment an earlier call built")
    p.add_argument("--ray-running", action="store_true", default=os.environ.get(RAY_RUNNING_ENV) == "1",
                   help="use the Ray cluster already running on this host (started outside the harness, e.g. "
                        "`ray start --head --num-gpus=4` for two cases side by side): no ray start, no ray stop "
                        f"(default: on when {RAY_RUNNING_ENV}=1, which a nightly's gpu-host cell inherits)")
    p.add_argument("--shared-gpu", action="store_true", default=os.environ.get("CARRY_SHARED_GPU") == "1",
                   help="the shared-GPU mode: the --gpus Megatron workers all on GPU 0, each process with its own "
                        "NCCL_HOSTID (default: on when CARRY_SHARED_GPU=1, as tools/nightly.py --shared-gpu sets "
                        "it); times are then not GTP's price, per-rank memory is")
    p.add_argument("--setup-only", action="store_true", help="the setup alone (OUT/setup.log, OUT/verify.json), no case")
    p.add_argument("--pretrain-only", action="store_true",
                   help="after the setup (or with --skip-setup), only the learning cases' pretrain step on GPU 0 "
                        "(cached by its inputs' sha256): OUT/pretrain.log and OUT/pretrain.json; exit 1 if not accepted")
    p.add_argument("--nemo-rl-tree", type=Path, help="run on this NeMo-RL tree instead (the nightly's)")
    p.add_argument("--front", action="append", type=Path, default=[], metavar="DIR",
                   help="put DIR first on PYTHONPATH (the nightly's megatron trees); repeatable")
    p.add_argument("--dry-run", action="store_true", help="here, on the CPU: check the parts and the imports, parse "
                                                           "the config with every override, load tokenizer and data, "
                                                           "start Ray; print the commands")
    p.add_argument("--python312", help="dry-run: a Python 3.12 to build the check venv with")
    p.add_argument("--parts-only", action="store_true",
                   help="dry-run: check the parts, the payload and the wheels only (no venv, no Ray)")
    p.add_argument("--ferry-root", type=Path, help="dry-run: the checkout whose .ferry/ to check (default this one)")
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the report as JSON")
    return p


def _dry_run(a: argparse.Namespace, selected: list[casing.Case]) -> int:
    from .dryrun import run as dryrun

    rep = dryrun.dry_run(dryrun.Options(repo=REPO, cache=_cache_default(), cases=selected, python312=a.python312,
                                        ferry_root=a.ferry_root, parts_only=a.parts_only))
    if a.json:
        write_json(a.json, rep)
    return 0 if rep["ok"] else 1


def _setup(lay, out: Path) -> dict:
    """The host's setup (host/setup.py); its log and verify report go to OUT, to come back with the results."""
    from .host import setup as hostsetup

    progress.say("setting up the environment (image steps, dependency wheels)")
    out.mkdir(parents=True, exist_ok=True)  # the setup's log and verify report come back with the results
    try:
        return hostsetup.setup(lay, out / "setup.log")
    finally:
        if (lay.root / "verify.json").exists():
            shutil.copy2(lay.root / "verify.json", out / "verify.json")


def _run_cases(a: argparse.Namespace, lay, out: Path, selected: list[casing.Case], report: dict) -> int:
    """Each selected case in turn (host/caserun.py); the report on stdout (and in --json); the exit code."""
    from .host import caserun

    trees = None
    if a.nemo_rl_tree is not None:
        trees = caserun.Trees(a.nemo_rl_tree.absolute(), [f.absolute() for f in a.front])
    elif a.front:
        raise UsageError("--front goes with --nemo-rl-tree")
    failed = []
    for case in selected:
        where = out if len(selected) == 1 else out / case.name
        res = caserun.run_case(lay, case, where, trees=trees, timeout=a.timeout, gpus=a.gpus, model_form=a.model,
                               shared_gpu=a.shared_gpu, ray_running=a.ray_running)
        report["cases"].append(res)
        print(f"[run-on-gpu-host] {case.name}: exit {res['exit_status']} in {res['seconds']:.0f}s "
              f"(expected {case.expect}); results in {where}", flush=True)
        if res["exit_status"] != 0:
            failed.append(case.name)
    if a.json:
        write_json(a.json, report)
    print(json.dumps({"cases": [{k: r[k] for k in ("case", "expect", "exit_status", "seconds")}
                                for r in report["cases"]]}))
    if failed and len(selected) == 1:
        return int(report["cases"][0]["exit_status"] or 1)
    return 1 if failed else 0
