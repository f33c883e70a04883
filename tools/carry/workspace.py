"""Work directories: one git workspace per upstream, a state file, a journal.

``DIR/<upstream>`` is the patched tree in the upstream's git layout: its
first commit is the pristine base, then one commit per patch. New trees are
built under ``DIR/.carry/staging-*`` and swapped in only when every upstream
succeeded; the swap is journalled, so a run killed half-way through it is
rolled forward by the next run. Until then the previous workspaces stay
exactly as they were.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .errors import DirtyTreeError
from .lock import DirLock
from .report import write_json
from .runner import Git

STATE_VERSION = 1


class WorkDir:
    def __init__(self, root: Path):
        self.root = root.resolve() if root.exists() else root.absolute()
        self.meta = self.root / ".carry"

    # -- files ---------------------------------------------------------------------
    @property
    def state_file(self) -> Path:
        return self.meta / "state.json"

    @property
    def journal_file(self) -> Path:
        return self.meta / "journal.json"

    def lock(self, timeout: float) -> DirLock:
        return DirLock(self.meta / "lock", timeout)

    def workspace(self, name: str) -> Path:
        return self.root / name

    def load_state(self) -> dict[str, Any]:
        try:
            state = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return {"version": STATE_VERSION, "upstreams": {}}
        except json.JSONDecodeError:
            raise DirtyTreeError(f"{self.state_file} is not valid JSON",
                                 hint=f"remove {self.root} and apply again") from None
        return state

    def save_state(self, state: dict[str, Any]) -> None:
        write_json(self.state_file, state)

    # -- staging and the swap ---------------------------------------------------------
    def new_staging(self) -> Path:
        self.meta.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(dir=self.meta, prefix="staging-"))

    def recover(self) -> list[str]:
        """Finish a swap a killed run started; remove stale staging. Under the lock."""
        done = []
        if self.journal_file.exists():
            journal = json.loads(self.journal_file.read_text())
            self._swap(Path(journal["staging"]), journal["names"], journal["state"])
            done = list(journal["names"])
        if self.meta.exists():
            for stale in self.meta.glob("staging-*"):
                shutil.rmtree(stale, ignore_errors=True)
            for stale in self.meta.glob("trash-*"):
                shutil.rmtree(stale, ignore_errors=True)
        return done

    def commit(self, staging: Path, names: list[str], state: dict[str, Any]) -> None:
        write_json(self.journal_file, {"staging": str(staging), "names": names, "state": state})
        _fsync_dir(self.meta)
        self._swap(staging, names, state)

    def _swap(self, staging: Path, names: list[str], state: dict[str, Any]) -> None:
        trash = self.meta / f"trash-{staging.name}"
        trash.mkdir(parents=True, exist_ok=True)
        for name in names:
            new = staging / name
            if not new.exists():
                continue  # already moved in by the interrupted run
            ws = self.workspace(name)
            if ws.exists() or ws.is_symlink():
                os.rename(ws, trash / name)
            os.rename(new, ws)
        self.save_state(state)
        self.journal_file.unlink(missing_ok=True)
        _fsync_dir(self.meta)
        shutil.rmtree(trash, ignore_errors=True)
        shutil.rmtree(staging, ignore_errors=True)

    # -- guarding the user's work -------------------------------------------------------
    def check_untouched(self, name: str, recorded: dict[str, Any] | None) -> bool:
        """True when DIR/name is ours and unchanged; False when absent; raises otherwise."""
        ws = self.workspace(name)
        if not ws.exists():
            return False
        g = Git(ws)
        if recorded is None or not (ws / ".git").exists():
            raise DirtyTreeError(f"{ws} exists but was not made by tools/apply.py",
                                 hint="move it away or choose another --workdir")
        head = g.head()
        if head != recorded.get("head"):
            raise DirtyTreeError(
                f"{name}: workspace {ws} has commits the series does not know "
                f"(HEAD {str(head)[:12]}, applied {str(recorded.get('head'))[:12]})",
                hint=f"run tools/export.py --workdir {self.root} to turn them into patch files, "
                     f"or `git -C {ws} reset --hard {str(recorded.get('head'))[:12]}` to drop them")
        dirty = g.status_porcelain()
        if dirty:
            shown = ", ".join(line[3:] for line in dirty[:5]) + (" ..." if len(dirty) > 5 else "")
            raise DirtyTreeError(
                f"{name}: workspace {ws} has uncommitted changes: {shown}",
                hint=f"commit them (`git -C {ws} commit --amend` into the patch they belong to) and run "
                     f"tools/export.py, or discard them with `git -C {ws} reset --hard && git -C {ws} clean -fd`")
        return True


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
