"""Plumbing: a workspace cloned from a pristine base, and patches applied to it with ``git am``.

apply (the transaction), retire (evidence), rebase (moving a series) and the
trial applies all build on these; none of them needs the others' porcelain.
"""

from __future__ import annotations

import re
from pathlib import Path

from .. import progress
from ..errors import PatchFormatError
from ..git import Git
from ..report import PatchResult
from ..series.manifest import PatchMeta, Series
from ..series.patchfile import parse_file
from .sources import Base

ALREADY = "the base already has this change; see tools/retire.py"
ABSENT = "which the tree it applies to does not have"  # in the detail of a patch refused so


# What git am --3way says when the pre-image blobs are not in the repository, by git version
# ("lacks necessary blobs" since git 2.3x): then the older bases are fetched and it is tried again.
_NO_BLOBS = ("fake ancestor", "lacking or useless", "lacks necessary blobs")

BASE_TAG = "carry-base"  # in every workspace: what `git rebase -i --autosquash` and `git log BASE..` need


def clone_base(base: Base, dest: Path) -> Git:
    """A workspace at ``dest`` whose HEAD is the base commit (tagged carry-base), with no remote
    pointing back at the cache."""
    g = Git.clone(base.repo, dest, branch="main")
    g("remote", "remove", "origin")
    g("tag", BASE_TAG, base.commit)
    return g


def older_bases(base: Base) -> list[Path]:
    """The other cached bases of the same upstream: where a 3-way merge finds a patch's pre-images."""
    return [b for b in sorted(base.repo.parent.glob("*.git")) if b != base.repo]


def am_patches(repo: Path, series: Series, patches: list[PatchMeta],
               older: list[Path] | None = None, made: list[str] | None = None) -> list[PatchResult]:
    """git am each patch (3-way fallback). Stops at the first failure, leaving no am in progress.

    A progress line per patch says how each went (carry.progress). ``made``, when given, is
    filled with the commits the patches made, oldest first, where the one-process path knows them
    (its caller reads them itself otherwise); it stays empty then.
    """
    results = _am_patches(repo, series, patches, older, made)
    ups = {p.id: p.upstream for p in patches}
    for r in results:
        progress.say(f"{ups[r.id]}: {r.id}: {r.status}" + (f" ({r.detail})" if r.detail != r.status else ""))
    return results


def _am_patches(repo: Path, series: Series, patches: list[PatchMeta],
                older: list[Path] | None = None, made: list[str] | None = None) -> list[PatchResult]:
    """am_patches without its progress lines.

    A 3-way merge needs the blobs a patch was written against. When the base
    moved, those live in older cached bases of the same upstream: they are
    fetched into the workspace the first time a patch asks for them.
    """
    g = Git(repo)
    start, absent = _absent_target(g, series, patches)
    if absent is not None:
        k, missing = absent
        p = patches[k]
        results = _am_patches(repo, series, patches[:k], older) if k else []
        if any(r.status == "failed" for r in results):
            return results + [PatchResult(q.id, q.file, "not-attempted", "an earlier patch failed")
                              for q in patches[k:]]
        detail = (f"it changes {', '.join(missing)}, {ABSENT} "
                  "(git's 3-way merge would put the change into another file)")
        return results + [PatchResult(p.id, p.file, "failed", detail)] + [
            PatchResult(q.id, q.file, "not-attempted", "an earlier patch failed") for q in patches[k + 1:]]
    fast = _am_all_at_once(g, series, patches, start, made)
    if fast is not None:
        return fast
    results: list[PatchResult] = []
    failed = False
    pending_bases = list(older or [])
    for p in patches:
        path = series.patch_path(p)
        if failed:
            results.append(PatchResult(p.id, p.file, "not-attempted", "an earlier patch failed"))
            continue
        before = g.head()
        res = g("am", "--3way", "--keep-cr", str(path), check=False)
        out = res.stdout + res.stderr
        if not res.ok and pending_bases and any(m in out for m in _NO_BLOBS):
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
            results.append(PatchResult(p.id, p.file, "already-applied", ALREADY))
        else:
            conflicted = [n for n in g("diff", "--name-only", "-z", "--diff-filter=U", check=False).stdout.split("\0") if n]
            g("am", "--abort", check=False)
            results.append(PatchResult(p.id, p.file, "failed", _conflict_detail(g, path, out, conflicted)))
            failed = True
    return results


def _absent_target(g: Git, series: Series, patches: list[PatchMeta]
                   ) -> tuple[str | None, tuple[int, list[str]] | None]:
    """(HEAD, the first patch (its index) that changes files absent from the tree it would apply to).

    git am --3way finds a patch's pre-image blob anywhere in the repository and its rename
    detection then moves the change onto whichever file has that content: a patch for a file
    the upstream lacks would land in another one. Files a patch creates are fine; the tree
    is followed through the patches in order (an earlier patch may add what a later one edits).
    One ``cat-file --batch-check`` asks for HEAD and for each path the patches start from.
    """
    if not patches:
        return None, None
    files = [parse_file(series.patch_path(p)).files for p in patches]
    # a name holding a newline cannot be asked in this protocol: it counts as absent
    asked = sorted(q for q in {f.rename_from or f.old_path for fs in files for f in fs if not f.new_file}
                   if q and "\n" not in q)
    query = "".join(f"{q}\n" for q in ["HEAD", *(f"HEAD:{q}" for q in asked)])
    lines = g("cat-file", "--batch-check", input=query, check=False).stdout.splitlines()
    first = lines[0].split() if lines else []
    head = first[0] if first[1:2] == ["commit"] else None
    present = {q for q, line in zip(asked, lines[1:]) if not line.endswith(" missing")}
    for k, fs in enumerate(files):
        missing = []
        for f in fs:
            if f.new_file:
                present.add(f.path)
                continue
            src = f.rename_from or f.old_path
            if src not in present:
                missing.append(src)
            if f.deleted:
                present.discard(src)
            elif f.rename_to:
                present.add(f.rename_to)
        if missing:
            return head, (k, missing)
    return head, None


def am_each(repo: Path, series: Series, patches: list[PatchMeta], older: list[Path]) -> list[PatchResult]:
    """Apply each patch on its own merits: a failure does not stop the rest (retire's evidence)."""
    results = []
    for p in patches:
        results += am_patches(repo, series, [p], older)
    return results


def _am_all_at_once(g: Git, series: Series, patches: list[PatchMeta], before: str | None,
                    made: list[str] | None) -> list[PatchResult] | None:
    """The common case in one git process; None (and the repo as it was) if anything is unusual."""
    if not patches:
        return []
    res = g("am", "--3way", "--keep-cr", *(str(series.patch_path(p)) for p in patches), check=False)
    chunks = re.split(r"(?m)^Applying: ", res.stdout + res.stderr)[1:]
    if res.ok and len(chunks) == len(patches):
        results = []
        for p, chunk in zip(patches, chunks):
            if "No changes" in chunk or "already applied" in chunk:
                results.append(PatchResult(p.id, p.file, "already-applied", ALREADY))
            else:
                detail = "applied with a 3-way merge" if "3-way merge" in chunk else "applied"
                results.append(PatchResult(p.id, p.file, "applied", detail))
        commits = g.rev_list(f"{before}..HEAD") if before else []
        if before and len(commits) == sum(r.status == "applied" for r in results):
            if made is not None:
                made[:] = commits
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
    except PatchFormatError:
        parsed = None  # apply checked the patch before; a file edited since then gets no hunk detail
    for f, line in spots if parsed else []:
        for fd in parsed.files:
            if fd.path == f:
                hunks += [h.header for h in fd.hunks if h.old_start == line]
    text = "conflict in " + (", ".join(conflicted) if conflicted else "an unknown file")
    if hunks:
        text += f" at hunk {hunks[0]}"
    elif spots:
        text += f" near line {spots[0][1]}"
    return text
