"""Bisecting a series: the first patch at which a check's result changes.

The series is read in its manifest order, patches 1..N. Prefix k is every
upstream at the commit of its last patch among the first k (its pristine base
when it has none): because a workspace has one commit per patch, that commit
*is* "its patches 1..k applied", so a prefix costs a ``git archive``, not a
re-apply. The check is rerun on prefix trees until the smallest k whose result
equals the failing result is found, assuming the result changes once along
the series (binary search: about log2(N) + 1 reruns). When the pristine base
already gives the failing result, no patch changed it, and the report says so.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from ..errors import UsageError
from ..series.manifest import PatchMeta, Series
from ..series.repo import command
from ..workspace.workdir import WorkDir
from .prove import extract


@dataclass
class Probe:
    k: int
    last_patch: str | None  # the k-th patch (None: pristine)
    signature: str
    status: str
    reason: str


@dataclass
class BisectResult:
    target: str                          # the failing signature being looked for
    first_patch: str | None = None       # the first patch at which the result becomes the target
    first_index: int | None = None       # its 1-based position in the series
    changed: bool = False                # False: the pristine base already gives the target
    note: str = ""
    probes: list[Probe] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


class PrefixTrees:
    """Trees of the first k patches, extracted on demand and kept for the run."""

    def __init__(self, series: Series, workdir: Path, scratch: Path):
        self.series = series
        self.wd = WorkDir(workdir)
        self.scratch = scratch
        self.state = self.wd.load_state()
        if not self.state.upstreams:
            raise UsageError(f"no applied workspaces in {workdir}",
                             hint=f"`{command('apply', series, '--workdir', self.wd.root)}` first")
        by_id = {p.id: p for p in series.patches}
        self.order: list[PatchMeta] = [by_id[pid] for pid in self.state.order if pid in by_id]
        self.only: list[str] | None = None
        # called on each tree once extracted: what runs from the trees may need more than the git
        # layout holds (upstream_tests: what the pinned wheel installs, carry.workspace.installed)
        self.finish: Callable[[str, Path], None] | None = None

    def trees(self, k: int) -> dict[str, Path]:
        """Each workspace's tree at prefix k (with ``only`` set, those upstreams' alone)."""
        return {upstream: self._tree(upstream, self.state.prefix_commit(upstream, k))
                for upstream, _ in self.state.records() if self.only is None or upstream in self.only}

    def pristine(self, upstream: str) -> Path:
        return self._tree(upstream, self.state.prefix_commit(upstream, 0))

    def _tree(self, upstream: str, commit: str) -> Path:
        dest = self.scratch / f"{upstream}-{commit[:12]}"
        if not dest.exists():
            extract(self.wd.workspace(upstream), commit, dest)
            if self.finish is not None:
                try:
                    self.finish(upstream, dest)
                except BaseException:
                    shutil.rmtree(dest, ignore_errors=True)   # never a tree left half-finished for the next call
                    raise
        return dest


def bisect(order: list[PatchMeta], target: str,
           probe: Callable[[int], tuple[str, str, str]], series_ids: Iterable[str] = ()) -> BisectResult:
    """Find the smallest k in 1..N whose probe signature equals ``target``.

    ``probe(k)`` runs the check on prefix k and returns (signature, status, reason).
    Prefix N is the run being bisected: its result is ``target`` and is not rerun. When ``target``
    is a BUG_HIT of a patch of the series (``series_ids``) that these trees do not hold (a run with
    ``--only``, a patch dropped), the note names that patch: it is the one the run lacks.
    """
    res = BisectResult(target=target)
    n = len(order)

    def run(k: int) -> str:
        sig, status, reason = probe(k)
        res.probes.append(Probe(k, order[k - 1].id if k else None, sig, status, reason))
        return sig

    if n == 0:
        res.note = "the series has no patches: nothing to bisect"
        return res
    if run(0) == target:
        res.note = "the pristine base gives the same result: no patch changes it"
        return res
    lo, hi = 0, n  # probe(lo) != target, probe(hi) == target
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if run(mid) == target:
            hi = mid
        else:
            lo = mid
    res.changed = True
    res.first_index = hi
    res.first_patch = order[hi - 1].id
    before = next((p.signature for p in res.probes if p.k == lo), "?")
    res.note = (f"the result changes at patch {hi} of {n}, {order[hi - 1].id} "
                f"({order[hi - 1].upstream}): {before} -> {target}") + _lacking(order, target, series_ids)
    return res


def _lacking(order: list[PatchMeta], target: str, series_ids: Iterable[str]) -> str:
    bug = target.split(":", 2)[2] if target.startswith("failed:bug:") else None
    if bug and bug in set(series_ids) and bug not in {p.id for p in order}:
        return f"; the run meets the bug of {bug}, a patch of the series these trees lack"
    return ""
