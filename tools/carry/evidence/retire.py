"""Retire: decide, with evidence, which patches an upstream base already has.

Three kinds of evidence per patch, reported side by side:
  text       the patch reverse-applies on the new base, or applying it finds
             it already there, or (git) an upstream commit in the new range
             has the same `git patch-id --stable`;
  behaviour  the patch's proof passes on the pristine new base: the bug is
             gone upstream even if upstream fixed it differently (a proof
             that could not run there, carry.evidence.prove's ``error``, is no
             evidence either way);
  link       (git) the recorded upstream merge commit is an ancestor of the
             new base.
Disagreements are reported, not hidden. ``--write`` retires the landed
patches, re-pins the upstream and re-applies the rest on the new base; if
that fails nothing is written.
"""

from __future__ import annotations

import datetime as dt
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from .. import progress, shell
from ..errors import OperationError, UsageError
from ..files import read_input, read_input_text
from ..git import Git
from ..series import edit as seriesedit
from ..series import retirement
from ..series.manifest import PatchMeta, Series
from ..series.repo import command
from ..workspace import sourcepath, sources, trial
from ..workspace.am import am_each, older_bases
from ..workspace.apply import Options, apply_series
from ..workspace.installed import Installed
from ..workspace.workdir import WorkDir
from . import zygote
from .prove import extract, import_roots, proof_pythons, run_proof, start_zygotes
from .upstream import rerun
from .upstream.check import Options as TestsOptions


@dataclass
class Verdict:
    id: str
    verdict: str                  # landed | needed | conflicts | unknown
    text: str                     # landed | applies | conflicts | n/a
    behaviour: str                # pass | fail | skipped | error | no-proof
    link: str = "n/a"             # landed | not-yet | n/a
    candidate: bool = False       # landed by behaviour only while the text still applies
    evidence: list[str] = field(default_factory=list)
    disagreements: list[str] = field(default_factory=list)
    via: list[str] = field(default_factory=list)   # how each proof run started: zygote | fresh (Outcome.via)


@dataclass
class RetireReport:
    series: str
    upstream: str
    against: str
    new_base: str
    ok: bool = True
    written: bool = False
    patches: list[Verdict] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)
    error: str | None = None
    hint: str | None = None       # the next step, when ``error`` has one

    def to_dict(self) -> dict:
        return asdict(self)


def _text_signal(series: Series, p: PatchMeta, base_repo: Path, scratch: Path,
                 seq_status: str, range_ids: dict[str, str], seq_detail: str = "") -> tuple[str, list[str]]:
    ev = []
    tree = scratch / "probe"
    g = Git(tree) if tree.exists() else Git.clone(base_repo, tree, branch="main")
    path = series.patch_path(p)
    if g("apply", "--reverse", "--check", str(path), check=False).ok:
        ev.append("text: the patch reverse-applies cleanly on the new base")
        return "landed", ev
    if seq_status == "already-applied":
        ev.append("text: applying it on the new base (3-way) finds the change already there")
        return "landed", ev
    ids = g.patch_ids(read_input(path))
    if ids and ids[0][0] in range_ids:
        ev.append(f"text: upstream commit {range_ids[ids[0][0]][:12]} has the same patch-id")
        return "landed", ev
    if seq_status == "applied":
        ev.append("text: the patch still applies on the new base")
        return "applies", ev
    ev.append("text: the patch conflicts with the new base" + (f" ({seq_detail})" if seq_detail else ""))
    return "conflicts", ev


def link_signal(p: PatchMeta, new_commit: str | None, history: list[Path], ev: list[str]) -> str:
    """landed | not-yet | n/a: whether the patch's merged_in is an ancestor of the new base."""
    holder = next((Git(h) for h in history if new_commit and p.merged_in and Git(h).has_commit(new_commit)
                   and Git(h).has_commit(p.merged_in)), None)
    if not p.merged_in or holder is None:
        return "n/a"
    anc = holder("merge-base", "--is-ancestor", p.merged_in, new_commit, check=False).ok
    ev.append(f"link: {p.merged_in[:12]} is {'an' if anc else 'not an'} ancestor of the new base")
    return "landed" if anc else "not-yet"


def _range_patch_ids(old_commit: str | None, new_commit: str, history: list[Path]) -> dict[str, str]:
    """patch-id -> upstream commit, for every commit between the old pin and the new base.

    ``history`` are repositories that may hold both commits (the new base itself, a checkout).
    """
    for repo in history if old_commit else []:
        g = Git(repo)
        if g.has_commit(old_commit) and g.has_commit(new_commit):
            # `git patch-id` reads a whole `git log -p` stream and prints "<patch-id> <commit>" per commit.
            return dict(g.patch_ids(g.log_patches(f"{old_commit}..{new_commit}")))
    return {}


def _decide(text: str, behaviour: str, link: str) -> tuple[str, bool, list[str]]:
    dis = []
    if behaviour == "error":
        # carry.evidence.prove's environment errors: the proof could not run, so it says nothing either way.
        return "unknown", False, ["the proof could not run on the new base (an error of its environment, "
                                  "not a red proof): no behaviour evidence"]
    if behaviour == "pass":
        if text == "applies" and link != "landed":
            dis.append("the proof passes upstream but the patch still applies: upstream fixed it some other way "
                       "(a candidate, not a certainty)")
            return "landed", True, dis
        if text == "conflicts":
            dis.append("the patch no longer applies, but the bug is gone: upstream fixed it differently")
        return "landed", False, dis
    if behaviour == "fail":
        if text == "landed" or link == "landed":
            dis.append("the text is upstream but the proof still fails there: the fix may be incomplete "
                       "upstream, or the proof depends on another patch")
            return "needed", False, dis
        return ("conflicts" if text == "conflicts" else "needed"), False, dis
    # no behaviour evidence (no proof, or a GPU proof without a GPU)
    if text == "landed" or link == "landed":
        return "landed", False, dis
    if text == "conflicts":
        return "conflicts", False, dis
    if text == "applies":
        return "needed", False, dis
    return "unknown", False, dis


def retire(series: Series, name: str, target: str, cache: Path, write: bool, workdir: Path | None,
           source_paths: dict[str, Path], timeout: float, accept_candidates: bool = False,
           tests_sources: dict[str, Path] | None = None) -> RetireReport:
    """``source_paths``: --source NAME=PATH; NAME's is the new base, the others' build their trees.
    ``tests_sources`` (--upstream-tests, its --tests-source clones): each patch's recorded upstream_tests run
    on the new base too; None: they are named, not run."""
    up = series.upstream(name)
    mine = series.patches_for(name)
    if not mine:
        raise UsageError(f"{name} has no patch in series {series.name}")
    source = source_paths.get(name)
    stuck = sourcepath.pin_can_move(up, source) if write else None
    if stuck:
        raise UsageError(f"--write: {stuck}; nothing was written",
                         hint=shell.release_instead("--against", name) + ", or drop --write for the verdicts alone: "
                              + (shell.again({"--write": None}) or "the same command without --write"))
    new_up, base = sources.retarget(up, target, cache, source)
    rep = RetireReport(series.name, name, target, base.describe)
    with tempfile.TemporaryDirectory(prefix="carry-retire-") as tmp:
        tmpd = Path(tmp)
        Git.clone(base.repo, tmpd / "seq", branch="main")
        seq = {r.id: r for r in am_each(tmpd / "seq", series, mine, older_bases(base))}
        history = [base.repo]
        if up.git:
            history.append(sources.mirror_path(up, cache))
        if source is not None and source.is_dir():
            history.append(source)
        old_commit = up.git.commit if up.git else None
        new_commit = new_up.git.commit if new_up.git else None
        range_ids = _range_patch_ids(old_commit, new_commit, history) if new_commit else {}
        trees = _other_trees(series, name, workdir, cache, tmpd, source_paths)
        pristine = extract(base.repo, base.commit, tmpd / "pristine")
        trees = {**trees, name: pristine}
        tests = None if tests_sources is None else _UpstreamTests(series, name, new_up, cache, tests_sources, timeout,
                                                                 tmpd / "upstream-tests")
        # The proofs fork from a zygote per interpreter, as prove's do (carry.evidence.zygote): the imports no
        # tree provides (torch, and Megatron-Bridge's third-party stack) are paid once, not once per proof.
        zygotes = start_zygotes(series, proof_pythons(series, [f for p in mine for f in p.proofs], cache), tmpd,
                                import_roots(series, trees))
        try:
            zygote.wait_all(zygotes)
            for p in mine:
                applied = seq.get(p.id)
                text, ev = _text_signal(series, p, base.repo, tmpd, applied.status if applied else "failed",
                                        range_ids, applied.detail if applied and applied.status == "failed" else "")
                behaviour, via = _behaviour(series, p, trees, timeout, ev, cache, zygotes)
                said = _upstream_tests(series, p, trees, tests, ev)
                conflict = said if said and behaviour in ("pass", "fail") and said != behaviour else None
                if said and behaviour in ("no-proof", "skipped"):   # upstream's own tests are the behaviour
                    behaviour = said
                link = link_signal(p, new_commit, history, ev)
                verdict, candidate, dis = _decide(text, behaviour, link)
                if conflict:
                    dis.append(f"its proof {'passes' if behaviour == 'pass' else 'fails'} on the new base, but "
                               f"upstream's own tests it fixed {'pass' if conflict == 'pass' else 'fail'} there")
                rep.patches.append(Verdict(p.id, verdict, text, behaviour, link, candidate, ev, dis, via))
        finally:
            zygote.close_all(zygotes)
    landed = [v.id for v in rep.patches if v.verdict == "landed" and (accept_candidates or not v.candidate)]
    if write:
        _write(series, new_up, landed, rep, cache, source)
    return rep


class _UpstreamTests:
    """How --upstream-tests runs a patch's recorded tests: upstream's own launch (check.Options), in folders that
    hold what an install of each base holds (the new base's: its wheel; a new base from a checkout is a source
    tree, which builds what it compiles itself)."""

    def __init__(self, series: Series, name: str, new_up, cache: Path, clones: dict[str, Path], timeout: float,
                 out: Path):
        self.name, self.new_up, self.out = name, new_up, out
        self.opts = TestsOptions(cache=cache, out=out, sources=clones, test_timeout=timeout)
        moved = replace(series, upstreams=tuple(new_up if u.name == name else u for u in series.upstreams))
        self.installed = Installed(moved, sys.executable, cache)

    def finish(self, upstream: str, folder: Path) -> None:
        if upstream != self.name or self.new_up.sources[0] == "pypi":
            self.installed(upstream, folder)


def _upstream_tests(series: Series, p: PatchMeta, trees: dict[str, Path], tests: _UpstreamTests | None,
                    ev: list[str]) -> str | None:
    """A patch's recorded upstream_tests (tools/upstream_tests.py --record-fixed) on the new base without it:
    ``pass``/``fail``/None (rerun.fixed_upstream) with --upstream-tests; without it, named in ``ev``, not run."""
    if not p.upstream_tests:
        return None
    if tests is None:
        more = " ..." if len(p.upstream_tests) > 3 else ""
        ev.append(f"upstream's own tests it fixed (its upstream_tests, {len(p.upstream_tests)}, not run: "
                  f"--upstream-tests runs them): {', '.join(p.upstream_tests[:3])}{more}")
        return None
    progress.say(f"{p.id}: {len(p.upstream_tests)} upstream test(s) it fixed, on the new base")
    return rerun.fixed_upstream(series, p.upstream_tests, trees, tests.out / p.id, tests.opts, ev, tests.finish)


def _behaviour(series: Series, p: PatchMeta, trees: dict[str, Path], timeout: float, ev: list[str],
               cache: Path, zygotes: dict[str, zygote.Zygote]) -> tuple[str, list[str]]:
    """All of a patch's proofs on the new base: any crash -> error, any fail -> fail, a pass -> pass; and how
    each run started (zygote | fresh)."""
    if not p.proofs:
        return "no-proof", []
    results, via = [], []
    for proof in p.proofs:
        progress.say(f"{p.id}: {proof} on the new base")
        out = run_proof(series, p, trees, timeout, proof=proof, cache=cache, zygotes=zygotes)
        ev.append(f"behaviour: {proof} {out.result} on the new base ({out.detail})")
        via.append(out.via)
        results.append(out.result)
    return next((kind for kind in ("error", "fail", "pass") if kind in results), "skipped"), via


def _other_trees(series: Series, name: str, workdir: Path | None, cache: Path, tmpd: Path,
                 source_paths: dict[str, Path]) -> dict[str, Path]:
    """Patched trees of the other upstreams, for proofs that import them."""
    if workdir is not None:
        wd = WorkDir(workdir)
        with wd.lock():
            wd.recover()  # a swap an interrupted apply left: finished (or undone) before its trees are read
            state = wd.load_state()
        return {u: wd.workspace(u) for u, _ in state.records() if u != name}
    others = [u.name for u in series.upstreams if u.name != name and (u.sources[0] == "pypi" or u.name in source_paths)]
    if not others:
        return {}
    wd_path = tmpd / "others"
    try:
        apply_series(series, Options(workdir=wd_path, cache=cache, only=others,
                                     sources={u: source_paths[u] for u in others if u in source_paths}))
    except OperationError as exc:
        progress.say(f"other upstreams unavailable for proofs: {exc.message}")
        return {}
    return {u: wd_path / u for u in others}


def _write(series: Series, new_up, landed: list[str], rep: RetireReport, cache: Path,
           source: Path | None) -> None:
    """Retire, re-pin, re-apply in a scratch copy; only then touch the real series."""
    root = series.root
    text = read_input_text(root / "series.toml")
    needing = [(p, dep) for p in series.patches if p.id not in landed for dep in p.requires if dep in landed]
    if needing:
        # The edited series would not even load: say which requirement stands in the way, in the
        # real manifest, and what to choose (the verdicts are printed with this error).
        again = ["--against", f"{new_up.name}={rep.against}",
                 *(["--source", f"{new_up.name}={source}"] if source is not None else []), "--write"]
        lines = [f"{p.id} ({p.upstream}) requires {dep}, which the new base has (verdict landed)" for p, dep in needing]
        rep.ok = False
        rep.error = ("cannot retire " + ", ".join(sorted({dep for _, dep in needing})) + ": "
                     + "; ".join(lines) + f"; nothing was written to {root / 'series.toml'}")
        p, dep = needing[0]
        rep.hint = (f"choose, in {root / 'series.toml'}: if {p.id} only needs {dep}'s change (now in the new base), "
                    f"drop \"{dep}\" from the requires = [...] of [[patches]] id = \"{p.id}\" and run "
                    f"`{command('retire', series, *again)}`; "
                    f"if {p.id} needs {dep} kept as a patch, keep the series as it is (retire without --write "
                    "only reports)")
        return
    if landed:
        text = seriesedit.remove_patches(text, set(landed))
    text = seriesedit.repin(text, new_up, new_up.sources[0])
    check = trial.trial_apply(series, text, {}, new_up.name, cache, source)
    if not check.ok:
        rep.ok = False
        rep.error = "the remaining series does not apply on the new base; nothing was written:\n" + (check.error or "")
        return
    commit_retirement(series, text, [v for v in rep.patches if v.id in landed], rep.new_base, rep.against)
    rep.retired = landed
    rep.written = True


def commit_retirement(series: Series, text: str, landed: list[Verdict], new_base: str, against: str, *,
                      writes: dict[Path, str | bytes] | None = None, kind: str = "retire", what: str | None = None) -> None:
    """Write the edited manifest ``text`` and move the ``landed`` patches to retired/ with their records;
    each file of ``writes`` (rebase: the refreshed patch files) gets its new text in the same step.

    One journalled step (carry.series.retirement): a run killed before the journal leaves the
    series as it was (its staging is removed by the next run); killed after it, the next run
    that loads the series finishes it. Used by retire --write and by rebase (its refreshed
    patches, and a patch upstream merged in its own words).
    """
    root = series.root
    today = dt.date.today().isoformat()
    by_id = {v.id: v for v in landed}
    landed_ids = [v.id for v in landed]
    staged = retirement.staging_folder(root)
    if staged.exists():
        shutil.rmtree(staged)  # an older run's of this pid (recovery would have removed a dead one's)
    staged.mkdir(parents=True)
    moves = []
    try:
        for pid in landed_ids:
            meta = series.patch(pid)
            dest = staged / pid
            dest.mkdir()
            shutil.copy2(series.patch_path(meta), dest / Path(meta.file).name)
            moves.append(series.patch_path(meta))
            for ref in meta.proofs:
                proof = root / ref.split("::")[0]
                shutil.copy2(proof, dest / proof.name)
                users = [q for q in series.patches if any(r.split("::")[0] == ref.split("::")[0] for r in q.proofs)]
                if len(users) == 1:
                    moves.append(proof)
            v = by_id[pid]
            (dest / "record.toml").write_text(
                f'id = "{pid}"\ntitle = {seriesedit.toml_str(meta.title)}\nupstream = "{meta.upstream}"\n'
                f'retired_on = "{today}"\nnew_base = {seriesedit.toml_str(new_base)}\n'
                f'against = {seriesedit.toml_str(against)}\nverdict = "{v.verdict}"\n'
                f'text = "{v.text}"\nbehaviour = "{v.behaviour}"\nlink = "{v.link}"\n'
                "evidence = [\n" + "".join(f"  {seriesedit.toml_str(e)},\n" for e in v.evidence) + "]\n"
                "disagreements = [\n" + "".join(f"  {seriesedit.toml_str(e)},\n" for e in v.disagreements) + "]\n")
    except OSError as exc:
        shutil.rmtree(staged, ignore_errors=True)
        if exc.filename is None:  # a failed write() (a full disk) names no file: this is where it wrote
            raise OSError(exc.errno, exc.strerror, str(staged)) from exc
        raise
    retirement.commit(root, text, landed_ids, moves, writes=writes, kind=kind, what=what)
