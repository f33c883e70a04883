"""gtp-carry lint / tools/lint.py."""

from __future__ import annotations

import sys

from ..series.lint import lint, notes
from . import options

DESCRIPTION = """\
Check the series: files exist and are listed once, metadata is complete, every patch has a
proof (or says why not), proofs exist, requires is sound, no patch escapes its tree. Exit 1 when it finds problems; 2 when
they include broken patch entries or requires (a cycle, an unknown or later patch), which every
other command refuses as bad configuration."""


def main(argv: list[str], prog: str) -> int:
    p = options.parser(prog, DESCRIPTION)
    options.add_series(p)
    options.add_json(p)
    a = p.parse_args(argv)
    series = options.load_series(a, check=False)  # lint reports bad entries and requires itself
    probs, said = lint(series), notes(series)
    options.write_report(a.json, {"ok": not probs, "series": series.name,
                                  "problems": [{"where": x.where, "message": x.message} for x in probs],
                                  "notes": [{"where": x.where, "message": x.message} for x in said]})
    for x in probs:
        print(f"{x}", file=sys.stderr)
    for x in said:
        print(f"note: {x}")
    print(f"series {series.name}: {len(series.patches)} patch(es), {len(probs)} problem(s)"
          + (f", {len(said)} without a proof (see the notes)" if said else ""))
    if series.entry_problems() or series.requires_problems():
        return 2  # what every other command refuses as a broken series.toml (README, "Exit codes")
    return 1 if probs else 0
