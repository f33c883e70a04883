"""Command-line front ends. Scripts in tools/ call these; errors become exit codes here only."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable

from . import manifest, report
from .errors import CarryError, DriftError, UsageError

REPO_ROOT = Path(__file__).resolve().parents[2]

EPILOG = "exit codes: 0 success; 1 the operation failed and nothing was changed; 2 bad usage, input or configuration"


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 too; keep our one message style
        self.print_usage(sys.stderr)
        raise UsageError(message)


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = Parser(prog=prog, description=description, epilog=EPILOG,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--series", required=True,
                   help="series name (a folder patches/NAME/ with series.toml) or a path to such a folder")
    return p


def load_series(value: str):
    path = Path(value)
    if "/" in value or (path.is_dir() and (path / "series.toml").exists()):
        return manifest.load(path.resolve())
    return manifest.load(manifest.find_series(REPO_ROOT, value))


def name_paths(values: list[str] | None, flag: str) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for v in values or []:
        name, sep, path = v.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"{flag} expects NAME=PATH, got {v!r}")
        if name in out:
            raise UsageError(f"{flag} {name} given twice")
        out[name] = Path(path)
    return out


def csv(value: str | None) -> list[str] | None:
    if value is None:
        return None
    items = [x.strip() for x in value.split(",") if x.strip()]
    if not items:
        raise UsageError("--only needs at least one patch id or upstream name")
    return items


def main(run: Callable[[list[str]], int], argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        return run(argv)
    except CarryError as exc:
        print(exc.render(), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted: the previous workspaces are as they were", file=sys.stderr)
        return 130


# -- apply --------------------------------------------------------------------------
def apply_main(argv: list[str]) -> int:
    from . import apply as applying
    from .sources import default_cache
    p = parser("tools/apply.py", "Apply a patch series onto the pinned upstream bases.\n\n"
               "Builds DIR/<upstream> (a git repo: pristine base commit, then one commit per patch) for\n"
               "every upstream, all-or-nothing, and reports per patch: applied, already-applied, failed,\n"
               "not-attempted. A second run with nothing changed does nothing.")
    p.add_argument("--workdir", required=True, type=Path, help="where the patched workspaces live (DIR/<upstream>)")
    p.add_argument("--only", help="comma-separated patch ids and/or upstream names (their requires are added)")
    p.add_argument("--source", action="append", metavar="NAME=PATH",
                   help="use a local wheel, checkout, mirror or unpacked tree for upstream NAME")
    p.add_argument("--into", action="append", metavar="NAME=PATH",
                   help="apply NAME's patches onto an existing clean git checkout instead of DIR/NAME")
    p.add_argument("--check", action="store_true", help="dry run: report what would happen, write nothing")
    p.add_argument("--wheels", type=Path, metavar="DIR", help="also write patched wheels of PyPI-pinned upstreams")
    p.add_argument("--json", type=Path, metavar="FILE", help="write the report as JSON")
    p.add_argument("--cache", type=Path, help="download/base cache (default $GTP_CARRY_CACHE or ~/.cache/gtp-carry)")
    p.add_argument("--lock-timeout", type=float, default=600.0, help="seconds to wait for another run (600)")
    a = p.parse_args(argv)
    series = load_series(a.series)
    opts = applying.Options(workdir=a.workdir, cache=a.cache or default_cache(), only=csv(a.only),
                            sources=name_paths(a.source, "--source"), into=name_paths(a.into, "--into"),
                            check=a.check, wheels_dir=a.wheels, lock_timeout=a.lock_timeout)
    overlap = set(opts.sources) & set(opts.into)
    if overlap:
        raise UsageError(f"--source and --into both name {', '.join(sorted(overlap))}")
    t0 = time.monotonic()
    try:
        rep = applying.apply(series, opts)
    except CarryError as exc:
        if a.json:
            report.write_json(a.json, {"ok": False, "series": series.name, "upstreams": [], "error": exc.message})
        raise
    if a.json:
        report.write_json(a.json, rep.to_dict())
    print(report.render_apply(rep))
    print(f"done in {time.monotonic() - t0:.2f}s")
    if not rep.ok:
        print("error: " + (rep.error or "failed"), file=sys.stderr)
        return 1
    return 0


# -- export -------------------------------------------------------------------------
def export_main(argv: list[str]) -> int:
    from .export import export
    p = parser("tools/export.py", "Regenerate the series' patch files from the workspace commits (normalised).\n\n"
               "--check writes nothing and exits 1 when a file would change (CI: patches are up to date).")
    p.add_argument("--workdir", required=True, type=Path)
    p.add_argument("--check", action="store_true", help="exit 1 when any patch file would change")
    p.add_argument("--json", type=Path, metavar="FILE")
    a = p.parse_args(argv)
    series = load_series(a.series)
    try:
        res = export(series, a.workdir, a.check)
    except CarryError as exc:
        if a.json:
            report.write_json(a.json, {"ok": False, "series": series.name, "error": exc.message,
                                       "drift": exc.files if isinstance(exc, DriftError) else []})
        raise
    if a.json:
        report.write_json(a.json, {"ok": True, "series": series.name, "written": res.written,
                                   "unchanged": res.unchanged, "drift": res.drift})
    for f in res.written:
        print(f"wrote {f}")
    print(f"{len(res.unchanged)} unchanged, {len(res.written)} written" + (" (check)" if a.check else ""))
    return 0


# -- lint ---------------------------------------------------------------------------
def lint_main(argv: list[str]) -> int:
    from .lint import lint
    p = parser("tools/lint.py", "Check the series: files exist and are listed once, metadata is complete,\n"
               "proofs exist, requires is acyclic, no patch escapes its tree.")
    p.add_argument("--json", type=Path, metavar="FILE")
    a = p.parse_args(argv)
    series = load_series(a.series)
    probs = lint(series)
    if a.json:
        report.write_json(a.json, {"ok": not probs, "series": series.name,
                                   "problems": [{"where": x.where, "message": x.message} for x in probs]})
    for x in probs:
        print(f"{x}", file=sys.stderr)
    print(f"series {series.name}: {len(series.patches)} patch(es), {len(probs)} problem(s)")
    return 1 if probs else 0


# -- prove --------------------------------------------------------------------------
def prove_main(argv: list[str]) -> int:
    from .prove import prove
    p = parser("tools/prove.py", "Run each patch's proof on the pristine base (must fail) and on the patched\n"
               "tree (must pass), each in a fresh interpreter. Needs the workspaces from tools/apply.py.\n"
               "A proof that needs a GPU reports 'skipped' without one, never 'pass'.")
    p.add_argument("--workdir", required=True, type=Path)
    p.add_argument("--only", help="comma-separated patch ids and/or upstream names")
    p.add_argument("--json", type=Path, metavar="FILE")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per proof run (900)")
    p.add_argument("--logs", type=Path, metavar="DIR", help="keep each proof run's output here")
    a = p.parse_args(argv)
    series = load_series(a.series)
    rep = prove(series, a.workdir, csv(a.only), a.timeout, a.logs)
    if a.json:
        report.write_json(a.json, rep.to_dict())
    rows = [[r.id, r.pristine, r.patched, {True: "ok", False: "FAILED", None: "not run here"}[r.ok],
             r.patched_detail if r.ok is None else (r.pristine_detail if r.pristine != "fail" else r.patched_detail)]
            for r in rep.proofs]
    print(report.table(rows, ["patch", "pristine", "patched", "verdict", "detail"]))
    bad = [r.id for r in rep.proofs if r.ok is False]
    if bad:
        print(f"error: proof not red/green for: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


def _against(value: str, flag: str) -> tuple[str, str]:
    name, sep, target = value.partition("=")
    if not sep or not name or not target:
        raise UsageError(f"{flag} expects NAME=VERSION_OR_COMMIT, got {value!r}")
    return name, target


# -- retire -------------------------------------------------------------------------
def retire_main(argv: list[str]) -> int:
    from .retire import retire
    from .sources import default_cache
    p = parser("tools/retire.py", "Decide for each patch of one upstream whether a new upstream base already has it:\n"
               "landed, needed, conflicts or unknown, with the evidence (text, behaviour = the proof on the\n"
               "pristine new base, link) and any disagreement between them. --write retires the landed\n"
               "patches to patches/<series>/retired/, moves the pin and re-applies the rest; nothing is\n"
               "written if that fails.")
    p.add_argument("--against", required=True, metavar="NAME=VERSION_OR_COMMIT")
    p.add_argument("--write", action="store_true")
    p.add_argument("--accept-candidates", action="store_true",
                   help="with --write, also retire patches landed by behaviour whose text still applies")
    p.add_argument("--source", type=Path, metavar="PATH", help="the new base from a local wheel or checkout")
    p.add_argument("--workdir", type=Path, help="applied workspaces for the other upstreams' trees (proofs)")
    p.add_argument("--json", type=Path, metavar="FILE")
    p.add_argument("--cache", type=Path)
    p.add_argument("--timeout", type=float, default=900.0)
    a = p.parse_args(argv)
    series = load_series(a.series)
    name, target = _against(a.against, "--against")
    series.upstream(name)
    rep = retire(series, name, target, a.cache or default_cache(), a.write, a.workdir, a.source, a.timeout,
                 a.accept_candidates)
    if a.json:
        report.write_json(a.json, rep.to_dict())
    rows = [[v.id, v.verdict + (" (candidate)" if v.candidate else ""), v.text, v.behaviour, v.link,
             "; ".join(v.disagreements)] for v in rep.patches]
    print(f"{name} against {target}: {rep.new_base}")
    print(report.table(rows, ["patch", "verdict", "text", "behaviour", "link", "disagreements"]))
    if rep.written:
        print(f"retired: {', '.join(rep.retired) or 'none'}; pin moved to {target}")
    if not rep.ok:
        print("error: " + (rep.error or "failed"), file=sys.stderr)
        return 1
    return 0


# -- rebase -------------------------------------------------------------------------
def rebase_main(argv: list[str]) -> int:
    from .rebase import rebase
    from .sources import default_cache
    p = parser("tools/rebase.py", "Re-apply one upstream's patches on a new base (3-way), export them\n"
               "normalised, move the pin, and summarise each patch: unchanged, refreshed (context only),\n"
               "modified, dropped (already upstream), conflicting. A conflict stops with git am in\n"
               "progress in the workspace; resolve it there and run again with --continue.")
    p.add_argument("--onto", required=True, metavar="NAME=VERSION_OR_COMMIT")
    p.add_argument("--workdir", type=Path, default=Path("rebase-work"), help="where the workspace lives (rebase-work)")
    p.add_argument("--continue", dest="cont", action="store_true", help="pick up a resolved workspace")
    p.add_argument("--source", type=Path, metavar="PATH")
    p.add_argument("--json", type=Path, metavar="FILE")
    p.add_argument("--cache", type=Path)
    a = p.parse_args(argv)
    series = load_series(a.series)
    name, target = _against(a.onto, "--onto")
    series.upstream(name)
    rep = rebase(series, name, target, a.cache or default_cache(), a.workdir.absolute(), a.source, a.cont)
    if a.json:
        report.write_json(a.json, rep.to_dict())
    print(f"{name} onto {target}: {rep.new_base}")
    print(report.table([[e.id, e.outcome, e.detail] for e in rep.patches], ["patch", "outcome", "detail"]))
    if rep.next:
        print(f"next: {rep.next}", file=sys.stderr)
    return 0 if rep.ok else 1
