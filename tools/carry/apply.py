"""Applying a series: pinned bases + patches -> patched workspaces, atomically.

All-or-nothing across upstreams: every selected upstream is rebuilt in
staging first; only when all of them applied cleanly are they swapped in.
An upstream whose workspace already matches (same base, same patch bytes,
untouched) is reported ``already-applied`` and not rebuilt.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from . import progress, sources, wheels
from .errors import DirtyTreeError, PatchFormatError, UsageError
from .manifest import PatchMeta, Series
from .patchfile import parse_file, safety_problems
from .report import ApplyReport, PatchResult, UpstreamResult, write_json
from .runner import Git, run
from .workspace import STATE_VERSION, WorkDir


@dataclass
class Options:
    workdir: Path
    cache: Path
    only: list[str] | None = None
    sources: dict[str, Path] = field(default_factory=dict)
    into: dict[str, Path] = field(default_factory=dict)
    check: bool = False
    wheels_dir: Path | None = None
    lock_timeout: float = 600.0


def am_patches(repo: Path, series: Series, patches: list[PatchMeta],
               older_bases: list[Path] | None = None) -> list[PatchResult]:
    """git am each patch (3-way fallback). Stops at the first failure, leaving no am in progress.

    A 3-way merge needs the blobs a patch was written against. When the base
    moved, those live in older cached bases of the same upstream: they are
    fetched into the workspace the first time a patch asks for them.
    """
    g = Git(repo)
    fast = _am_all_at_once(g, series, patches)
    if fast is not None:
        return fast
    results: list[PatchResult] = []
    failed = False
    pending_bases = list(older_bases or [])
    for p in patches:
        path = series.patch_path(p)
        if failed:
            results.append(PatchResult(p.id, p.file, "not-attempted", "an earlier patch failed"))
            continue
        before = g.head()
        res = g("am", "--3way", "--keep-cr", str(path), check=False)
        out = res.stdout + res.stderr
        if not res.ok and pending_bases and ("fake ancestor" in out or "lacking or useless" in out):
            g("am", "--abort", check=False)
            for old in pending_bases:
                g("fetch", "-q", "--no-tags", str(old), "+refs/heads/main:refs/carry/older", check=False)
            g("update-ref", "-d", "refs/carry/older", check=False)
            pending_bases = []
            res = g("am", "--3way", "--keep-cr", str(path), check=False)
            out = res.stdout + res.stderr
        if res.ok and g.head() != before:
            detail = "applied with a 3-way merge" if "3-way merge" in out else "applied"
            results.append(PatchResult(p.id, p.file, "applied", detail))
        elif "already applied" in out or "No changes" in out or res.ok:
            if not res.ok:
                g("am", "--skip", check=False)
            results.append(PatchResult(p.id, p.file, "already-applied",
                                       "the base already has this change; see tools/retire.py"))
        else:
            conflicted = g("diff", "--name-only", "--diff-filter=U", check=False).stdout.split()
            g("am", "--abort", check=False)
            detail = _conflict_detail(g, path, out, conflicted)
            results.append(PatchResult(p.id, p.file, "failed", detail))
            failed = True
    return results


def _am_all_at_once(g: Git, series: Series, patches: list[PatchMeta]) -> list[PatchResult] | None:
    """The common case in one git process; None (and the repo as it was) if anything is unusual."""
    if not patches:
        return []
    before = g.head()
    res = g("am", "--3way", "--keep-cr", *(str(series.patch_path(p)) for p in patches), check=False)
    chunks = re.split(r"(?m)^Applying: ", res.stdout + res.stderr)[1:]
    if res.ok and len(chunks) == len(patches):
        results = []
        for p, chunk in zip(patches, chunks):
            if "No changes" in chunk or "already applied" in chunk:
                results.append(PatchResult(p.id, p.file, "already-applied",
                                           "the base already has this change; see tools/retire.py"))
            else:
                detail = "applied with a 3-way merge" if "3-way merge" in chunk else "applied"
                results.append(PatchResult(p.id, p.file, "applied", detail))
        made = g.rev_list(f"{before}..HEAD")
        if len(made) == sum(r.status == "applied" for r in results):
            return results
    g("am", "--abort", check=False)
    g("reset", "-q", "--hard", before or "HEAD")
    return None


_FAILED_AT = re.compile(r"patch failed: (?P<file>.+?):(?P<line>\d+)")


def _conflict_detail(g: Git, patch_path: Path, am_output: str, conflicted: list[str]) -> str:
    """Which files and hunks failed: a plain `git apply --check` names them precisely."""
    probe = g("apply", "--check", str(patch_path), check=False)
    spots = [(m["file"], int(m["line"])) for m in _FAILED_AT.finditer(am_output + probe.stderr)]
    if not conflicted:
        missing = re.findall(r"error: (.+?): does not exist in index", am_output)
        conflicted = missing or sorted({f for f, _ in spots})
    hunks = []
    try:
        parsed = parse_file(patch_path)
        for f, line in spots:
            for fd in parsed.files:
                if fd.path == f:
                    hunks += [h.header for h in fd.hunks if h.old_start == line]
    except Exception:  # noqa: BLE001 - the detail is best effort; lint reports bad patches
        pass
    text = "conflict in " + (", ".join(conflicted) if conflicted else "an unknown file")
    if hunks:
        text += f" at hunk {hunks[0]}"
    elif spots:
        text += f" near line {spots[0][1]}"
    return text


def _targets(series: Series, selected: list[PatchMeta], opts: Options) -> list[str]:
    if not opts.only:
        return [u.name for u in series.upstreams]
    names = {p.upstream for p in selected}
    names.update(x for x in opts.only if x in [u.name for u in series.upstreams])
    return [u.name for u in series.upstreams if u.name in names]


def apply(series: Series, opts: Options) -> ApplyReport:
    selected = series.select(opts.only)
    for name in list(opts.sources) + list(opts.into):
        series.upstream(name)  # unknown names are usage errors
    for p in selected:
        if not series.patch_path(p).exists():
            raise UsageError(f"{p.upstream}: patch {p.id} names {p.file}, which does not exist",
                             hint=f"run tools/lint.py --series {series.name}")
        unsafe = safety_problems(parse_file(series.patch_path(p)))  # malformed -> PatchFormatError
        if unsafe:
            raise PatchFormatError(f"{p.upstream}: patch {p.id} ({p.file}) is unsafe: {'; '.join(unsafe)}",
                                   hint="a patch may only edit regular files inside its upstream's tree")
    targets = _targets(series, selected, opts)
    report = ApplyReport(series=series.name, check=opts.check, digest=series.digest(selected)[:12])
    wd = WorkDir(opts.workdir)
    with wd.lock(opts.lock_timeout):
        wd.recover()
        state = wd.load_state()
        recorded_all = state.get("upstreams", {})
        staging = None
        rebuilt: list[str] = []
        new_records: dict[str, dict] = {}
        into_done: list[tuple[Path, str]] = []
        try:
            for name in targets:
                up = series.upstream(name)
                mine = [p for p in selected if p.upstream == name]
                everyone = series.patches_for(name)
                if name in opts.into:
                    # The checkout is the base: nothing to fetch.
                    digest = series.upstream_digest(name, mine, "into")
                    ur = _apply_into(series, name, opts.into[name], mine, digest, opts.check, into_done)
                else:
                    base = sources.resolve(up, opts.cache, opts.sources.get(name))
                    digest = series.upstream_digest(name, mine, base.key)
                    ur = UpstreamResult(name=name, base=base.describe, workspace=str(wd.workspace(name)),
                                        base_commit=base.commit)
                    recorded = recorded_all.get(name)
                    ours = wd.check_untouched(name, recorded)
                    if ours and recorded and recorded.get("digest") == digest:
                        ur.head = recorded["head"]
                        ur.patches = [PatchResult(p.id, p.file, "already-applied", "workspace is up to date")
                                      for p in mine]
                    else:
                        if staging is None:
                            staging = wd.new_staging()
                        progress.say(f"{name}: applying {len(mine)} patch(es) on {base.describe}")
                        ws = staging / name
                        run(["git", "clone", "-q", "--local", "--branch", "main", str(base.repo), str(ws)])
                        Git(ws)("remote", "remove", "origin")
                        older = [b for b in base.repo.parent.glob("*.git") if b != base.repo]
                        ur.patches = am_patches(ws, series, mine, older)
                        ur.head = Git(ws).head()
                        rebuilt.append(name)
                        new_records[name] = _record(series, base, digest, ws, mine, ur)
                selected_ids = {p.id for p in mine}
                ur.patches += [PatchResult(p.id, p.file, "not-attempted", "not selected (--only)")
                               for p in everyone if p.id not in selected_ids]
                order = {p.id: i for i, p in enumerate(everyone)}
                ur.patches.sort(key=lambda r: order.get(r.id, 0))
                report.upstreams.append(ur)
            failed = [u for u in report.upstreams if u.failed]
            if failed or opts.check:
                report.ok = not failed
                _rollback_into(into_done)
                if failed:
                    report.error = _conflict_message(series, failed, opts)
                return report
            if rebuilt:
                new_state = {"version": STATE_VERSION, "series": series.name,
                             "upstreams": {**recorded_all, **new_records}}
                assert staging is not None
                wd.commit(staging, rebuilt, new_state)
                staging = None
            for name in rebuilt:
                for u in report.upstreams:
                    if u.name == name:
                        u.workspace = str(wd.workspace(name))
            _finish_into(into_done)
        except BaseException:
            _rollback_into(into_done)
            raise
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
        if opts.wheels_dir is not None:
            for u in report.upstreams:
                up = series.upstream(u.name)
                if up.pypi is None or u.name in opts.into:
                    continue
                u.wheels = [str(w) for w in wheels.build(
                    series, up, Path(u.workspace), u.base_commit or "", u.head or "", opts.cache,
                    opts.wheels_dir, f"{series.name}.{report.digest}")]
    return report


def _record(series, base, digest, ws: Path, mine: list[PatchMeta], ur: UpstreamResult) -> dict:
    commits = Git(ws).rev_list(f"{base.commit}..HEAD") if ur.head != base.commit else []
    applied = [r for r in ur.patches if r.status == "applied"]
    return {"base": base.describe, "base_key": base.key, "base_commit": base.commit, "digest": digest,
            "head": ur.head, "selected": [p.id for p in mine],
            "patches": [{"id": r.id, "file": r.file, "commit": c} for r, c in zip(applied, commits)]}


def _conflict_message(series: Series, failed: list[UpstreamResult], opts: Options) -> str:
    lines = []
    for u in failed:
        for p in u.patches:
            if p.status == "failed":
                lines.append(f"{u.name}: patch {p.id} ({p.file}) does not apply: {p.detail}")
    lines.append("nothing was changed. Next: refresh the patch against the new base "
                 f"(tools/rebase.py --series {series.name} --onto NAME=VERSION) or edit it in a workspace "
                 f"and run tools/export.py")
    return "\n".join(lines)


# -- --into: applying onto an existing checkout --------------------------------------
def _apply_into(series: Series, name: str, target: Path, mine: list[PatchMeta], digest: str,
                check: bool, done: list[tuple[Path, str]]) -> UpstreamResult:
    target = target.expanduser().resolve()
    g = Git(target)
    if not target.exists() or not g("rev-parse", "--git-dir", check=False).ok:
        raise UsageError(f"--into {name}={target}: not a git checkout")
    ur = UpstreamResult(name=name, base=f"the checkout {target}", workspace=str(target))
    git_dir = Path(g("rev-parse", "--absolute-git-dir").stdout.strip())
    if (git_dir / "rebase-apply").exists():
        g("am", "--abort", check=False)
    journal = git_dir / "carry-into-journal.json"
    if journal.exists():  # a killed run: go back to where it started
        start = json.loads(journal.read_text())["start"]
        g("reset", "-q", "--hard", start)
        journal.unlink()
    dirty = g.status_porcelain()
    if dirty:
        shown = ", ".join(line[3:] for line in dirty[:5]) + (" ..." if len(dirty) > 5 else "")
        raise DirtyTreeError(f"{name}: --into target {target} has uncommitted changes: {shown}",
                             hint=f"commit or stash them first (git -C {target} stash -u)")
    state_path = git_dir / "carry-state.json"
    head = g.head()
    recorded = json.loads(state_path.read_text()) if state_path.exists() else None
    if recorded and recorded.get("head") == head and recorded.get("digest") == digest:
        ur.head, ur.base_commit = head, recorded.get("start")
        ur.patches = [PatchResult(p.id, p.file, "already-applied", "checkout is up to date") for p in mine]
        return ur
    start = recorded["start"] if recorded and recorded.get("head") == head else head
    if start != head:
        g("reset", "-q", "--hard", start)  # re-apply a changed series from where we started
    write_json(journal, {"start": head})
    done.append((target, head or ""))
    ur.base_commit = start
    ur.patches = am_patches(target, series, mine)
    ur.head = g.head()
    if not ur.failed and not check:
        write_json(state_path, {"series": series.name, "digest": digest, "start": start, "head": ur.head})
    return ur


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
    return Path(g("rev-parse", "--absolute-git-dir").stdout.strip()) / "carry-into-journal.json"
