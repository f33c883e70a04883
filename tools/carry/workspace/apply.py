"""Applying a series: pinned bases + patches -> patched workspaces, as one transaction.

All-or-nothing across upstreams: every selected upstream is rebuilt in
staging first; only when all of them applied cleanly are they swapped in.
An upstream whose workspace already matches (same base, same patch bytes,
untouched) is reported ``already-applied`` and not rebuilt. The plumbing
(clone a base, ``git am``) is carry.workspace.am; this module is the transaction.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from .. import progress
from ..errors import DirtyTreeError, PatchFormatError, UsageError
from ..files import read_input_text, write_json
from ..git import Git
from ..lock import LOCK_TIMEOUT, sweep_builds
from ..report import ApplyReport, PatchResult, UpstreamResult
from ..series.manifest import PatchMeta, Series, file_sha256
from ..series.patchfile import parse_file, safety_problems
from ..series.patchgit import git_problems
from ..series.repo import command
from ..shell import code, values
from . import sources, userwork, wheels
from .am import am_patches, clone_base, older_bases
from .workdir import PatchRecord, State, UpstreamRecord, WorkDir


@dataclass
class Options:
    workdir: Path
    cache: Path
    only: list[str] | None = None
    sources: dict[str, Path] = field(default_factory=dict)
    into: dict[str, Path] = field(default_factory=dict)
    check: bool = False
    wheels_dir: Path | None = None
    lock_timeout: float = LOCK_TIMEOUT


def _targets(series: Series, selected: list[PatchMeta], opts: Options) -> list[str]:
    if not opts.only:
        return [u.name for u in series.upstreams]
    names = {p.upstream for p in selected}
    names.update(x for x in opts.only if x in [u.name for u in series.upstreams])
    return [u.name for u in series.upstreams if u.name in names]


def apply_series(series: Series, opts: Options) -> ApplyReport:
    selected = series.select(opts.only)
    for name in list(opts.sources) + list(opts.into):
        series.upstream(name)  # unknown names are usage errors
    _check_patches(series, selected, opts)
    targets = _targets(series, selected, opts)
    for name in targets:  # a bad pin is bad input, before any work (warm cache or cold)
        if name not in opts.into:
            sources.check_pins(series.upstream(name), opts.sources.get(name))
    report = ApplyReport(series=series.name, check=opts.check, digest=series.digest(selected)[:12])
    wd = WorkDir(opts.workdir)
    with wd.lock(opts.lock_timeout):  # which bounds the cache's locks too
        wd.recover()
        sweep_builds(opts.cache)
        txn = _Transaction(series, opts, selected, wd, wd.load_state(), report)
        try:
            for name in targets:
                report.upstreams.append(_apply_upstream(txn, name))
            progress.checkpoint("staged")
            if not _swap_in(txn):
                return report
        except BaseException:
            _rollback_into(txn.into_done)
            raise
        finally:
            if txn.staging is not None:
                shutil.rmtree(txn.staging, ignore_errors=True)
        if opts.wheels_dir is not None:
            _build_wheels(series, opts, report)
    return report


@dataclass
class _Transaction:
    """What one apply_series run carries from upstream to upstream, under the work directory's lock."""
    series: Series
    opts: Options
    selected: list[PatchMeta]
    wd: WorkDir
    state: State
    report: ApplyReport
    staging: Path | None = None  # made when the first upstream is rebuilt; removed on the way out
    rebuilt: list[str] = field(default_factory=list)
    new_records: dict[str, UpstreamRecord] = field(default_factory=dict)
    into_done: list[tuple[Path, str]] = field(default_factory=list)
    built: dict[str, str] = field(default_factory=dict)  # the heads this run made; the workspaces' only on success


def _check_patches(series: Series, selected: list[PatchMeta], opts: Options) -> None:
    """Every selected patch file exists, parses, and is safe: ours, then git's own reading of the
    same files (one git process for them all)."""
    parsed = []
    for p in selected:
        if not series.patch_path(p).exists():
            raise UsageError(f"{p.upstream}: patch {p.id} names {p.file}, which does not exist",
                             hint=f"`{command('lint', series)}` lists every such problem")
        try:
            parsed.append((p, parse_file(series.patch_path(p))))
        except PatchFormatError as exc:  # malformed: named with its patch, not as a conflict later
            raise PatchFormatError(f"{p.upstream}: patch {p.id} ({p.file}) is malformed: {exc.message}",
                                   hint=f"fix the file; `{command('lint', series)}` lists every problem "
                                        "of the series") from None
    unsafe = {p.id: safety_problems(patch) for p, patch in parsed}
    by_path = git_problems([(series.patch_path(p), patch) for p, patch in parsed if not unsafe[p.id]],
                           opts.cache / "checked")
    for p, _ in parsed:
        why = unsafe[p.id] or by_path.get(series.patch_path(p))
        if why:
            raise PatchFormatError(f"{p.upstream}: patch {p.id} ({p.file}) is unsafe: {'; '.join(why)}",
                                   hint="a patch may only edit regular files inside its upstream's tree")


def _apply_upstream(txn: _Transaction, name: str) -> UpstreamResult:
    """One upstream: onto its --into checkout, or staged on its base; its unselected patches listed
    as not attempted, in the series' order."""
    series, opts = txn.series, txn.opts
    mine = [p for p in txn.selected if p.upstream == name]
    everyone = series.patches_for(name)
    if name in opts.into:
        # The checkout is the base: nothing to fetch.
        digest = series.upstream_digest(name, mine, "into")
        ur = _apply_into(series, name, opts.into[name], mine, digest, opts.check, txn.into_done, txn.built)
    else:
        ur = _apply_staged(txn, name, mine)
    selected_ids = {p.id for p in mine}
    ur.patches += [PatchResult(p.id, p.file, "not-attempted", "not selected (--only)")
                   for p in everyone if p.id not in selected_ids]
    order = {p.id: i for i, p in enumerate(everyone)}
    ur.patches.sort(key=lambda r: order.get(r.id, 0))
    return ur


def _apply_staged(txn: _Transaction, name: str, mine: list[PatchMeta]) -> UpstreamResult:
    """An upstream whose workspace is up to date is left as it is; else its base is cloned into the
    staging folder and its patches applied there."""
    series, opts, wd = txn.series, txn.opts, txn.wd
    base = sources.ready_base(series.upstream(name), opts.cache, opts.sources.get(name))
    digest = series.upstream_digest(name, mine, base.key)
    hashes = {p.id: file_sha256(series.patch_path(p)) for p in mine}  # what export may replace (carry.workspace.record)
    recorded = txn.state.record(name)
    ours = wd.check_untouched(name, recorded, series)
    # The workspace's own HEAD: what it is now, and stays unless this run succeeds.
    ur = UpstreamResult(name=name, base=base.describe, workspace=str(wd.workspace(name)),
                        base_commit=base.commit, head=recorded.head if ours and recorded else None)
    if ours and recorded and recorded.digest == digest:
        ur.patches = [PatchResult(p.id, p.file, "already-applied", "workspace is up to date") for p in mine]
        now = _inputs(opts, name)
        if recorded.inputs != now:  # the inputs moved: a hint's apply must name them as now
            txn.new_records[name] = replace(recorded, inputs=now)
        return ur
    wd.check_swappable([name])
    if txn.staging is None:
        txn.staging = wd.new_staging()
    progress.say(f"{name}: applying {len(mine)} patch(es) on {base.describe}")
    ws = clone_base(base, txn.staging / name).path
    made: list[str] = []
    ur.patches = am_patches(ws, series, mine, older_bases(base), made)
    if ours and recorded:
        ur.saved = wd.keep_unknown_commits(name, recorded, ws)
    txn.rebuilt.append(name)
    txn.new_records[name] = _record(base, digest, ws, mine, ur, made, hashes, _inputs(opts, name))
    txn.built[name] = txn.new_records[name].head
    return ur


def _swap_in(txn: _Transaction) -> bool:
    """All upstreams applied: swap the staged trees in and settle the --into checkouts. A check, or
    an upstream that failed, changes nothing (the --into checkouts go back): False."""
    report = txn.report
    failed = [u for u in report.upstreams if u.failed]
    if failed or txn.opts.check:
        report.ok = not failed
        for u in report.upstreams:
            u.saved = []  # the workspaces stay as they are: nothing was set aside
        _rollback_into(txn.into_done)
        if failed:
            report.error, report.next = _conflict_message(txn.series, failed, txn.opts)
        return False
    if txn.rebuilt:
        assert txn.staging is not None
        # From the journal on, the staged trees are the swap's: an interruption is finished
        # (or undone) by the next run, so this run must not delete them on its way out.
        swapping, txn.staging = txn.staging, None
        txn.wd.commit(swapping, txn.rebuilt, txn.state.with_upstreams(txn.series, txn.new_records))
    elif txn.new_records:  # nothing rebuilt; only where the inputs are now
        txn.wd.save_state(txn.state.with_upstreams(txn.series, txn.new_records))
    for u in report.upstreams:
        u.head = txn.built.get(u.name, u.head)
    _finish_into(txn.into_done)
    return True


def _build_wheels(series: Series, opts: Options, report: ApplyReport) -> None:
    """--wheels: each swapped-in upstream that is on PyPI, built as a wheel from its workspace."""
    for u in report.upstreams:
        up = series.upstream(u.name)
        if up.pypi is None or u.name in opts.into:
            continue
        made = wheels.build(series, up, Path(u.workspace), u.base_commit or "", u.head or "", opts.cache,
                            opts.wheels_dir, f"{series.name}.{report.digest}")
        u.wheels = [str(w) for w in made.written]
        u.wheels_skipped = made.skipped


def _record(base: sources.Base, digest: str, ws: Path, mine: list[PatchMeta], ur: UpstreamResult,
            made: list[str], hashes: dict[str, str], inputs: list[str]) -> UpstreamRecord:
    """``made``: the commits am_patches says it made (read here when it could not say)."""
    commits = made if made else Git(ws).rev_list(f"{base.commit}..HEAD")
    head = commits[-1] if commits else base.commit
    applied = [r for r in ur.patches if r.status == "applied"]
    return UpstreamRecord(base=base.describe, base_key=base.key, base_commit=base.commit, digest=digest, head=head,
                          selected=[p.id for p in mine],
                          patches=[PatchRecord(r.id, r.file, c, (hashes[r.id],)) for r, c in zip(applied, commits)],
                          made=commits, inputs=inputs)


def _inputs(opts: Options, name: str) -> list[str]:
    """The options that told this run where ``name``'s inputs are, absolute: ``--cache`` where the user
    gave one (else the default, which a later run finds alike) and ``--source`` for ``name``."""
    out = ["--cache", str(opts.cache.resolve())] if values("--cache") else []
    src = opts.sources.get(name)
    return out + (["--source", f"{name}={src.resolve()}"] if src else [])


def _conflict_message(series: Series, failed: list[UpstreamResult], opts: Options) -> tuple[str, str]:
    lines = []
    for u in failed:
        for p in u.patches:
            if p.status == "failed":
                lines.append(f"{u.name}: patch {p.id} ({p.file}) does not apply: {p.detail}")
    lines.append("nothing was changed")
    hints = []
    for u in failed:
        up = series.upstream(u.name)
        pin = up.pypi.version if up.pypi and up.sources[0] == "pypi" else (up.git.commit or up.git.ref)
        args = ["--onto", f"{u.name}={pin}"]
        if u.name in opts.sources:
            args += ["--source", f"{u.name}={opts.sources[u.name].expanduser().resolve()}"]
        hints.append(f"`{command('rebase', series, *args)}` re-applies {u.name}'s patches with 3-way merges "
                     "and stops at the conflict for you to resolve")
    return "\n".join(lines), "; ".join(hints)


# -- --into: applying onto an existing checkout --------------------------------------
def _apply_into(series: Series, name: str, target: Path, mine: list[PatchMeta], digest: str,
                check: bool, done: list[tuple[Path, str]], built: dict[str, str]) -> UpstreamResult:
    target = target.expanduser().resolve()
    g = Git(target)
    top = g("rev-parse", "--show-toplevel", check=False) if target.is_dir() else None
    if top is None or not top.ok:  # none there, a file, or a bare repository (no work tree)
        raise UsageError(f"--into {name}={target}: not a git checkout (a repository with a work tree)")
    if Path(top.stdout.strip()).resolve() != target:  # a folder inside one: its reset would take the whole
        raise UsageError(f"--into {name}={target}: a folder inside the git checkout {top.stdout.strip()}, "
                         "not the checkout itself", hint="name the checkout's top folder")
    ur = UpstreamResult(name=name, base=f"the checkout {target}", workspace=str(target))
    git_dir = g.git_dir()
    journal = git_dir / "carry-into-journal.json"
    _recover_into(g, name, target, journal)
    state_path = git_dir / "carry-state.json"
    head = g.head()
    recorded = _read_record(state_path, target) if state_path.exists() else None
    ur.head = head
    if recorded and recorded.get("head") == head and recorded.get("digest") == digest:
        ur.base_commit = recorded.get("start")
        ur.patches = [PatchResult(p.id, p.file, "already-applied", "checkout is up to date") for p in mine]
        return ur
    start = recorded["start"] if recorded and recorded.get("head") == head else head
    if start != head:
        g("reset", "-q", "--hard", start)  # re-apply a changed series from where we started
    write_json(journal, {"start": head})
    done.append((target, head or ""))
    ur.base_commit = start
    ur.patches = am_patches(target, series, mine)
    after = g.head()
    if not ur.failed and not check and after:
        write_json(state_path, {"series": series.name, "digest": digest, "start": start, "head": after})
        built[name] = after
    return ur


def _recover_into(g: Git, name: str, target: Path, journal: Path) -> None:
    """Check the checkout first; then, if a killed run of ours left its journal, go back to where it
    started. Nothing of the user's is lost on the way: uncommitted edits (made since, or the
    killed run's half-applied patch: they cannot be told apart) stop the run, with the command
    that keeps them; commits since the start are kept under refs/carry/saved/ before the reset."""
    killed = _read_record(journal, target) if journal.exists() else None
    if (g.git_dir() / "rebase-apply").exists():
        if killed is None:
            raise DirtyTreeError(f"{name}: --into target {target} has a `git am` in progress that this tool did "
                                 "not start", hint=f"{code('git', '-C', target, 'am', '--abort')} ends it (or "
                                                   f"finish it: {code('git', '-C', target, 'am', '--continue')}), "
                                                   "then run the command again")
        g("am", "--quit")  # the killed run's: HEAD, index and files stay as they are, for the checks below
    dirty = userwork.uncommitted(target)
    if dirty:
        why = (f"; a run of this tool was killed there (its journal {journal} is kept), and going back to where it "
               "started would discard them") if killed else ""
        raise DirtyTreeError(f"{name}: --into target {target} has uncommitted changes: {dirty.shown()}{why}",
                             hint=f"{dirty.reveal()}commit them, or put them aside with "
                                  f"{code('git', '-C', target, 'stash', 'push', '-u')}"
                                  ", then run the command again")
    if killed is None:
        return
    head = g.head()
    if head and head != killed["start"]:
        ref = userwork.save_tip(target, head)
        print(f"[carry] {name}: a run of this tool was killed in {target}; its HEAD {head[:12]} (with any commit "
              f"made since) is kept as {ref} before going back to {str(killed['start'])[:12]}: "
              f"{code('git', '-C', target, 'log', '--oneline', ref)} shows it", file=sys.stderr, flush=True)
    g("reset", "-q", "--hard", killed["start"])
    journal.unlink()




def _read_record(path: Path, target: Path) -> dict:
    try:
        doc = json.loads(read_input_text(path))
        if not isinstance(doc, dict) or "start" not in doc:
            raise ValueError("no 'start'")
        return doc
    except ValueError as exc:
        raise DirtyTreeError(f"{path} is unreadable ({exc})",
                             hint=f"{code('rm', path)} (and check {code('git', '-C', target, 'log')} for where the series "
                                  "started)") from None


def _rollback_into(done: list[tuple[Path, str]]) -> None:
    for target, head in reversed(done):
        g = Git(target)
        g("am", "--abort", check=False)
        if head:
            g("reset", "-q", "--hard", head)
        _journal(g).unlink(missing_ok=True)
    done.clear()


def _finish_into(done: list[tuple[Path, str]]) -> None:
    for target, _ in done:
        _journal(Git(target)).unlink(missing_ok=True)
    done.clear()


def _journal(g: Git) -> Path:
    return g.git_dir() / "carry-into-journal.json"
