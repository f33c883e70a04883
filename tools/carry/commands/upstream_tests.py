"""gtp-carry upstream-tests / tools/upstream_tests.py."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from .. import report
from ..errors import UsageError
from ..evidence import tesite
from ..evidence.upstream import record
from ..evidence.upstream.check import Options, check_series, standing_line
from ..evidence.upstream.earlier import read_back
from ..evidence.upstream.verdict import look_again
from ..series.repo import command
from . import options

DESCRIPTION = """\
Run each upstream's own unit tests on the pristine base and on the patched trees, and compare them
test by test. Which test files run is derived from the series (the files its patches touch: the
tests that import them, name them, or live in their mirror folder); --select-only prints that
selection with each file's reasons and runs nothing. The tests come from the commit pinned in
series.toml ([upstreams.NAME.tests]): fetched once into the cache, or from --tests-source
NAME=CLONE (any clone that has the commit). They run with the upstream's own launch (Megatron-LM:
torchrun --nproc-per-node 8 -m pytest; the others: pytest) and the marker expression its CI uses.
A run cut before it wrote its result keeps what its launches recorded: --judge-records judges it.
--record-fixed RESULT writes the tests a run found the series fixes, each bisected to its patch, into
that patch's upstream_tests in series.toml (and runs nothing). --bisect-again RESULT finishes the
bisection of a run whose --bisect-budget ran out, running no side again.

Verdicts per test: regression (pristine did not fail, patched does: bisected to a patch), fixed
(the series turns a failing upstream test green: bisected too), known-failure (both fail, each for
the test: a side past the per-test timeout or out of GPU memory is no verdict, not compared), and
the tests that behave the same. Needs the workspaces from tools/apply.py.

On a host with one GPU, --shared-gpu runs the ranks on it, each process its own NCCL_HOSTID, and
answers the tests' torch.cuda.device_count() with the number of ranks; times measured so are not
the upstreams' price. Exit 0: every selected test ran on both sides, none regressed and at least
one passed on both; 1: a regression, or a verdict not given (tests not compared: the budget ran
out, a launch failed; or nothing passed); 2: bad usage or input."""


def main(argv: list[str], prog: str) -> int:
    p = options.parser(prog, DESCRIPTION)
    options.add_series(p)
    options.add_workdir(p, required=False)
    p.add_argument("--only", metavar="UPSTREAM,...", help="the upstreams whose tests run (default: each that pins tests)")
    options.add_tests_source(p,
                   help="a git clone that has NAME's pinned tests commit (instead of fetching it)")
    p.add_argument("--out", type=options.output_path("dir"), metavar="DIR",
                   help="where each side's folders, logs and results go (DIR/<upstream>/result.json); needed, with "
                        "--workdir, by everything but --record-fixed")
    p.add_argument("--record-fixed", action="append", type=Path, metavar="RESULT",
                   help="run nothing: record in series.toml, beside each patch (its upstream_tests), the tests RESULT "
                        "(a result.json of this series, repeatable) found it fixes: failing on the pristine base, "
                        "passing patched, and bisected to it. A fixed test its bisection did not name a patch for is "
                        "counted, not recorded")
    p.add_argument("--bisect-again", type=Path, metavar="RESULT",
                   help="run no side: bisect, on the trees of --workdir, the regressions and fixed tests of RESULT (a "
                        "result.json of this series) whose bisection named no patch (its --bisect-budget ran out, the "
                        "run was cut during it); writes RESULT's comparison with those tests judged now to "
                        "--out/UPSTREAM/result.json (for --record-fixed, --compared)")
    p.add_argument("--select-only", action="store_true", help="print the derived selection and run nothing")
    p.add_argument("--judge-records", action="store_true",
                   help="run nothing: judge the run in --out from the records its launches left there, for a run that "
                        "was cut before it wrote its result (its machine taken back, the job killed); pass the "
                        "--workdir, --compared, --look-again, --shard and --files it was run with. A test the cut "
                        "left without an outcome on a side is not compared; nothing is run again nor bisected")
    p.add_argument("--files", action="append", metavar="PATH",
                   help="run only the selected files under PATH (repeatable), e.g. tests/unit_tests/generalized_tensor_parallel")
    p.add_argument("--shard", type=_shard, metavar="I/K",
                   help="run the I-th of K parts of what is left to run (after --files and --compared): every K-th "
                        "file, from the I-th; K runs with their own --workdir and --out share one host or several "
                        "(e.g. --shard 1/2 and --shard 2/2), and each one's result.json serves as --compared later")
    p.add_argument("--nproc", type=int, metavar="N", help="ranks per launch (default: the pin's, upstream CI's)")
    p.add_argument("--budget", type=options.seconds, metavar="SECONDS",
                   help="stop each side after this long; what it did not reach is reported as not compared")
    p.add_argument("--test-timeout", type=options.seconds, default=900.0, metavar="SECONDS",
                   help="a test running longer ends its launch as a timeout; the next launch goes on after it (900)")
    p.add_argument("--python", metavar="PYTHON", help="the interpreter the tests run in (default: this one)")
    p.add_argument("--shared-gpu", action="store_true", help="all ranks on one GPU (see above)")
    p.add_argument("--one-side-at-a-time", action="store_true", help="run pristine, then patched (default: both at once)")
    p.add_argument("--no-bisect", action="store_true", help="do not bisect regressions and fixed tests")
    p.add_argument("--bisect-budget", type=options.seconds, metavar="SECONDS",
                   help="the seconds the bisection's probes share (regressions first): a test a probe did not reach "
                        "is left not bisected, never charged to a patch (default: no limit)")
    p.add_argument("--compared", action="append", type=Path, metavar="RESULT",
                   help="an earlier run's result.json (or result.json.gz), repeatable: the selected files it compared "
                        "whole (none of its tests not compared, regressed, flaky or refusing the world size it ran at) are "
                        "left out, and in a file it began the tests it compared are passed over, to go on "
                        "where earlier runs stopped; a test any of them found regressed runs again; only results of the "
                        "same upstream, tests pin, launch, pytest arguments and series count")
    p.add_argument("--look-again", action="append", metavar="TEXT",
                   help="with --compared, repeatable: the known failures of those runs (both sides failed) whose first "
                        "error line, on either side, holds TEXT run again, as a test they did not compare: for when the "
                        "host now has what they lacked (e.g. 'No module named' after a missing package was added); a "
                        "TEXT that holds in no known failure of theirs is refused (a typo would run nothing again)")
    options.add_json(p)
    options.add_cache(p)
    options.add_lock_timeout(p)
    tesite.add_option(p)
    # two forms: a run (or its judgement) needs --workdir and --out; --record-fixed needs neither
    run = " ".join(p.format_usage().split()[1:]).replace("[--workdir DIR]", "--workdir DIR").replace(
        "[--out DIR]", "--out DIR").replace(" [--record-fixed RESULT]", "")
    p.usage = _wrapped(run, len("usage: ") + len(prog) + 1) + (
        f"\n       {prog} [--series NAME|DIR] --record-fixed RESULT [--record-fixed RESULT ...]")
    a = p.parse_args(argv)
    if a.record_fixed:
        return _record_fixed(a)
    if a.workdir is None or a.out is None:
        raise UsageError("--workdir and --out are needed (all but --record-fixed run or judge tests there)",
                         hint=f"{prog} --workdir DIR --out DIR ... (--help says what each does)")
    if a.nproc is not None and a.nproc < 1:
        raise UsageError(f"--nproc must be 1 or more, got {a.nproc}")
    if a.judge_records and a.select_only:
        raise UsageError("--judge-records judges a run's records and --select-only runs nothing: give one")
    again = _bisect_again(a)
    series = options.load_series(a)
    tesite.use(a.te_site)
    opts = Options(bisect_again=again, cache=options.cache(a), out=a.out.absolute(), sources=options.tests_sources(a, series), python=a.python, nproc=a.nproc,
                   budget_s=a.budget, test_timeout=a.test_timeout, shared_gpu=a.shared_gpu,
                   files=a.files, bisect=not a.no_bisect, bisect_budget_s=a.bisect_budget,
                   together=not a.one_side_at_a_time,
                   select_only=a.select_only, judge_records=a.judge_records, shard=a.shard, compared=_results(a.compared or [], a.look_again or []))
    reports = check_series(series, a.workdir, [again["upstream"]] if again else options.comma_list(a.only), opts,
                           a.lock_timeout)
    bad = [r["upstream"] for r in reports if not r.get("ok")]   # the JSON's ok and the exit status, both from it
    options.write_report(a.json, {"ok": not bad and not a.select_only, "series": series.name, "upstreams": reports})
    if a.select_only:
        for r in reports:
            before = f"; {len(r['compared_before'])} left out by the --compared runs" if r.get("compared_before") else ""
            shard = f" (shard {r['shard']})" if r.get("shard") else ""
            print(f"{r['upstream']}: {len(r['selection'])} test file(s){shard}{before}, {r['tests']}")
            if a.compared:
                print(f"{r['upstream']}: {standing_line(r['standing'])}")
            left = [[_left(s)] if "tests_known" in s else [] for s in r["selection"]]
            print(report.table([[s["path"], *n, "; ".join(s["reasons"])] for s, n in zip(r["selection"], left)],
                               ["file", *(["left (tests not compared)"] if any(left) else []), "why"]))
        return 0
    for r in reports:
        print(f"{r['upstream']}: {r.get('status', '?')}: {r.get('reason', '')}")
        total = r.get("counts", {}).get("*", {})
        if total:
            print(report.table([[k, str(v)] for k, v in sorted(total.items())], ["category", "tests"]))
        for b in r.get("bisect") if isinstance(r.get("bisect"), list) else []:
            print(f"  {b['category']}: {b['id']}: {b.get('note', '')}")
        print(f"  details: {Path(opts.out) / r['upstream'] / 'result.json'}")
    named = [r for r in reports if isinstance(r.get("bisect"), list) and any(map(record.names_its_patch, r["bisect"]))]
    if named:   # the series fixes upstream's own tests: evidence to keep beside the patches
        results = [x for r in named for x in ("--record-fixed", Path(opts.out) / r["upstream"] / "result.json")]
        print("next: record the fixed tests beside the patches their bisection named: "
              + command("upstream-tests", series, *results))
    if bad:
        print(f"error: not green for: {', '.join(bad)} (see each result.json)", file=sys.stderr)
    return 1 if bad else 0


def _bisect_again(a: argparse.Namespace) -> dict | None:
    """--bisect-again RESULT, read (None without it); the options a bisection of it would not use, refused."""
    if a.bisect_again is None:
        return None
    unused = [flag for flag, on in (("--select-only", a.select_only), ("--judge-records", a.judge_records),
                                    ("--compared", a.compared), ("--look-again", a.look_again), ("--files", a.files),
                                    ("--shard", a.shard), ("--budget", a.budget), ("--no-bisect", a.no_bisect))
              if on]
    if unused:
        raise UsageError(f"--bisect-again runs no side: {', '.join(unused)} would not be used",
                         hint="give it with --workdir, --out and the options of the launches (--nproc, --python, "
                              "--shared-gpu, --test-timeout, --bisect-budget)")
    doc = _result(a.bisect_again, "--bisect-again")
    if a.only and options.comma_list(a.only) != [doc["upstream"]]:
        raise UsageError(f"--bisect-again {a.bisect_again}: a result of {doc['upstream']}, not of --only {a.only}")
    return doc


def _record_fixed(a: argparse.Namespace) -> int:
    """--record-fixed: each result's fixed tests bisected to a patch, written beside the patch."""
    alone = [flag for flag, on in (("--select-only", a.select_only), ("--judge-records", a.judge_records),
                                   ("--compared", a.compared), ("--files", a.files), ("--shard", a.shard),
                                   ("--only", a.only)) if on]
    if alone:
        raise UsageError(f"--record-fixed runs nothing: {', '.join(alone)} would not be used", hint="give it alone")
    series = options.load_series(a)
    found, unnamed = record.fixed_by(series, [(path, _result(path, "--record-fixed")) for path in a.record_fixed])
    added = record.record(series, found)
    for pid, tests in found.items():
        new = added.get(pid, [])
        print(f"{pid}: {len(tests)} upstream test(s) it fixes, {len(new)} new in its upstream_tests"
              + "".join(f"\n  {t}" for t in new))
    if unnamed:
        print(f"{len(unnamed)} fixed test(s) named no patch (not recorded): " + "; ".join(unnamed[:3])
              + (" ..." if len(unnamed) > 3 else ""))
    if not added:
        print("nothing new to record: series.toml is unchanged")
    return 0


def _left(entry: dict) -> str:
    """A selected file's figures left after --compared, in words: "N of M" tests some run knows there and none
    compared, the launches that ended in one of them, and how many of them ask for more ranks (a launch of that
    many: h100/2026-12-07-eight-ranks ran such files in one shard, two of two sides at eight ranks being 32
    processes on one GPU)."""
    if entry["tests_not_compared"] is None:
        return "no test known"
    ended, asking = entry["launches_ended"], entry.get("asking_for_ranks") or {}
    return (f"{entry['tests_not_compared']} of {entry['tests_known']}" + (f", {ended} launch(es) ended in it" if ended else "")
            + "".join(f", {k} ask for {n} ranks" for n, k in asking.items()))


def _wrapped(usage: str, indent: int, width: int = 100) -> str:
    """USAGE in lines of at most WIDTH, an option with its value never split (as argparse wraps)."""
    lines = [""]
    for word in re.findall(r"\[[^\[\]]*\]|--\S+ [A-Z][^\s\[]*|\S+", usage):
        if lines[-1] and len(lines[-1]) + 1 + len(word) > width - (indent if len(lines) > 1 else 7):
            lines.append("")
        lines[-1] += (" " if lines[-1] else "") + word
    return ("\n" + " " * indent).join(lines)


def _shard(text: str) -> tuple[int, int]:
    """--shard I/K: 1 <= I <= K."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise argparse.ArgumentTypeError(f"{text!r} is not I/K with 1 <= I <= K (e.g. 1/2)")
    return int(m.group(1)), int(m.group(2))


def _results(paths: list[Path], again: list[str]) -> list[dict]:
    """The --compared results (_result), each with the known failures --look-again names among them
    (verdict.look_again)."""
    if again and not paths:
        raise UsageError("--look-again names known failures of the --compared runs: give --compared too")
    if any(not text.strip() for text in again):
        raise UsageError("--look-again: an empty TEXT would name every known failure; give words of the error line")
    docs = [_result(path) for path in paths]
    if missing := [text for text, n in look_again(docs, again).items() if not n]:
        raise UsageError(f"--look-again {missing[0]!r}: no known failure of the --compared runs holds it in its first "
                         "error line, so nothing would run again")
    return docs


def _result(path: Path, flag: str = "--compared") -> dict:
    """An earlier run's result.json (gzipped or not), or a usage error that says what is wrong with it."""
    import gzip
    import json
    from ..evidence.records import unpacked_for
    try:
        unpacked_for(path)   # a committed run's records are kept as run.tar.xz beside the run/ they unpack to
        data = path.read_bytes()
        doc = json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None
    except (ValueError, EOFError) as exc:
        raise UsageError(f"{flag} {path}: not a result.json ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list) or not doc.get("upstream"):
        raise UsageError(f"{flag} {path}: not a result.json of tools/upstream_tests.py (no upstream and rows)")
    # the launches beside it, read again: a result of ranks out of step was no verdict, and the markers it ran
    # under decided what upstream deselected (what the run it was bisected again from had, written in it:
    # --bisect-again keeps no launch of the sides beside it)
    return read_back(doc, path.parent)
