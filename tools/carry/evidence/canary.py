"""The canary: the series against each upstream's main head, beside the nightly's release cells.

For each upstream given a main checkout (``tools/nightly.py --canary NAME=PATH``: a git checkout
or mirror whose HEAD is main, fetched before the night), carry.evidence.retire decides per patch from the
text, the link (merged_in) and the proofs that run here, on the pristine main head:

  landed     upstream has it (the evidence says how);
  needed     the proof still fails on main: the bug is there;
  conflicts  the patch no longer applies to main (the file is named): whoever moves the series
             next has a merge to do;
  unknown    no evidence either way (why: a GPU proof without a GPU, no proof, a proof that
             crashed on main, main not readable).

Nothing here fails the night: the release cells judge the pins; a patch that stops applying to
main is a warning in the summary.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import progress
from ..errors import CarryError
from ..runner import Git
from ..series.manifest import Series
from ..workspace.workdir import WorkDir
from .retire import Verdict, retire


@dataclass
class Row:
    upstream: str
    id: str
    verdict: str          # landed | needed | conflicts | unknown
    why: str
    evidence: list[str] = field(default_factory=list)


@dataclass
class UpstreamCanary:
    upstream: str
    checkout: str
    head: str = ""
    describe: str = ""
    error: str | None = None
    rows: list[Row] = field(default_factory=list)


def classify(name: str, v: Verdict) -> Row:
    """Retire's verdict, stated for main: 'needed' only on behaviour evidence, else 'unknown'."""
    ev = list(v.evidence) + list(v.disagreements)
    if v.verdict == "landed":
        how = [e for e in v.evidence if e.startswith(("text: upstream", "text: the patch reverse", "text: applying",
                                                      "link:")) or " pass on the new base" in e]
        why = "; ".join(how) or "landed"
        if v.candidate:
            why = "candidate (the proof passes but the text still applies): " + why
        return Row(name, v.id, "landed", why, ev)
    if v.verdict == "conflicts":
        spot = next((e for e in v.evidence if e.startswith("text: the patch conflicts")), "text: conflicts")
        return Row(name, v.id, "conflicts", spot.removeprefix("text: "), ev)
    if v.verdict == "needed" and v.behaviour == "fail":
        fails = [e.removeprefix("behaviour: ") for e in v.evidence if " fail on the new base" in e]
        return Row(name, v.id, "needed", "the proof fails on main: " + "; ".join(fails), ev)
    if v.behaviour == "skipped":
        why = "its proof did not run here (" + "; ".join(
            e.removeprefix("behaviour: ") for e in v.evidence if e.startswith("behaviour:")) + ")"
    elif v.behaviour == "no-proof":
        why = "it has no proof"
    elif v.behaviour == "error":
        why = "its proof crashed on main: " + "; ".join(
            e.removeprefix("behaviour: ") for e in v.evidence if " error on the new base" in e)
    else:
        why = f"retire says {v.verdict}"
    if v.text == "applies":
        why += "; the text still applies to main"
    return Row(name, v.id, "unknown", why, ev)


def run(series: Series, heads: dict[str, Path], cache: Path, timeout: float, workdir: Path | None,
        source_paths: dict[str, Path]) -> list[UpstreamCanary]:
    """``heads``: NAME -> checkout of main; ``workdir``: tonight's applied trees (the others' trees
    for cross-upstream proofs), or None to build them from the pins and ``source_paths``."""
    out = []
    wd = workdir if workdir is not None and WorkDir(workdir).load_state() is not None else None
    for name, path in heads.items():
        series.upstream(name)  # an unknown name is a usage error, with a suggestion
        res = UpstreamCanary(name, str(path))
        out.append(res)
        if not series.patches_for(name):
            continue
        head = Git(path.expanduser().resolve()).rev_parse("HEAD") if path.exists() else None
        if not head:
            res.error = f"{path} is not a git checkout with a HEAD"
            res.rows = [Row(name, p.id, "unknown", f"main not readable: {res.error}") for p in series.patches_for(name)]
            continue
        res.head = head
        progress.say(f"canary: {series.name} against {name} main ({head[:12]})")
        try:
            rep = retire(series, name, head, cache, False, wd, {**source_paths, name: path}, timeout)
        except CarryError as exc:
            res.error = exc.message
            res.rows = [Row(name, p.id, "unknown", f"retire could not run: {exc.message}")
                        for p in series.patches_for(name)]
            continue
        res.describe = rep.new_base
        res.rows = [classify(name, v) for v in rep.patches]
    return out


def warnings(canaries: list[UpstreamCanary]) -> list[str]:
    warn = []
    for c in canaries:
        if c.error:
            warn.append(f"canary {c.upstream}: {c.error}")
        warn += [f"canary {c.upstream}: {r.id} {r.verdict} on main: {r.why}" for r in c.rows
                 if r.verdict == "conflicts"]
    return warn


def to_dicts(canaries: list[UpstreamCanary]) -> list[dict]:
    return [asdict(c) for c in canaries]


def _cell(text: str, limit: int = 220) -> str:
    s = " ".join(str(text).split())
    return (s if len(s) <= limit else s[: limit - 3] + "...").replace("|", "\\|")


def summary_lines(canaries: list[UpstreamCanary]) -> list[str]:
    """The summary's canary section: one table row per patch, warnings first."""
    if not canaries:
        return []
    lines = ["", "## Canary: the series against upstream main (warnings, never a failed night)", ""]
    for w in warnings(canaries):
        lines.append(f"- WARNING {_cell(w, 400)}")
    for c in canaries:
        where = f"{c.upstream} main at {c.head[:12]}" if c.head else f"{c.upstream} main ({c.checkout})"
        counts = {k: sum(r.verdict == k for r in c.rows) for k in ("landed", "needed", "conflicts", "unknown")}
        lines += ["", f"### {where}: " + ", ".join(f"{n} {k}" for k, n in counts.items()), ""]
        if c.rows:
            lines += ["| patch | on main | why |", "| --- | --- | --- |"]
            lines += [f"| {r.id} | {r.verdict} | {_cell(r.why)} |" for r in c.rows]
    return lines
