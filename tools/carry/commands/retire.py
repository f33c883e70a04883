"""gtp-carry retire / tools/retire.py."""

from __future__ import annotations

import sys

from .. import report
from ..errors import UsageError
from ..evidence.retire import retire
from ..series.manifest import load
from . import options

DESCRIPTION = """\
Decide for each patch of one upstream whether a new upstream base already has it:
landed, needed, conflicts or unknown, with the evidence (text, behaviour = the proof on the
pristine new base, link) and any disagreement between them. --write retires the landed
patches to patches/<series>/retired/, moves the pin and re-applies the rest; nothing is
written if that fails.

A patch's upstream_tests (upstream's own tests it fixed, recorded by tools/upstream_tests.py
--record-fixed) are named in its evidence; --upstream-tests runs them on the new base without
it: its behaviour where it has no proof, a disagreement where its proof says otherwise."""


def main(argv: list[str], prog: str) -> int:
    p = options.parser(prog, DESCRIPTION)
    options.add_series(p)
    p.add_argument("--against", required=True, metavar="NAME=VERSION_OR_COMMIT",
                   help="the upstream and its new version (PyPI) or commit (git)")
    p.add_argument("--write", action="store_true", help="retire the landed patches and move the pin")
    p.add_argument("--accept-candidates", action="store_true",
                   help="with --write, also retire patches landed by behaviour whose text still applies")
    options.add_sources(p, help="NAME=PATH: the new base of the --against upstream from a wheel or checkout; "
                                "for another upstream, where its tree for the proofs comes from")
    options.add_workdir(p, required=False, help="applied workspaces for the other upstreams' trees (proofs)")
    p.add_argument("--upstream-tests", action="store_true",
                   help="run each patch's recorded upstream_tests on the new base without it, with the upstream's "
                        "own launch (its pinned tests fetched into --cache, or from --tests-source), each test "
                        "bounded by --timeout")
    options.add_tests_source(p,
                   help="with --upstream-tests: a git clone that has NAME's pinned tests commit (instead of fetching it)")
    options.add_json(p)
    options.add_cache(p)
    options.add_timeout(p)
    a = p.parse_args(argv)
    if a.tests_source and not a.upstream_tests:
        raise UsageError("--tests-source is for --upstream-tests: give both, or neither")
    series = options.load_series(a)
    name, target = options.upstream_target(a.against, "--against", series)
    pin_before = series.upstream(name).pin_text()
    rep = retire(series, name, target, options.cache(a), a.write, a.workdir, options.sources(a, series),
                 a.timeout, a.accept_candidates, options.tests_sources(a, series) if a.upstream_tests else None)
    options.write_report(a.json, rep.to_dict())
    rows = [[v.id, v.verdict + (" (candidate)" if v.candidate else ""), v.text, v.behaviour, v.link,
             "; ".join(v.disagreements)] for v in rep.patches]
    print(f"{name} against {target}: {rep.new_base}")
    print(report.table(rows, ["patch", "verdict", "text", "behaviour", "link", "disagreements"]))
    if rep.written:
        pin_after = load(series.root, check=False).upstream(name).pin_text()
        pin = f"pin moved from {pin_before} to {pin_after}" if pin_after != pin_before else f"pin kept at {target}"
        print(f"retired: {', '.join(rep.retired) or 'none'}; {pin}")
    if not rep.ok:
        print("error: " + (rep.error or "failed") + (f"\n  next: {rep.hint}" if rep.hint else ""), file=sys.stderr)
        return 1
    return 0
