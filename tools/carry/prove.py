"""Proofs: each patch's test must fail on the pristine base and pass patched.

A proof runs in a fresh interpreter (``python -m pytest``) with the trees of
every upstream on PYTHONPATH: the upstream under test at its pristine base
or at that patch's commit, the others at their patched heads. Outcomes come
from pytest's JUnit XML, not from guessing at its output. A proof that passes
on the pristine base proves nothing and fails the run; one that needs a GPU
reports ``skipped`` where there is none, never ``pass``.
"""

from __future__ import annotations

import io
import os
import re
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import progress, proofenv
from .errors import CommandError, UsageError
from .lock import LOCK_TIMEOUT
from .manifest import PatchMeta, Series
from .repo import command
from .runner import Git, run
from .workspace import WorkDir


@dataclass
class Outcome:
    result: str          # pass | fail | skipped | error
    detail: str = ""
    seconds: float = 0.0


@dataclass
class ProofResult:
    id: str
    proof: str
    pristine: str
    patched: str
    ok: bool | None       # None: not decided here (skipped)
    pristine_detail: str = ""
    patched_detail: str = ""
    seconds: float = 0.0


@dataclass
class ProveReport:
    series: str
    ok: bool = True
    proofs: list[ProofResult] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def env_name(upstream: str) -> str:
    return "CARRY_TREE_" + upstream.upper().replace("-", "_")


def extract(repo: Path, commit: str, dest: Path) -> Path:
    data = Git(repo).archive(commit)
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        tf.extractall(dest, filter="data")
    return dest


def run_proof(series: Series, patch: PatchMeta, trees: dict[str, Path], timeout: float,
              log_dir: Path | None = None, label: str = "", proof: str | None = None,
              cache: Path | None = None) -> Outcome:
    """Run one proof (by default the patch's first) against the given trees; classify from JUnit XML.

    With ``cache``, a proof whose folder pins its own requirements runs in the environment
    carry.proofenv builds from them (else in this interpreter).
    """
    proof = proof or patch.proof
    assert proof
    python = proofenv.python_for(series, proof, cache) if cache is not None else None
    proofs_dir = series.root / "proofs"
    target = series.root / proof.split("::")[0]
    paths = [str(proofs_dir)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARRY_TREE_")}
    for up in series.upstreams:
        if up.name in trees:
            root = trees[up.name]
            paths.append(str((root / up.python_path).resolve()))
            env[env_name(up.name)] = str(root.resolve())
    # The trees go first; whatever the caller had (e.g. a TransformerEngine install) stays after them.
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    with tempfile.TemporaryDirectory(prefix="carry-proof-") as tmp:
        xml = Path(tmp) / "junit.xml"
        argv = [python or sys.executable, "-m", "pytest", "-q", "-c", str(proofs_dir / "pytest.ini"),
                "--rootdir", str(proofs_dir), f"--junitxml={xml}", "-o", "junit_family=xunit1",
                str(target) + ("::" + proof.split("::", 1)[1] if "::" in proof else "")]
        t0 = time.monotonic()
        try:
            res = run(argv, env=env, cwd=series.root.parents[1], check=False, timeout=timeout)
            rc, output = res.returncode, res.stdout + res.stderr
        except CommandError as exc:  # a timeout, or no interpreter: an outcome, not a crash of ours
            return Outcome("error", f"did not finish: {exc.message}", time.monotonic() - t0)
        secs = time.monotonic() - t0
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
            stem = Path(proof.split("::")[0]).stem
            (log_dir / f"{patch.id}.{stem}.{label}.log").write_text(output)
        return _classify(rc, xml, output, secs)


_ERROR_LINE = re.compile(r"^\s*(?:E\s+)?([A-Za-z_.]*(?:Error|Exception|Failed|Interrupted)\b.*)$")


def _headline(text: str) -> str:
    """The most telling line of a failure: the innermost 'SomethingError: ...' (a rank's own)."""
    hits = [m.group(1).strip() for line in text.splitlines() if (m := _ERROR_LINE.match(line))]
    hits = [h for h in hits if not h.endswith("failed:")] or hits
    if hits:
        return hits[-1][:300]
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return lines[0][:300] if lines else ""


def _classify(rc: int, xml: Path, output: str, secs: float) -> Outcome:
    tests = failed = skipped = 0
    first_failure = skip_note = ""
    if xml.exists():
        for case in ET.parse(xml).getroot().iter("testcase"):
            tests += 1
            for child in case:
                line = _headline((child.get("message") or "") + "\n" + (child.text or "")) or child.tag
                if child.tag in ("failure", "error"):
                    failed += 1
                    first_failure = first_failure or line
                elif child.tag == "skipped":
                    skipped += 1
                    skip_note = skip_note or line
    tail = " | ".join(output.strip().splitlines()[-3:])[-400:]
    if rc == 0 and tests and skipped == tests:
        return Outcome("skipped", skip_note or "all tests skipped", secs)
    if rc == 0 and tests > skipped:
        return Outcome("pass", f"{tests - skipped} passed" + (f", {skipped} skipped" if skipped else ""), secs)
    if rc in (1, 2) and failed:
        # rc 2 with a recorded error is a collection error: the tree lacks what the proof imports.
        return Outcome("fail", first_failure, secs)
    return Outcome("error", f"pytest exited {rc}: {tail}", secs)


def prove(series: Series, workdir: Path, only: list[str] | None, timeout: float, cache: Path,
          log_dir: Path | None = None, lock_timeout: float = LOCK_TIMEOUT) -> ProveReport:
    wd = WorkDir(workdir)
    chosen = series.select(only) if only else list(series.patches)
    if only:
        named = set(only)
        chosen = [p for p in chosen if p.id in named or p.upstream in named]
    with_proof = [p for p in chosen if p.proofs]
    if not with_proof:
        raise UsageError("no selected patch has a proof", hint="check --only and the proof keys in series.toml")
    state = wd.require(series)
    report = ProveReport(series=series.name)
    # Hold the work directory's lock: an apply must not swap trees under a running proof.
    with wd.lock(lock_timeout), tempfile.TemporaryDirectory(prefix="carry-prove-") as tmp:
        tmpd = Path(tmp)
        for p in with_proof:
            rec = state.record(p.upstream)
            if rec is None:
                raise UsageError(f"{p.upstream}: no workspace in {workdir} for proof of {p.id}",
                                 hint=f"`{command('apply', series, '--workdir', wd.root)}` first")
            commit = rec.commit_of(p.id)
            if commit is None:
                raise UsageError(f"{p.upstream}: patch {p.id} is not applied in {workdir}",
                                 hint=f"`{command('apply', series, '--workdir', wd.root, '--only', p.id)}` first")
            repo = wd.workspace(p.upstream)
            others = {u: wd.workspace(u) for u, _ in state.records() if u != p.upstream}
            pristine_tree = tmpd / f"{p.upstream}-base"
            if not pristine_tree.exists():
                extract(repo, rec.base_commit, pristine_tree)
            patched_tree = extract(repo, commit, tmpd / f"{p.upstream}-{p.id}")
            for proof in p.proofs:
                progress.say(f"{p.id}: {proof} on the pristine base")
                a = run_proof(series, p, {**others, p.upstream: pristine_tree}, timeout, log_dir, "pristine", proof, cache)
                progress.say(f"{p.id}: {proof} on the patched tree")
                b = run_proof(series, p, {**others, p.upstream: patched_tree}, timeout, log_dir, "patched", proof, cache)
                if a.result == "skipped" and b.result == "skipped":
                    ok = None
                else:
                    ok = a.result == "fail" and b.result == "pass"
                report.proofs.append(ProofResult(p.id, proof, a.result, b.result, ok, a.detail, b.detail,
                                                 round(a.seconds + b.seconds, 1)))
    report.ok = all(r.ok is not False for r in report.proofs)
    return report
