"""A retirement as one journalled step: the next run finishes it, or removes what it staged.

Retiring edits the manifest, moves each retired patch (its file, its record, its proofs) to
``retired/<id>/`` and deletes the files the series no longer lists. Those are several writes;
a run killed between them would leave a patch gone from the manifest while its file stays.
So the retired folders are staged first (``retired/.staging-<pid>/``), then a journal
(``retired/.journal.json``) records the whole step, new manifest text included; from there on
every run that loads the series (carry.series.repo.load_series: retire, lint, apply, export...)
finishes it if its writer is dead. A staging folder with no journal, of a dead writer, is
what a run killed before its commit point left: removed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
from pathlib import Path

from .. import progress
from ..errors import ConfigError
from ..files import read_input, read_input_text, write_atomic, write_json
from ..lock import process_alive
from ..shell import carried, code, run_again, tool

JOURNAL = ".journal.json"
_STAGING = re.compile(r"\.staging-([0-9]+)")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _file_sha(path: Path) -> str | None:
    try:
        return hashlib.sha256(read_input(path)).hexdigest()
    except FileNotFoundError:
        return None


def staging_folder(root: Path) -> Path:
    return root / "retired" / f".staging-{os.getpid()}"


def commit(root: Path, new_text: str, ids: list[str], removes: list[Path]) -> None:
    """Journal, then do, the retirement staged in ``staging_folder(root)``: the manifest becomes
    ``new_text``, each staged ``retired/.staging-*/<id>`` moves to ``retired/<id>``, ``removes`` go."""
    manifest = root / "series.toml"
    staged = staging_folder(root)
    progress.checkpoint("retire-staged")
    doc = {"pid": os.getpid(), "staging": staged.name, "ids": ids,
           "removes": [os.path.relpath(p, root) for p in removes],
           "remove_shas": [_file_sha(p) for p in removes],
           "old_sha": _sha(read_input_text(manifest)), "new_sha": _sha(new_text), "series_toml": new_text}
    write_json(root / "retired" / JOURNAL, doc)
    progress.checkpoint("retire-journalled")
    _finish(root, doc)


def _finish(root: Path, doc: dict) -> None:
    manifest, retired = root / "series.toml", root / "retired"
    staged = retired / doc["staging"]
    if _sha(read_input_text(manifest)) != doc["new_sha"]:
        write_atomic(manifest, doc["series_toml"])  # the commit point
    progress.checkpoint("retire-manifest")
    for pid in doc["ids"]:
        src, final = staged / pid, retired / pid
        if src.is_dir():
            if final.exists():
                shutil.rmtree(final)
            os.rename(src, final)
    for rel in doc["removes"]:
        (root / rel).unlink(missing_ok=True)
    shutil.rmtree(staged, ignore_errors=True)
    (retired / JOURNAL).unlink(missing_ok=True)
    try:
        retired.rmdir()  # nothing was retired: no empty retired/ folder either
    except OSError:
        pass


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid == os.getpid():
        return False  # recovery runs before this process stages anything: a folder of its pid is older
    return process_alive(pid)


def _read(journal: Path, root: Path) -> dict:
    try:
        doc = json.loads(read_input_text(journal))
        fields = (doc["staging"], doc["ids"], doc["removes"], doc["old_sha"], doc["new_sha"], doc["series_toml"])
        ok = (_STAGING.fullmatch(str(fields[0])) and all(isinstance(i, str) and "/" not in i and i not in ("", ".", "..")
                                                         for i in fields[1])
              and all(isinstance(r, str) and not os.path.isabs(r) and ".." not in Path(r).parts for r in fields[2])
              and isinstance(fields[5], str))
        if not ok:
            raise ValueError("it names paths outside the series folder")
        return doc
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{journal}, left by an interrupted retire --write, cannot be read ({exc}); nothing was moved",
                          hint=f"check {code('git', '-C', root, 'status')} (series.toml and retired/), "
                               f"then remove it ({code('rm', journal)}) and " + run_again()) from None


def recover(root: Path) -> list[str]:
    """Finish a retirement a killed run journalled; remove a dead run's staging. Returns the ids finished."""
    retired = root / "retired"
    if not retired.is_dir():
        return []
    journal = retired / JOURNAL
    done: list[str] = []
    if journal.exists():
        doc = _read(journal, root)
        if _alive(doc.get("pid")):
            return []  # its writer is still at work
        manifest = root / "series.toml"
        current = _sha(read_input_text(manifest)) if manifest.is_file() else None
        if current not in (doc["old_sha"], doc["new_sha"]):
            drop = code("rm", "-rf", retired / doc["staging"], journal)
            # the lint command as carry.series.repo.command spells it (repo imports this module)
            lint = code(*tool("lint"), "--series", root, *carried("lint", {"--series"}))
            raise ConfigError(
                f"{manifest} was edited after a retire --write of {', '.join(doc['ids'])} was interrupted "
                f"(its journal {journal} is kept): finishing it would overwrite that edit; nothing was moved",
                hint=f"to drop the interrupted retirement and keep your edit: {drop}, then "
                     f"{lint} lists what is left to fix")
        shas = doc.get("remove_shas") or [None] * len(doc["removes"])
        edited = [rel for rel, sha in zip(doc["removes"], shas)
                  if sha is not None and _file_sha(root / rel) not in (sha, None)]
        if edited:
            raise ConfigError(
                f"{', '.join(str(root / rel) for rel in edited)} changed after a retire --write of "
                f"{', '.join(doc['ids'])} was interrupted (its journal {journal} is kept): finishing it would "
                "delete that edit; nothing was moved",
                hint=f"move your version aside ({code('mv', root / edited[0], str(root / edited[0]) + '.mine')}"
                     f"{' and the like for each' if len(edited) > 1 else ''}), then run the command again: the "
                     "retirement is finished and your version stays")
        _finish(root, doc)
        done = list(doc["ids"])
        print(f"[carry] finished the retirement of {', '.join(done)} that an interrupted retire --write left "
              f"in {root}", file=sys.stderr, flush=True)
    for stale in retired.glob(".staging-*"):
        m = _STAGING.fullmatch(stale.name)
        if m and not _alive(int(m[1])):
            shutil.rmtree(stale, ignore_errors=True)
    try:
        retired.rmdir()
    except OSError:
        pass
    return done
