"""Reports: one JSON document per command (--json FILE) and a short table."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .shell import code


@dataclass
class PatchResult:
    id: str
    file: str
    status: str
    detail: str = ""


@dataclass
class UpstreamResult:
    name: str
    base: str
    workspace: str
    head: str | None = None        # the workspace's HEAD after the run (unchanged when the run failed)
    base_commit: str | None = None
    patches: list[PatchResult] = field(default_factory=list)
    wheels: list[str] = field(default_factory=list)
    wheels_skipped: list[dict[str, str]] = field(default_factory=list)  # {"file", "reason"}
    saved: list[dict[str, str]] = field(default_factory=list)  # {"ref", "from", "commits"}: set aside by a rebuild

    @property
    def failed(self) -> bool:
        return any(p.status == "failed" for p in self.patches)


@dataclass
class ApplyReport:
    series: str
    ok: bool = True
    check: bool = False
    digest: str = ""
    upstreams: list[UpstreamResult] = field(default_factory=list)
    error: str | None = None
    next: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def table(rows: list[list[str]], headers: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)] if rows else [len(h) for h in headers]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*headers), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*(str(x) for x in r)) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def render_apply(rep: ApplyReport) -> str:
    rows = []
    for u in rep.upstreams:
        for p in u.patches:
            rows.append([u.name, p.id, p.status, p.detail])
        if not u.patches:
            rows.append([u.name, "-", "pristine", "no patch selected"])
    head = f"series {rep.series}{' (check only, nothing written)' if rep.check else ''}"
    out = [head, table(rows, ["upstream", "patch", "status", "detail"])]
    unchanged = " (unchanged)" if not rep.ok or rep.check else ""
    for u in rep.upstreams:
        if u.head:
            out.append(f"{u.name}: {u.workspace} at {u.head[:12]}{unchanged} (base {u.base})")
        elif unchanged:
            out.append(f"{u.name}: {u.workspace} not created (base {u.base})")
        for kept in u.saved:
            out.append(f"{u.name}: kept {kept['commits']} commit(s) the series does not know (the old {kept['from']}) "
                       f"as {kept['ref']}: {kept_back(u.workspace, kept)}")
        for w in u.wheels:
            out.append(f"{u.name}: wheel {w}")
        for skip in u.wheels_skipped:
            out.append(f"{u.name}: no wheel {skip['file']}: {skip['reason']}")
    return "\n".join(out)


def kept_back(ws: object, kept: dict[str, str]) -> str:
    """What shows the commits kept as ``kept["ref"]`` in workspace ``ws`` and what takes them back, by
    the ref they were (``kept["from"]``). Only a branch's history (HEAD, a branch) is reset to: reset
    to a notes or stash commit, the branch would hold that commit's tree (notes, or a stash's
    merge). A stash goes back on the stash list, notes merge back, any other ref is made again
    where it was (``update-ref`` with an empty old value: never over a ref there now)."""
    ref, was = kept["ref"], kept["from"]
    if was == "HEAD" or was.startswith("refs/heads/"):
        return (f"{code('git', '-C', ws, 'log', '--oneline', f'carry-base..{ref}')} shows that history; "
                f"{code('git', '-C', ws, 'reset', '-q', '--hard', ref)} takes them back (then export), "
                "or cherry-pick the ones you want")
    if was == "refs/stash":
        return (f"{code('git', '-C', ws, 'stash', 'show', '-p', '--include-untracked', ref)} shows it (new files too); "
                f"{code('git', '-C', ws, 'stash', 'store', '-m', 'kept by carry', ref)} puts it back on the stash list")
    if was.startswith("refs/notes/"):
        return (f"{code('git', '-C', ws, 'log', '-p', ref)} shows them; "
                f"{code('git', '-C', ws, 'notes', f'--ref={was}', 'merge', ref)} takes them back")
    return (f"{code('git', '-C', ws, 'log', '--oneline', ref)} shows them; "
            f"{code('git', '-C', ws, 'update-ref', was, ref, '')} puts {was} back")
