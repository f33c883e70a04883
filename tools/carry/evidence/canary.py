"""The canary: the series against each upstream's main head, beside the nightly's release cells.

For each upstream given a main checkout (``tools/nightly.py --canary NAME=PATH``: a git checkout
or mirror whose HEAD is main, fetched before the night), carry.evidence.retire decides per patch from the
text, the link (merged_in) and the proofs that run here, on the pristine main head:

  landed     upstream has it (the evidence says how);
  needed     the proof still fails on main: the bug is there;
  conflicts  the patch no longer applies to main (the file is named): whoever moves the series
             next has a merge to do;
  unknown    no evidence either way (why: a GPU proof without a GPU, no proof, a proof that
             crashed on main);
  error      main could not be fetched or read tonight, or retire could not run: no verdict.

Nothing here fails the night: the release cells judge the pins; a patch that stops applying to
main is a warning in the summary.

Fetching main (``tools/nightly.py --fetch-mains``, fetch_main): before the night, each --canary
PATH is a bare repository that caches its upstream's main (the URL from the matrix's
``[canary] mains``): made on the first night, brought up to date by one ``git fetch`` on every
later one. An upstream whose main cannot be fetched tonight gets ``error`` rows (why, and the
command to try), never a verdict from last night's copy: a stale main must not say ``landed``.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import progress
from ..errors import CarryError
from ..git import Git
from ..lock import DirLock

VERDICTS = ("landed", "needed", "conflicts", "unknown", "error")
FETCH_TIMEOUT_S = 1800.0  # a first fetch of Megatron-LM's whole history takes minutes
from ..series.manifest import Series
from ..workspace.workdir import WorkDir
from .retire import Verdict, retire


@dataclass
class Row:
    upstream: str
    id: str
    verdict: str          # one of VERDICTS
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


def fetch_main(url: str, dest: Path, branch: str = "main", timeout: float = FETCH_TIMEOUT_S) -> tuple[str | None, str]:
    """Bring the bare cache ``dest`` up to ``url``'s ``branch``: (its head, "") or (None, why).

    ``dest`` is made (``git init --bare``) when missing, and fetched into when it is a bare
    repository already (the last night's objects are reused); anything else there is refused and
    left alone. Its HEAD names the fetched branch, so it is a mirror "whose HEAD is main"."""
    dest = dest.expanduser().absolute()
    again = f"git -C {shlex.quote(str(dest))} fetch --no-tags {shlex.quote(url)} +refs/heads/{branch}:refs/heads/{branch}"
    try:
        # Two nights at once (a job submitted again) take turns: neither finds the other's half-made cache.
        with DirLock(dest.parent / f"{dest.name}.lock", timeout=timeout, what=dest):
            return _fetch(url, dest, branch, timeout, again)
    except CarryError as exc:
        return None, f"could not fetch {branch} of {url} into {dest}: {exc.message} (next: {again})"


def _fetch(url: str, dest: Path, branch: str, timeout: float, again: str) -> tuple[str | None, str]:
    repo = Git(dest)
    try:
        if not dest.exists():
            dest.mkdir(parents=True)
            repo("init", "-q", "--bare")
        elif not dest.is_dir() or repo("rev-parse", "--is-bare-repository", check=False).stdout.strip() != "true":
            return None, f"{dest} is there and is not a bare git repository: not touched (move it away)"
        # No prompt for credentials on a night without a terminal: a private URL fails, it does not hang.
        res = repo("fetch", "--no-tags", "--prune", url, f"+refs/heads/{branch}:refs/heads/{branch}",
                   check=False, timeout=timeout, env={"GIT_TERMINAL_PROMPT": "0"})
        if not res.ok:
            why = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
            return None, f"could not fetch {branch} of {url}: {why[0][:300]} (next: {again})"
        repo("symbolic-ref", "HEAD", f"refs/heads/{branch}")
    except CarryError as exc:  # git missing, a timeout, a full disk
        return None, f"could not fetch {branch} of {url} into {dest}: {exc.message} (next: {again})"
    head = repo.rev_parse(f"refs/heads/{branch}")
    return (head, "") if head else (None, f"{url} has no branch {branch!r}")


def run(series: Series, heads: dict[str, Path], cache: Path, timeout: float, workdir: Path | None,
        source_paths: dict[str, Path], errors: dict[str, str] | None = None) -> list[UpstreamCanary]:
    """``heads``: NAME -> checkout of main; ``workdir``: tonight's applied trees (the others' trees
    for cross-upstream proofs), or None to build them from the pins and ``source_paths``;
    ``errors``: NAME -> why its main could not be fetched tonight (its rows are ``error``)."""
    out = []
    errors = errors or {}
    wd = workdir if workdir is not None and WorkDir(workdir).load_state() is not None else None
    for name, path in heads.items():
        series.upstream(name)  # an unknown name is a usage error, with a suggestion
        res = UpstreamCanary(name, str(path))
        out.append(res)
        if not series.patches_for(name):
            continue
        if name in errors:
            res.error = errors[name]
            res.rows = [Row(name, p.id, "error", f"no main tonight: {res.error}") for p in series.patches_for(name)]
            continue
        head = Git(path.expanduser().resolve()).rev_parse("HEAD") if path.exists() else None
        if not head:
            res.error = f"{path} is not a git checkout with a HEAD"
            res.rows = [Row(name, p.id, "error", f"main not readable: {res.error}") for p in series.patches_for(name)]
            continue
        res.head = head
        progress.say(f"canary: {series.name} against {name} main ({head[:12]})")
        try:
            rep = retire(series, name, head, cache, False, wd, {**source_paths, name: path}, timeout)
        except CarryError as exc:
            res.error = exc.message
            res.rows = [Row(name, p.id, "error", f"retire could not run: {exc.message}")
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
        counts = {k: sum(r.verdict == k for r in c.rows) for k in VERDICTS}
        lines += ["", f"### {where}: " + ", ".join(f"{n} {k}" for k, n in counts.items()), ""]
        if c.rows:
            lines += ["| patch | on main | why |", "| --- | --- | --- |"]
            lines += [f"| {r.id} | {r.verdict} | {_cell(r.why)} |" for r in c.rows]
    return lines
