"""A write of the series as one journalled step: the next run finishes it, or removes what it staged.

Two commands change several files of a series at once. ``retire --write`` edits the manifest,
moves each retired patch (its file, its record, its proofs) to ``retired/<id>/`` and deletes
the files the series no longer lists; ``rebase`` replaces the patch files it refreshed and
moves the pin in the manifest (and retires what upstream merged in its own words). A run
killed between those writes would leave a mix: new patch files under the old pin, or a patch
gone from the manifest while its file stays, and lint and apply would take it as it is.

So every new file is staged first (``retired/.staging-<pid>/``: the retired folders, and the
new text of each replaced file as ``.write-N``), then a journal (``retired/.journal.json``)
records the whole step, new manifest text included. The journal is the commit point: from
there on every run that loads the series (carry.series.repo.load_series: lint, apply, prove,
export, rebase, retire...) finishes it if its writer is dead, and says so in one line. A
staging folder with no journal, of a dead writer, is what a run killed before its commit
point left: it is removed (nothing had been written yet), and that is said in one line too.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import sys
from pathlib import Path

from .. import progress
from ..errors import ConfigError
from ..files import fsync_dir, read_input, read_input_text, write_atomic, write_json
from ..lock import process_alive
from ..shell import carried, code, run_again, tool

JOURNAL = ".journal.json"
_STAGING = re.compile(r"\.staging-([0-9]+)")
_WRITE = re.compile(r"\.write-[0-9]+")


def _sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode("utf-8") if isinstance(text, str) else text).hexdigest()


def _file_sha(path: Path) -> str | None:
    try:
        return hashlib.sha256(read_input(path)).hexdigest()
    except FileNotFoundError:
        return None


def staging_folder(root: Path) -> Path:
    return root / "retired" / f".staging-{os.getpid()}"


def commit(root: Path, new_text: str, ids: list[str], removes: list[Path], *,
           writes: dict[Path, str | bytes] | None = None, kind: str = "retire", what: str | None = None) -> None:
    """Journal, then do, the step staged in ``staging_folder(root)``: each file of ``writes`` gets
    its new text, the manifest becomes ``new_text``, each staged ``retired/.staging-*/<id>``
    moves to ``retired/<id>``, ``removes`` go. ``kind`` (retire, rebase) names the stop points
    (carry.progress.checkpoint); ``what`` is what a later run's line names (the ids retired,
    "megatron-lm onto v3")."""
    manifest = root / "series.toml"
    staged = staging_folder(root)
    staged.mkdir(parents=True, exist_ok=True)
    planned = []
    try:
        for n, (path, text) in enumerate((writes or {}).items(), 1):
            write_atomic(staged / f".write-{n}", text)
            planned.append({"path": os.path.relpath(path, root), "staged": f".write-{n}",
                            "old_sha": _file_sha(path), "new_sha": _sha(text)})
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)  # nothing journalled: the series is as it was
        raise
    progress.checkpoint(f"{kind}-staged")
    doc = {"pid": os.getpid(), "kind": kind, "what": what or ", ".join(ids) or "no patch (the pin moved)",
           "staging": staged.name, "ids": ids, "writes": planned,
           "removes": [os.path.relpath(p, root) for p in removes],
           "remove_shas": [_file_sha(p) for p in removes],
           "old_sha": _sha(read_input_text(manifest)), "new_sha": _sha(new_text), "series_toml": new_text}
    write_json(root / "retired" / JOURNAL, doc)
    progress.checkpoint(f"{kind}-journalled")
    _finish(root, doc)


def _finish(root: Path, doc: dict) -> None:
    manifest, retired = root / "series.toml", root / "retired"
    staged = retired / doc["staging"]
    kind = doc.get("kind", "retire")
    for n, w in enumerate(doc.get("writes", []), 1):
        _move_in(staged / w["staged"], root / w["path"])
        progress.checkpoint(f"{kind}-file-{n}")
    progress.checkpoint(f"{kind}-files")  # every file in place, the manifest not yet
    if _file_sha(manifest) != doc["new_sha"]:
        write_atomic(manifest, doc["series_toml"])
    progress.checkpoint(f"{kind}-manifest")
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


def _move_in(src: Path, dest: Path) -> None:
    """Rename the staged ``src`` over ``dest`` (keeping its mode); a run that moved it already left no ``src``."""
    if not src.is_file():
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        os.chmod(src, dest.stat().st_mode & 0o777)
    try:
        os.replace(src, dest)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        write_atomic(dest, read_input(src))  # a patch folder on another file system
        src.unlink()
    fsync_dir(dest.parent)


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid == os.getpid():
        return False  # recovery runs before this process stages anything: a folder of its pid is older
    return process_alive(pid)


def _relative(path: object) -> bool:
    return isinstance(path, str) and bool(path) and not os.path.isabs(path) and ".." not in Path(path).parts


def _read(journal: Path, root: Path) -> dict:
    try:
        doc = json.loads(read_input_text(journal))
        fields = (doc["staging"], doc["ids"], doc["removes"], doc["old_sha"], doc["new_sha"], doc["series_toml"])
        writes = doc.get("writes", [])
        ok = (_STAGING.fullmatch(str(fields[0])) and all(isinstance(i, str) and "/" not in i and i not in ("", ".", "..")
                                                         for i in fields[1])
              and all(_relative(r) for r in fields[2])
              and isinstance(writes, list)
              and all(_relative(w["path"]) and _WRITE.fullmatch(str(w["staged"])) and "old_sha" in w and "new_sha" in w
                      for w in writes)
              and isinstance(fields[5], str))
        if not ok:
            raise ValueError("it names paths outside the series folder")
        return doc
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{journal}, left by an interrupted retire --write or rebase, cannot be read ({exc}); "
                          "nothing was moved",
                          hint=f"check {code('git', '-C', root, 'status')} (series.toml, the patch files and "
                               f"retired/), then remove it ({code('rm', journal)}) and " + run_again()) from None


def recover(root: Path) -> list[str]:
    """Finish a step a killed run journalled; remove a dead run's staging. Returns the ids it retired."""
    retired = root / "retired"
    if not retired.is_dir():
        return []
    journal = retired / JOURNAL
    done: list[str] = []
    if journal.exists():
        doc = _read(journal, root)
        if _alive(doc.get("pid")):
            return []  # its writer is still at work
        _check_untouched(root, doc, journal)
        _finish(root, doc)
        done = list(doc["ids"])
        print(f"[carry] finished {_named(doc, 'the')} that an interrupted {_verb(doc)} left in {root}",
              file=sys.stderr, flush=True)
    for stale in retired.glob(".staging-*"):
        m = _STAGING.fullmatch(stale.name)
        if m and not _alive(int(m[1])):
            shutil.rmtree(stale, ignore_errors=True)
            print(f"[carry] removed {stale}, staged by an interrupted retire --write or rebase (pid {m[1]}) that had "
                  "written nothing yet: the series is as it was", file=sys.stderr, flush=True)
    try:
        retired.rmdir()
    except OSError:
        pass
    return done


def _verb(doc: dict) -> str:
    return "rebase" if doc.get("kind") == "rebase" else "retire --write"


def _named(doc: dict, article: str) -> str:
    """The step as a line names it: "a rebase of megatron-lm onto v3", "the retirement of plain"."""
    what = doc.get("what") or ", ".join(doc["ids"]) or "no patch (the pin moved)"
    if doc.get("kind") == "rebase":
        return f"{article} rebase of {what}"
    return f"the retirement of {what}" if article == "the" else f"a retire --write of {what}"


def _check_untouched(root: Path, doc: dict, journal: Path) -> None:
    """Refuse to finish over a file edited since the kill: the manifest, a file to replace, a file to remove."""
    what = _named(doc, "a")
    manifest = root / "series.toml"
    current = _sha(read_input_text(manifest)) if manifest.is_file() else None
    writes = doc.get("writes", [])
    # A step that replaces files can only go forward: dropping it would leave some replaced, some not.
    if current not in (doc["old_sha"], doc["new_sha"]) and not (writes and current is None):
        if writes:
            raise ConfigError(
                f"{manifest} was edited after {what} was interrupted (its journal {journal} is kept): finishing it "
                "would overwrite that edit; nothing was moved",
                hint=f"move your version aside ({code('mv', manifest, str(manifest) + '.mine')}), then "
                     f"{run_again()}: the {_verb(doc)} is finished and your version stays beside it")
        drop = code("rm", "-rf", root / "retired" / doc["staging"], journal)
        # the lint command as carry.series.repo.command spells it (repo imports this module)
        lint = code(*tool("lint"), "--series", root, *carried("lint", {"--series"}))
        raise ConfigError(
            f"{manifest} was edited after {what} was interrupted "
            f"(its journal {journal} is kept): finishing it would overwrite that edit; nothing was moved",
            hint=f"to drop the interrupted retirement and keep your edit: {drop}, then {lint} lists what is left to fix")
    shas = doc.get("remove_shas") or [None] * len(doc["removes"])
    deleted = [rel for rel, sha in zip(doc["removes"], shas)
               if sha is not None and _file_sha(root / rel) not in (sha, None)]
    overwritten = [w["path"] for w in writes if _file_sha(root / w["path"]) not in (w["old_sha"], w["new_sha"], None)]
    edited = overwritten + deleted
    if edited:
        would = " or ".join(v for v, hit in (("overwrite", overwritten), ("delete", deleted)) if hit)
        raise ConfigError(
            f"{', '.join(str(root / rel) for rel in edited)} changed after {what} was interrupted (its journal "
            f"{journal} is kept): finishing it would {would} that edit; nothing was moved",
            hint=f"move your version aside ({code('mv', root / edited[0], str(root / edited[0]) + '.mine')}"
                 f"{' and the like for each' if len(edited) > 1 else ''}), then run the command again: the "
                 f"{'rebase' if writes else 'retirement'} is finished and your version stays")
