"""The workspace record: what ``DIR/.carry/state.json`` holds (carry.workspace.workdir reads and writes it).

Per upstream its base, the series digest it was built from, the commit of each applied patch
(as last applied or exported) and the commits apply made, and the applied patch ids in series
order. apply writes it; export, prove, bisect and retire read
it through these classes only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..series.manifest import PatchMeta, Series

STATE_VERSION = 2


@dataclass(frozen=True)
class PatchRecord:
    id: str
    file: str
    commit: str
    # The sha256 of each content of the patch file this workspace was applied from or exported to,
    # oldest first: export replaces a file holding one of these (nothing in it is not the
    # workspace's), never one edited since (a record from before these were kept has none).
    hashes: tuple[str, ...] = ()


@dataclass
class UpstreamRecord:
    base: str                 # for people: where the base came from
    base_key: str             # identity of the base (part of the digest)
    base_commit: str
    digest: str               # of the base and the selected patch files
    head: str
    selected: list[str]       # patch ids chosen for this upstream (applied or already upstream)
    patches: list[PatchRecord] = field(default_factory=list)  # one commit each, in order
    # The commits apply itself made (export later records a patch's amended commit in ``patches``;
    # those stay the user's, kept by a rebuild unless the rebuilt tree holds the same change).
    made: list[str] = field(default_factory=list)
    # Where apply was told this upstream's inputs are (``--cache DIR``, ``--source NAME=PATH``, absolute),
    # for the hint of a command that takes neither (export) and prints an apply; None: a record from
    # before these were kept, which does not tell.
    inputs: list[str] | None = None

    def commit_of(self, patch_id: str) -> str | None:
        return next((p.commit for p in self.patches if p.id == patch_id), None)


@dataclass
class State:
    series: str | None = None
    upstreams: dict[str, UpstreamRecord] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # applied patch ids in series order, all upstreams

    def records(self) -> list[tuple[str, UpstreamRecord]]:
        return list(self.upstreams.items())

    def record(self, upstream: str) -> UpstreamRecord | None:
        return self.upstreams.get(upstream)

    def commit_of(self, patch: PatchMeta) -> str | None:
        rec = self.upstreams.get(patch.upstream)
        return rec.commit_of(patch.id) if rec else None

    def prefix_commit(self, upstream: str, k: int) -> str:
        """The upstream's commit once the first k applied patches of the series are in."""
        rec = self.upstreams[upstream]
        mine = [pid for pid in self.order[:k] if rec.commit_of(pid)]
        return rec.commit_of(mine[-1]) if mine else rec.base_commit  # type: ignore[return-value]

    def with_upstreams(self, series: Series, new: dict[str, UpstreamRecord]) -> "State":
        """This record with some upstreams rebuilt (the others kept), ordered by the series."""
        ups = {**self.upstreams, **new}
        applied = {p.id for rec in ups.values() for p in rec.patches}
        return State(series.name, ups, [p.id for p in series.patches if p.id in applied])

    def add_new_patches(self, series: Series, upstream: str, new: list[PatchRecord]) -> None:
        """Commits made in the workspace for series entries not applied yet: recorded as applied."""
        rec = self.upstreams[upstream]
        rec.patches.extend(new)
        rec.selected.extend(p.id for p in new)
        applied = {p.id for r in self.upstreams.values() for p in r.patches}
        self.order = [p.id for p in series.patches if p.id in applied]

    def mark_exported(self, upstream: str, digest: str, head: str, commits: list[str],
                      hashes: dict[str, str]) -> None:
        """Export wrote the workspace's commits to the patch files: the two agree again, and each
        patch is the commit it was written from (an amend or a rebase in the workspace made new
        ones; prove and bisect take a patch's tree from here), its file's hash (``hashes``, by id)
        one more the workspace made."""
        rec = self.upstreams[upstream]
        rec.digest, rec.head = digest, head
        assert len(commits) == len(rec.patches), (upstream, len(commits), len(rec.patches))
        rec.patches = [PatchRecord(p.id, p.file, commit, tuple(dict.fromkeys([*p.hashes, hashes[p.id]]))
                                   if p.id in hashes else p.hashes) for p, commit in zip(rec.patches, commits)]

    # -- the file format ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "series": self.series, "order": self.order,
                "upstreams": {name: asdict(rec) for name, rec in self.upstreams.items()}}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "State":
        ups = {}
        for name, raw in doc.get("upstreams", {}).items():
            patches = [PatchRecord(p["id"], p["file"], p["commit"], tuple(p.get("hashes", ())))
                       for p in raw.get("patches", [])]
            ups[name] = UpstreamRecord(
                base=raw["base"], base_key=raw["base_key"], base_commit=raw["base_commit"], digest=raw["digest"],
                head=raw["head"], selected=list(raw.get("selected", [p.id for p in patches])), patches=patches,
                made=list(raw.get("made", [p.commit for p in patches])),
                inputs=None if raw.get("inputs") is None else [str(a) for a in raw["inputs"]])
        order = doc.get("order")
        if order is None:  # version 1 kept no order: the upstreams' own, in the order they were recorded
            order = [p.id for rec in ups.values() for p in rec.patches]
        return cls(doc.get("series"), ups, list(order))
