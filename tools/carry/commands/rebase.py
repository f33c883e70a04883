"""gtp-carry rebase / tools/rebase.py."""

from __future__ import annotations

import sys
from pathlib import Path

from .. import report
from ..evidence.rebase import rebase
from . import options

DESCRIPTION = """\
Re-apply one upstream's patches on a new base (3-way), export them normalised, move the pin,
and summarise each patch: unchanged, refreshed (context only), modified, dropped (already
upstream), conflicting. A conflict stops with git am in progress in the workspace; resolve it
there and run again with --continue. Run without --continue, it starts afresh and sets the old
rebase workspace aside whole (tools/kept.py --workdir of this --workdir restores it)."""


def main(argv: list[str], prog: str) -> int:
    p = options.parser(prog, DESCRIPTION)
    options.add_series(p)
    p.add_argument("--onto", required=True, metavar="NAME=VERSION_OR_COMMIT",
                   help="the upstream and its new version (PyPI) or commit (git)")
    options.add_workdir(p, default=Path("rebase-work"), help="where the rebase workspace lives (rebase-work)")
    p.add_argument("--continue", dest="cont", action="store_true", help="pick up a resolved workspace")
    p.add_argument("--replace-edited", action="store_true",
                   help="write over a patch file edited since the rebase read it, a copy kept in WORKDIR/.carry/replaced")
    options.add_sources(p, help="NAME=PATH: the new base of the --onto upstream from a wheel or checkout")
    options.add_json(p)
    options.add_cache(p)
    a = p.parse_args(argv)
    series = options.load_series(a)
    name, target = options.upstream_target(a.onto, "--onto", series)
    srcs = options.sources(a, series)
    rep = rebase(series, name, target, options.cache(a), a.workdir.absolute(), srcs.get(name), a.cont, a.replace_edited)
    options.write_report(a.json, rep.to_dict())
    print(f"{name} onto {target}: {rep.new_base}")
    print(report.table([[e.id, e.outcome, e.detail] for e in rep.patches], ["patch", "outcome", "detail"]))
    if rep.next:
        print(f"  next: {rep.next}", file=sys.stderr)
    return 0 if rep.ok else 1
