"""gtp-carry prove / tools/prove.py."""

from __future__ import annotations

import sys
from pathlib import Path

from .. import report, shell
from ..evidence import tesite
from ..evidence.prove import prove
from . import options

DESCRIPTION = """\
Run each patch's proof on the pristine base (must fail) and on the patched tree (must pass).
Each run forks from a zygote (an interpreter per prove that has imported torch and the other
modules no tree provides, never a tree); where torch sees a CUDA device, and with --fresh, each
run is a fresh interpreter instead. Needs the workspaces from tools/apply.py. A proof that needs a GPU
reports 'skipped' without one, never 'pass'. Proofs whose folder has a requirements.txt
(proofs/nemo_rl/) run in an environment built once from it and cached (--cache).

A proof that cannot run here (a module no tree provides is missing, a rank forked after CUDA
was initialised, no test body started) is an 'error' of the environment, not a red proof:
exit 2 when that is all that went wrong; exit 1 when a proof is not red/green."""


def main(argv: list[str], prog: str) -> int:
    p = options.parser(prog, DESCRIPTION)
    options.add_series(p)
    options.add_workdir(p)
    options.add_only(p)
    options.add_json(p)
    options.add_timeout(p)
    p.add_argument("--fresh", action="store_true",
                   help="run every proof in a fresh interpreter, without the zygote (the verdicts are the same)")
    p.add_argument("--logs", type=Path, metavar="DIR", help="keep each proof run's output here")
    options.add_cache(p)
    options.add_lock_timeout(p)
    tesite.add_option(p)
    a = p.parse_args(argv)
    series = options.load_series(a)
    tesite.use(a.te_site)
    rep = prove(series, a.workdir, options.comma_list(a.only), a.timeout, options.cache(a), a.logs, a.lock_timeout,
                fresh=a.fresh)
    options.write_report(a.json, rep.to_dict())
    rows = [[r.id, r.pristine, r.patched, _verdict(r), _detail(r)] for r in rep.proofs]
    print(report.table(rows, ["patch", "pristine", "patched", "verdict", "detail"]))
    bad = [r.id for r in rep.proofs if r.ok is False]
    if bad:
        print(f"error: proof not red/green for: {', '.join(bad)}", file=sys.stderr)
    if rep.errors:
        print(f"error: proof could not run here (the environment, not the tree) for: {', '.join(rep.errors)}",
              file=sys.stderr)
        print("next: give the proof what it imports (see the detail column), then " + shell.run_again(),
              file=sys.stderr)
    if rep.all_skipped and not bad:
        print(f"error: every selected proof skipped ({len(rep.proofs)}): this prove showed nothing of the series",
              file=sys.stderr)
        print("next: run it where the proofs can run (the detail column says what they need), then "
              + shell.run_again(), file=sys.stderr)
    return 1 if bad else 2 if rep.errors or rep.all_skipped else 0


def _verdict(r) -> str:
    if "error" in (r.pristine, r.patched):
        return "ERROR"
    return {True: "ok", False: "FAILED", None: "not run here"}[r.ok]


def _detail(r) -> str:
    if r.pristine == "error" or (r.patched != "error" and r.ok is not None and r.pristine != "fail"):
        return r.pristine_detail
    return r.patched_detail
