"""gtp-carry prove / tools/prove.py."""

from __future__ import annotations

import sys
from pathlib import Path

from .. import options, report
from ..prove import prove

DESCRIPTION = """\
Run each patch's proof on the pristine base (must fail) and on the patched tree (must pass),
each in a fresh interpreter. Needs the workspaces from tools/apply.py. A proof that needs a GPU
reports 'skipped' without one, never 'pass'. Proofs whose folder has a requirements.txt
(proofs/nemo_rl/) run in an environment built once from it and cached (--cache)."""


def main(argv: list[str], prog: str) -> int:
    p = options.parser(prog, DESCRIPTION)
    options.add_series(p)
    options.add_workdir(p)
    options.add_only(p)
    options.add_json(p)
    options.add_timeout(p)
    p.add_argument("--logs", type=Path, metavar="DIR", help="keep each proof run's output here")
    options.add_cache(p)
    options.add_lock_timeout(p)
    a = p.parse_args(argv)
    series = options.load_series(a)
    rep = prove(series, a.workdir, options.comma_list(a.only), a.timeout, options.cache(a), a.logs, a.lock_timeout)
    options.write_report(a.json, rep.to_dict())
    rows = [[r.id, r.pristine, r.patched, {True: "ok", False: "FAILED", None: "not run here"}[r.ok],
             r.patched_detail if r.ok is None else (r.pristine_detail if r.pristine != "fail" else r.patched_detail)]
            for r in rep.proofs]
    print(report.table(rows, ["patch", "pristine", "patched", "verdict", "detail"]))
    bad = [r.id for r in rep.proofs if r.ok is False]
    if bad:
        print(f"error: proof not red/green for: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0
