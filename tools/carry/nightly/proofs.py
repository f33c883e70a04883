"""The proof cells: one proof of one patch, red on its pristine base and green on tonight's trees.

Each run of a proof (on the patched trees, on its pristine base, on a prefix of the series for a
bisection) is the proof's pytest as carry.evidence.prove runs it, as a command of its own
(carry.nightly.plan.proof_plan): launched as any cell's run is, on this machine or as a Slurm job
step (carry.nightly.slurm.launch), bounded by the cell's timeout, and classified from what its
pytest left in the run's folder (JUnit XML, the plugin's events) by carry.evidence.outcome, as prove
classifies its own. A run past its timeout did not finish: a test body it was in fails, else it
never ran (``error``). An environment error is named as such and never bisected: no prefix of the
series changes what the host lacks.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ..errors import SourceError
from ..evidence import proofenv
from ..evidence.bisect import PrefixTrees
from ..evidence.outcome import Outcome
from ..evidence.pristine import pristine_tree, red_for_its_reason
from ..series.entries import pristine_tree_name
from . import artifacts, slurm
from .judge import Verdict
from .plan import Cell, Options, proof_plan
from .runlog import tail

STATUS = {"pass": "passed", "skipped": "skipped", "error": "error"}  # any other outcome: failed


def patched(cell: Cell, trees: dict[str, Path], out: Path, opts: Options, timeout: float) -> tuple[Verdict, dict]:
    """The proof on ``trees`` (tonight's, or a bisection's prefix), judged; its run's record second."""
    o, info = run(cell, trees, out, opts, timeout)
    v = Verdict(status=STATUS.get(o.result, "failed"), reason=o.detail, tail=info.pop("tail", []))
    return v, {**info, "proof": cell.proof}


def pristine(cell: Cell, trees: dict[str, Path], prefix: PrefixTrees, out: Path, opts: Options,
             timeout: float) -> tuple[Verdict | None, dict]:
    """A passing proof must fail on its pristine base; else it proves nothing (vacuous). None when
    it does; the run's record (its command, log, step) second."""
    assert cell.patch is not None
    up = cell.patch.upstream
    base = {**trees, up: pristine_tree(cell.series, cell.patch, prefix.pristine(up),
                                       prefix.scratch / pristine_tree_name(up, cell.patch.id))}
    if out.exists():
        shutil.rmtree(out)  # never judge what an earlier run left here
    out.mkdir(parents=True)
    o, info = run(cell, base, out, opts, timeout, f"{cell.id}--pristine")
    info.pop("tail", None)
    wrong = red_for_its_reason(o, cell.series.root / (cell.proof or cell.patch.proof).split("::")[0])
    if o.result == "fail" and not wrong:
        return None, info
    if wrong:
        return Verdict(status="vacuous", reason=f"on the pristine base: {wrong}"), info
    if o.result == "error":
        return Verdict(status="error", reason=f"on the pristine base: {o.detail}"), info
    return Verdict(status="vacuous",
                   reason=f"the proof does not fail on the pristine base ({o.result}: {o.detail[:200]})"), info


def run(cell: Cell, trees: dict[str, Path], out: Path, opts: Options, timeout: float,
        name: str | None = None) -> tuple[Outcome, dict]:
    """One run of the cell's proof on ``trees``, its files in ``out`` (``name``: its job step's),
    classified; the record of the run second, with its log's last lines (``tail``)."""
    try:
        python = proofenv.python_for(cell.series, cell.proof, opts.cache)
    except SourceError as exc:
        return Outcome("error", f"environment: {exc.message}"), {}
    p, cmd = proof_plan(cell, trees, out, python, opts.cache)
    fin, info = slurm.launch(cell, p, out, opts.launcher, timeout, name)
    text, _ = artifacts.read_log(out / "console.log")
    if fin.error:
        rc, output = None, f"did not finish: could not start: {fin.error}"
    elif fin.timed_out:
        rc, output = None, f"did not finish: timed out after {timeout:g}s"
    else:
        rc, output = fin.returncode, slurm.run_output(text or "")
    info["tail"] = tail(text or "")
    return cmd.outcome(rc, output, fin.seconds), info
