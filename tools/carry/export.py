"""Export: workspace commits -> normalised patch files.

Normalised means re-exporting an unchanged workspace changes no byte: no
commit ids, no signature, no diffstat, full blob ids (so ``git am --3way``
can find the pre-image), and a fixed identity and date in the header.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .errors import DirtyTreeError, DriftError, UsageError
from .manifest import Series
from .seriesedit import write_atomic
from .runner import IDENTITY_EMAIL, IDENTITY_NAME, Git
from .workspace import WorkDir

_FIXED_FROM = f"From: {IDENTITY_NAME} <{IDENTITY_EMAIL}>"
_FIXED_DATE_HDR = "Date: Sat, 1 Jan 2000 00:00:00 +0000"


def format_patch(repo: Path, commit: str) -> str:
    text = Git(repo)("format-patch", "-1", "--stdout", "--zero-commit", "--no-signature", "--no-stat",
                     "--full-index", "--no-numbered", "--subject-prefix=PATCH", "--encode-email-headers",
                     "-U3", commit).stdout
    head, sep, body = text.partition("\n\n")
    head = re.sub(r"(?m)^From: .*(\n[ \t].*)*$", _FIXED_FROM, head, count=1)
    head = re.sub(r"(?m)^Date: .*$", _FIXED_DATE_HDR, head, count=1)
    return head + sep + body


@dataclass
class ExportResult:
    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    drift: list[str] = field(default_factory=list)


def export(series: Series, workdir: Path, check: bool, lock_timeout: float = 600.0) -> ExportResult:
    wd = WorkDir(workdir)
    if not wd.state_file.exists():
        raise UsageError(f"{workdir} holds no workspace made by tools/apply.py",
                         hint=f"run tools/apply.py --series {series.name} --workdir {workdir} first")
    result = ExportResult()
    with wd.lock(lock_timeout):
        wd.recover()
        state = wd.load_state()
        pending: list[tuple[Path, str]] = []
        for name, rec in state.get("upstreams", {}).items():
            ws = wd.workspace(name)
            g = Git(ws)
            dirty = g.status_porcelain()
            if dirty:
                raise DirtyTreeError(f"{name}: {ws} has uncommitted changes ({dirty[0][3:]} ...)",
                                     hint=f"commit them into the patch they belong to (git -C {ws} commit --amend) first")
            commits = g.rev_list(f"{rec['base_commit']}..HEAD")
            ids = [p["id"] for p in rec["patches"]]
            if len(commits) != len(ids):
                raise UsageError(
                    f"{name}: the workspace has {len(commits)} commit(s) on its base but the series applied "
                    f"{len(ids)} patch(es) there",
                    hint="add a [[patches]] entry to series.toml for a new commit (and apply), or squash fixups "
                         "into the commit of the patch they belong to")
            for commit, pid in zip(commits, ids):
                meta = series.patch(pid)
                path = series.patch_path(meta)
                text = format_patch(ws, commit)
                old = path.read_text() if path.exists() else None
                if old == text:
                    result.unchanged.append(meta.file)
                else:
                    (result.drift if check else result.written).append(meta.file)
                    pending.append((path, text))
        if check:
            if result.drift:
                raise DriftError("patch files differ from the workspace: " + ", ".join(result.drift), files=result.drift,
                                 hint=f"run tools/export.py --series {series.name} --workdir {workdir} and commit")
            return result
        for path, text in pending:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, text)
        if pending:
            # The workspace now matches the files: record that, so apply sees it as up to date.
            from .manifest import load
            fresh = load(series.root)
            for name, rec in state.get("upstreams", {}).items():
                chosen = [fresh.patch(pid) for pid in rec.get("selected", [p["id"] for p in rec["patches"]])]
                rec["digest"] = fresh.upstream_digest(name, chosen, rec["base_key"])
                rec["head"] = Git(wd.workspace(name)).head()
            wd.save_state(state)
    return result
