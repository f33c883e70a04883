"""The one check before export or rebase writes a workspace's patch over a patch file.

A file holds nothing of a person's when its bytes are ones the tool itself read (apply, or a
rebase replaying the series) or wrote (export): the sha256 of each is kept. Any other file (edited
by hand since, or one a new series entry names that was drafted by hand before any export) is an
edit: the command stops and writes nothing, unless told to replace it (``--replace-edited``), when
a copy of it is kept first in DIR/.carry/replaced/<UTC time>/.
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path
from typing import Collection, Iterable, Mapping

from ..errors import DirtyTreeError
from ..files import read_input, write_atomic
from ..series.manifest import PatchMeta, Series

Edited = tuple[PatchMeta, Path, bytes]  # the patch, its file, the bytes it holds now


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def edited(pending: Iterable[tuple[PatchMeta, Path, bytes]], known: Mapping[str, Collection[str]],
           vouched: Collection[str] = ()) -> list[Edited]:
    """Each file of ``pending`` (patch, file, the bytes about to be written) that exists, differs from
    those bytes, and holds none the tool read or wrote: ``known`` has those hashes by patch id (a patch
    not in it has none); a patch in ``vouched`` is taken as the tool left it (a record's digest of all
    the files says so)."""
    found = []
    for meta, path, data in pending:
        old = read_input(path) if path.exists() else None
        if old is not None and old != data and meta.id not in vouched and sha(old) not in known.get(meta.id, ()):
            found.append((meta, path, old))
    return found


def refuse(files: list[Edited], since: str, by: str, keep: str, replace: str, root: Path) -> None:
    """Raise the refusal of ``files``: changed ``since`` (what the tool last read or wrote), about to be
    replaced ``by`` a command; ``keep`` says how to keep the edit, ``replace`` is the same command with
    --replace-edited, in backticks (a copy kept under ``root``)."""
    names = ", ".join(str(path) for _, path, _ in files)
    raise DirtyTreeError(
        f"{names}: changed since {since}, and {by} would replace it with the workspace's version; nothing was written",
        hint=f"to keep your edit, {keep}; to write the workspace's version over it and keep a copy of yours in "
             f"{replaced_dir(root)}: {replace}")


def replaced_dir(root: Path) -> Path:
    return root / ".carry" / "replaced"


def keep_copies(root: Path, series: Series, files: list[Edited]) -> None:
    """--replace-edited: a copy of each edited file, as it is, in DIR/.carry/replaced/<UTC time>/
    (its path in the series), made before any file is replaced; a line for each says where."""
    if not files:
        return
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    home, n = replaced_dir(root) / stamp, 1
    while home.exists():
        n += 1
        home = replaced_dir(root) / f"{stamp}-{n}"
    for _, path, old in files:
        copy = home / path.relative_to(series.root)
        write_atomic(copy, old)
        print(f"[carry] {path}: replaced by the workspace's version; yours is kept in {copy}", file=sys.stderr, flush=True)
