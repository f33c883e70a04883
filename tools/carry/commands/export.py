"""gtp-carry export / tools/export.py."""

from __future__ import annotations

from ..errors import CarryError, DriftError
from ..workspace.export import export
from . import options

DESCRIPTION = """\
Regenerate the series' patch files from the workspace commits (normalised).

--check writes nothing and exits 1 when a file would change (CI: patches are up to date).
A patch file edited since apply read it (or export wrote it) is not replaced: export stops, and
says how to keep the edit or, with --replace-edited, to replace it and keep a copy."""


def main(argv: list[str], prog: str) -> int:
    p = options.parser(prog, DESCRIPTION)
    options.add_series(p)
    options.add_workdir(p)
    p.add_argument("--check", action="store_true", help="exit 1 when any patch file would change")
    p.add_argument("--replace-edited", action="store_true",
                   help="replace a patch file edited since apply (or export) too; a copy of it is kept in "
                        "DIR/.carry/replaced")
    options.add_json(p)
    options.add_lock_timeout(p)
    a = p.parse_args(argv)
    series = options.load_series(a)
    try:
        res = export(series, a.workdir, a.check, a.lock_timeout, a.replace_edited)
    except CarryError as exc:
        options.write_report(a.json, {"ok": False, "series": series.name, "error": exc.message,
                                      "drift": exc.files if isinstance(exc, DriftError) else []})
        raise
    options.write_report(a.json, {"ok": True, "series": series.name, "written": res.written,
                                  "unchanged": res.unchanged, "drift": res.drift})
    for f in res.written:
        print(f"wrote {f}")
    print(f"{len(res.unchanged)} unchanged, {len(res.written)} written" + (" (check)" if a.check else ""))
    return 0
