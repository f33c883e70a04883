"""Proofs: each patch's test must fail on the pristine base and pass patched.

A proof runs as ``python -m pytest`` would, forked from the prove's zygote
(carry.evidence.zygote) or, with ``fresh`` and where torch sees a CUDA device, in a
fresh interpreter, with the trees of every upstream on PYTHONPATH: the upstream under test at its pristine base
or at that patch's commit, the others at their patched heads. Outcomes come
from pytest's JUnit XML, not from guessing at its output. A proof that passes
on the pristine base proves nothing and fails the run; one that needs a GPU
reports ``skipped`` where there is none, never ``pass``.

Four outcomes per run: ``pass``, ``fail`` (the proof ran and is red), ``skipped``, and
``error``: the proof could not run here, so it says nothing about the tree. It is an error of
the environment when the proof's interpreter cannot import a module that no tree under test
provides (Megatron-Bridge's ``omegaconf`` on a host without it), when a rank was forked after
CUDA was initialised, when its environment cannot be built, or when the interpreter or pytest
stops before any test body started (no pytest, a crash at start-up, pytest's own usage or
internal errors). The plugin ``proofsite/carry_proof_plugin.py`` records, from inside the proof's
pytest, when each test body starts and what each exception was; a crash or a timeout after a
body started is a ``fail`` of that body. A red is a body that ran and failed: an error of
collection (an import of what only the patch adds), of a fixture's setup or teardown is ``error``,
never red; and each proof declares what it fails with on the pristine base (``PRISTINE_FAILS``, a
regex every failing body's ``Type: message`` must match), else its red is not counted
(``red_for_its_reason``). The pristine run of a patch that ``requires`` others of its upstream has
those applied (``pristine_tree``): without them its proof meets their bugs first (the refit
planner's proof met the inference collection's), red for another patch's reason. A prove in which every selected proof skipped proved nothing: it is not
``ok`` and exits 2. ``error`` is never evidence: prove exits 2 for it (the
host is not configured for the proof) unless a proof is also not red/green (exit 1), the nightly
reports it as ``error`` and does not bisect it, and retire takes no behaviour evidence from it.
"""

from __future__ import annotations

import io
import os
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, wait as futures_wait
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import progress, shell
from ..errors import CommandError, SourceError, UsageError
from ..lock import LOCK_TIMEOUT
from ..git import Git
from ..runner import kill_groups, run
from ..series.entries import patched_tree_name, pristine_tree_name, proof_log_name
from ..series.manifest import PatchMeta, Series
from ..series.repo import command
from ..workspace.workdir import WorkDir
from . import proofenv, scratch as scratchdirs, tesite, zygote
from .outcome import Outcome, classify as _classify, events as _events
from .pristine import pristine_tree, red_for_its_reason


@dataclass
class ProofResult:
    id: str
    proof: str
    pristine: str
    patched: str
    ok: bool | None       # None: not decided here (skipped, or an environment error)
    pristine_detail: str = ""
    patched_detail: str = ""
    seconds: float = 0.0
    via: list[str] = field(default_factory=list)   # how the pristine and the patched run started (Outcome.via)


@dataclass
class ProveReport:
    series: str
    ok: bool = True
    proofs: list[ProofResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # patches whose proof could not run here

    @property
    def all_skipped(self) -> bool:
        """Every selected proof skipped on both trees: the prove showed nothing."""
        return bool(self.proofs) and all(r.pristine == r.patched == "skipped" for r in self.proofs)

    def to_dict(self) -> dict:
        return {**asdict(self), "all_skipped": self.all_skipped}


# What every proof interpreter runs with (zygote child or fresh). No bytecode left in the trees. No
# pytest plugin from the interpreter's installed packages (hypothesis's, pytest-benchmark's, ...):
# a proof's verdict must not depend on them, and loading them (hypothesis at the session's end,
# their modules assertion-rewritten each run) was 1.8 s of a 2.9 s empty run. The proofs load what
# they use: -c's pytest.ini and -p carry_proof_plugin.
PROOF_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


def env_name(upstream: str) -> str:
    return "CARRY_TREE_" + upstream.upper().replace("-", "_")


def extract(repo: Path, commit: str, dest: Path) -> Path:
    data = Git(repo).archive(commit)
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        tf.extractall(dest, filter="data")
    return dest


PLUGIN_DIR = Path(__file__).resolve().parent / "proofsite"


def usable_cores() -> int:
    """The cores this process may run on (os.cpu_count counts the machine's, also where a few are lent)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def jobs() -> int:
    """How many proof runs go at once: one per two usable cores (a run is a pytest and, most
    often, two ranks), but two on 2 to 4 cores and one on one. Measured on 2 cores over the 32
    CPU runs: 410 s one at a time, 216 s two at a time, slower again four at a time (a run
    leaves a core idle for much of its time: start-up, rendezvous, a rank waiting on the other).
    ``CARRY_PROOF_JOBS=N`` decides instead."""
    forced = os.environ.get("CARRY_PROOF_JOBS", "")
    if forced:
        try:
            return max(1, int(forced))
        except ValueError:
            raise UsageError(f"CARRY_PROOF_JOBS={forced!r} is not a number of runs",
                             hint="set it to a whole number such as 2, or unset it") from None
    cores = usable_cores()
    return min(cores, max(2, cores // 2))


@dataclass
class ProofCommand:
    """One proof run as a command line: what ``run_proof`` runs (or hands a zygote) and what the
    nightly launches (carry.nightly: on this machine, or as a Slurm job step). Its pytest writes
    its JUnit XML to ``xml`` and the plugin's events to ``events``; ``classify`` judges from them."""
    python: str
    args: list[str]                 # pytest's own arguments (a zygote's child is handed these)
    env: dict[str, str]             # set over the environment it is started from
    unset: tuple[str, ...]          # that environment's variables it must not see
    cwd: Path
    xml: Path
    events: Path

    @property
    def argv(self) -> list[str]:
        return [self.python, "-m", "pytest", *self.args]

    def environ(self) -> dict[str, str]:
        """This process's environment as the proof must see it."""
        env = {k: v for k, v in os.environ.items() if k not in self.unset}
        env.update(self.env)
        return env

    def outcome(self, rc: int | None, output: str, secs: float) -> Outcome:
        """What the run left, classified (``rc`` None: it did not finish; ``output`` says why)."""
        return _classify(rc, self.xml, output, secs, _events(self.events))


def proof_command(series: Series, patch: PatchMeta, trees: dict[str, Path], files: Path, proof: str | None = None,
                  python: str | None = None, cache: Path | None = None, fresh: bool = False,
                  parent: str | None = None) -> ProofCommand:
    """The command of one proof run (by default the patch's first proof) on ``trees``; its report
    files go to the folder ``files``. The path is: the proofs folder, the trees, the TransformerEngine
    site (carry.evidence.tesite), the plugin, then the caller's PYTHONPATH. ``python``: the
    interpreter (else this one). ``parent``: what the plugin ties the proof's life to
    (``$CARRY_PROOF_PARENT``, carry_proof_plugin): a pid, ``launcher`` or, None, this process."""
    proof = proof or patch.proof
    assert proof
    proofs_dir = series.root / "proofs"
    target = series.root / proof.split("::")[0]
    tree_paths = []
    env: dict[str, str] = {}
    for up in series.upstreams:
        if up.name in trees:
            root = trees[up.name]
            tree_paths.append(str((root / up.python_path).resolve()))
            env[env_name(up.name)] = str(root.resolve())
    te = tesite.site()
    # The trees go first; whatever the caller had (e.g. a TransformerEngine install) stays after them.
    paths = [str(proofs_dir), *tree_paths, *([str(te)] if te else []), str(PLUGIN_DIR)]
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update(PROOF_ENV)
    if fresh:
        env["CARRY_PROOF_FRESH"] = "1"
    if cache is not None:
        env["CARRY_PROOF_CACHE"] = str(cache / "proof-builds")
    env["CARRY_PROOF_TREES"] = os.pathsep.join(tree_paths)
    env["CARRY_PROOF_PARENT"] = parent or str(os.getpid())  # the plugin ties the proof to it (carry_lifeline)
    xml, events = files / "junit.xml", files / "events.jsonl"
    env["CARRY_PROOF_EVENTS"] = str(events)
    # What the caller's environment must not hand the proof: another tree, another run's settings.
    unset = tuple(k for k in os.environ if k not in env and
                  (k.startswith("CARRY_TREE_") or k in ("CARRY_PROOF_FRESH", "CARRY_PROOF_CACHE")))
    # No --rootdir: pytest expands $NAME in it (a series under a folder named 'a$HOME' would break);
    # with -c and no --rootdir, the rootdir is the ini file's folder, the same proofs_dir.
    args = ["-q", "-c", str(proofs_dir / "pytest.ini"), "-p", "carry_proof_plugin",
            f"--junitxml={xml}", "-o", "junit_family=xunit1",
            str(target) + ("::" + proof.split("::", 1)[1] if "::" in proof else "")]
    return ProofCommand(python or sys.executable, args, env, unset, series.root.parents[1], xml, events)


def run_proof(series: Series, patch: PatchMeta, trees: dict[str, Path], timeout: float,
              log_dir: Path | None = None, label: str = "", proof: str | None = None,
              cache: Path | None = None, zygotes: dict[str, zygote.Zygote] | None = None,
              scratch: Path | None = None, fresh: bool = False) -> Outcome:
    """Run one proof (by default the patch's first) against the given trees; classify from JUnit XML.

    With ``cache``, a proof whose folder pins its own requirements runs in the environment
    carry.evidence.proofenv builds from them (else in this interpreter); the command is
    ``proof_command``'s. With ``zygotes`` (by interpreter), the run forks from that interpreter's zygote where it
    forks safely (carry.evidence.zygote), else it is a fresh interpreter. ``scratch``: where its
    report files go (else a temporary folder). ``fresh`` (prove --fresh) also tells the proof's own
    helpers to start every process afresh (``CARRY_PROOF_FRESH=1``: a world of ranks per call, a
    fresh interpreter where a proof needs one), the old way the zygote's runs are compared with.
    With ``cache``, ``CARRY_PROOF_CACHE`` names a folder under it where a proof may keep what is a
    function of its inputs alone (a compiled extension, keyed by its sources' hash).
    """
    proof = proof or patch.proof
    assert proof
    try:
        python = proofenv.python_for(series, proof, cache) if cache is not None else None
    except SourceError as exc:
        return Outcome("error", f"environment: {exc.message}")
    z = (zygotes or {}).get(python or sys.executable)
    with tempfile.TemporaryDirectory(prefix="carry-proof-", dir=scratch) as tmp:
        cmd = proof_command(series, patch, trees, Path(tmp), proof, python, cache, fresh)
        env = cmd.environ()
        t0 = time.monotonic()
        via = "fresh"
        try:
            if z is not None and z.wait_ready() and z.forks_safely:
                via = "zygote"
                rc, out, err = z.run(cmd.args, env, cmd.cwd, timeout, Path(tmp))
            else:
                # Its own process group: a timeout kills its ranks (and a forkserver) with it.
                res = run(cmd.argv, env=env, cwd=cmd.cwd, check=False, timeout=timeout, group=True)
                rc, out, err = res.returncode, res.stdout, res.stderr
            output = out + err
            log_text = output
        except CommandError as exc:  # a timeout, or no interpreter: an outcome, not a crash of ours
            rc, output = None, f"did not finish: {exc.message}"
            log_text = "".join(getattr(exc, "partial", ())) + "\n" + output  # what it said before it was killed
        secs = time.monotonic() - t0
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
            (log_dir / proof_log_name(patch.id, proof, label)).write_text(log_text)
        outcome = cmd.outcome(rc, output, secs)
        outcome.via = via
        return outcome


def prove(series: Series, workdir: Path, only: list[str] | None, timeout: float, cache: Path,
          log_dir: Path | None = None, lock_timeout: float = LOCK_TIMEOUT, fresh: bool = False) -> ProveReport:
    """``fresh``: every run a fresh interpreter (no zygote: carry.evidence.zygote)."""
    wd = WorkDir(workdir)
    chosen = series.select(only) if only else list(series.patches)
    if only:
        named = set(only)
        chosen = [p for p in chosen if p.id in named or p.upstream in named]
    with_proof = [p for p in chosen if p.proofs]
    if not with_proof:
        raise UsageError("no selected patch has a proof", hint="check --only and the proof keys in series.toml")
    wd.require(series)
    report = ProveReport(series=series.name)
    stale = scratchdirs.sweep()
    if stale:
        progress.say(f"removed {len(stale)} scratch folder(s) a killed prove left: {', '.join(p.name for p in stale)}")
    # Hold the work directory's lock: an apply must not swap trees under a running proof. The
    # record is read under it, after finishing a swap a killed apply left journalled: read before,
    # it could name commits the workspaces no longer have.
    zygotes: dict[str, zygote.Zygote] = {}
    with wd.lock(lock_timeout), scratchdirs.folder() as tmpd:
        try:
            finished = wd.recover()
            if finished:
                progress.say(f"finished the swap of {', '.join(finished)} that an interrupted apply left")
            state = wd.require(series)
            for p in with_proof:
                if state.record(p.upstream) is None:
                    raise UsageError(f"{p.upstream}: no workspace in {workdir} for proof of {p.id}",
                                     hint=f"`{command('apply', series, '--workdir', wd.root)}` first")
            pythons = proof_pythons(series, [proof for p in with_proof for proof in p.proofs], cache)
            if not fresh:
                # Started now, from this (the main) thread: they import while the trees are extracted.
                zygotes.update(start_zygotes(series, pythons, tmpd, _tree_roots(series, wd, state)))
            pairs = _extract_pairs(series, wd, state, with_proof, tmpd)
            zygote.wait_all(zygotes)
            _run_pairs(series, pairs, timeout, log_dir, cache, zygotes, tmpd, report, fresh)
        finally:
            zygote.close_all(zygotes)
    report.ok = all(r.ok is not False for r in report.proofs) and not report.errors and not report.all_skipped
    return report


def proof_pythons(series: Series, proofs: list[str], cache: Path) -> dict[str, list[Path]]:
    """Interpreter -> the proof files it runs, each proof environment built here, once, before runs share it
    (a build's lock wait is the caller's thread's). A proof whose environment cannot be built is left out:
    each of its runs reports that as an environment error."""
    pythons: dict[str, list[Path]] = {}
    for proof in proofs:
        try:
            python = proofenv.python_for(series, proof, cache) or sys.executable
        except SourceError:
            continue
        pythons.setdefault(python, []).append(series.root / proof.split("::")[0])
    return pythons


def start_zygotes(series: Series, pythons: dict[str, list[Path]], scratch: Path,
                  roots: list[Path]) -> dict[str, zygote.Zygote]:
    """A zygote per interpreter of ``pythons`` (none where this platform cannot fork them), importing
    nothing of the trees whose import roots are ``roots``. The caller closes them."""
    if not zygote.wanted():
        return {}
    return zygote.start_all(pythons, scratch, _tree_tops(roots), series.root / "proofs", roots)


def import_roots(series: Series, trees: dict[str, Path]) -> list[Path]:
    """Each tree's import root (upstream name -> tree), where the tree has one."""
    return [tree / series.upstream(name).python_path for name, tree in trees.items()
            if (tree / series.upstream(name).python_path).is_dir()]


def _tree_roots(series: Series, wd: WorkDir, state) -> list[Path]:
    """Each applied tree's import root (its workspace at the patched head)."""
    return import_roots(series, {up.name: wd.workspace(up.name) for up in series.upstreams
                                 if state.record(up.name) is not None})


def _tree_tops(roots: list[Path]) -> set[str]:
    """The top-level names the trees under test provide (megatron, nemo_rl): a zygote never imports them."""
    tops = {e.name[:-3] if e.name.endswith(".py") else e.name for root in roots for e in root.iterdir()
            if e.is_dir() or e.name.endswith(".py")}
    return {t for t in tops if t.isidentifier()}


def _extract_pairs(series, wd, state, with_proof, tmpd: Path) -> list:
    pairs = []  # (patch, proof, pristine trees, patched trees), in series order
    for p in with_proof:
        rec = state.record(p.upstream)
        commit = rec.commit_of(p.id)
        if commit is None:
            raise UsageError(f"{p.upstream}: patch {p.id} is not applied in {wd.root}",
                             hint=f"`{command('apply', series, '--workdir', wd.root, *shell.unless_own('--only', p.id))}` first")
        repo = wd.workspace(p.upstream)
        others = {u: wd.workspace(u) for u, _ in state.records() if u != p.upstream}
        base = tmpd / f"{p.upstream}-base"
        if not base.exists():
            extract(repo, rec.base_commit, base)
        pristine = pristine_tree(series, p, base, tmpd / pristine_tree_name(p.upstream, p.id))
        patched_tree = extract(repo, commit, tmpd / patched_tree_name(p.upstream, p.id))
        for proof in p.proofs:
            pairs.append((p, proof, {**others, p.upstream: pristine}, {**others, p.upstream: patched_tree}))
    return pairs


def _run_pairs(series, pairs, timeout, log_dir, cache, zygotes, tmpd: Path, report: ProveReport,
               fresh: bool = False) -> None:
    n = jobs()
    progress.say(f"{len(pairs)} proofs, each on the pristine base and on the patched tree: "
                 f"{2 * len(pairs)} runs, {n} at a time")
    runs_dir = tmpd / "runs"
    runs_dir.mkdir()
    pool = ThreadPoolExecutor(max_workers=n)
    runs = []
    try:
        runs += [(pool.submit(run_proof, series, p, pristine, timeout, log_dir, "pristine", proof, cache, zygotes,
                             runs_dir, fresh),
                 pool.submit(run_proof, series, p, patched, timeout, log_dir, "patched", proof, cache, zygotes,
                             runs_dir, fresh))
                for p, proof, pristine, patched in pairs]
        for (p, proof, _, _), (first, second) in zip(pairs, runs):  # series order, whatever finishes first
            a, b = first.result(), second.result()
            progress.say(f"{p.id}: {proof}: pristine {a.result}, patched {b.result}")
            wrong = red_for_its_reason(a, series.root / proof.split("::")[0])
            if "error" in (a.result, b.result):
                ok = None  # it could not run here: no evidence either way (an environment error)
                report.errors.append(p.id)
            elif a.result == "skipped" and b.result == "skipped":
                ok = None
            else:
                ok = a.result == "fail" and b.result == "pass" and not wrong
            report.proofs.append(ProofResult(p.id, proof, a.result, b.result, ok,
                                             f"{wrong}; {a.detail}" if wrong else a.detail, b.detail,
                                             round(a.seconds + b.seconds, 1), [a.via, b.via]))
    except BaseException:
        # Ctrl-C (or a failure of ours): nothing queued starts, the running proofs are killed, and
        # the caller removes their trees once the threads let go of them.
        pool.shutdown(wait=False, cancel_futures=True)
        started = [f for pair in runs for f in pair]
        while not all(f.done() for f in started):  # a run a thread was just starting is killed too
            for z in zygotes.values():
                z.kill_children()
            kill_groups()
            futures_wait(started, timeout=0.2)
        raise
    pool.shutdown(wait=True)
