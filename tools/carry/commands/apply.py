"""gtp-carry apply / tools/apply.py."""

from __future__ import annotations

import sys
import time

from .. import report
from ..errors import CarryError, UsageError
from ..workspace.apply import Options, apply_series
from . import options

DESCRIPTION = """\
Apply a patch series onto the pinned upstream bases.

Builds DIR/<upstream> (a git repo: the pinned base commit, then one commit per patch) for
every upstream, all-or-nothing, and reports per patch: applied, already-applied, failed,
not-attempted. A second run with nothing changed does nothing. Without --source, an upstream
pinned to a git commit (NeMo-RL) is fetched from its URL."""


def main(argv: list[str], prog: str) -> int:
    p = options.parser(prog, DESCRIPTION)
    options.add_series(p)
    options.add_workdir(p, help="where the patched workspaces live (DIR/<upstream>)")
    options.add_only(p, help="comma-separated patch ids and/or upstream names (their requires are added)")
    options.add_sources(p)
    p.add_argument("--into", action="append", metavar="NAME=PATH",
                   help="apply NAME's patches onto an existing clean git checkout instead of DIR/NAME")
    p.add_argument("--check", action="store_true", help="dry run: report what would happen, write nothing")
    p.add_argument("--wheels", type=options.output_path("dir"), metavar="DIR",
                   help="also write patched wheels of PyPI-pinned upstreams (those pip accepts: see the report)")
    options.add_json(p)
    options.add_cache(p)
    options.add_lock_timeout(p)
    a = p.parse_args(argv)
    series = options.load_series(a)
    opts = Options(workdir=a.workdir, cache=options.cache(a), only=options.comma_list(a.only),
                   sources=options.sources(a, series), into=options.name_paths(a.into, "--into"),
                   check=a.check, wheels_dir=a.wheels, lock_timeout=a.lock_timeout)
    for name in opts.into:
        series.upstream(name)
    overlap = set(opts.sources) & set(opts.into)
    if overlap:
        raise UsageError(f"--source and --into both name {', '.join(sorted(overlap))}")
    t0 = time.monotonic()
    try:
        rep = apply_series(series, opts)
    except CarryError as exc:
        options.write_report(a.json, {"ok": False, "series": series.name, "upstreams": [], "error": exc.message})
        raise
    options.write_report(a.json, rep.to_dict())
    print(report.render_apply(rep))
    print(f"done in {time.monotonic() - t0:.2f}s")
    if not rep.ok:
        print("error: " + (rep.error or "failed"), file=sys.stderr)
        if rep.next:
            print(f"  next: {rep.next}", file=sys.stderr)
        return 1
    return 0
