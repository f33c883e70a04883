"""A committed GPU run's records kept as one archive: ``<run>/run.tar.xz`` beside its README, unpacked beside it into
``<run>/run/`` (which git ignores) before anything reads them.

Why: a device call carries the working tree and one ferry part in 64 MB. The runs' ranks' records (rank-*.jsonl,
each rank of each launch repeating the same collection and deselection lines, gzipped one file at a time) had grown
the tree to 37.6 MB of which 26 MB were run/ folders, so a part held 18 MiB and a session spent 29 calls on its
ferries, each sending the tree again. One xz archive per run holds the same 26 MB in under 5 MB.

Lossless: the archive holds each file's content (a gzipped one decompressed, so that xz sees across files) and a
manifest, MANIFEST.json, with each file's sha256 and whether it was gzipped. Unpacking checks every sha256, writes
a gzipped file gzipped again (``gzip.compress(..., mtime=0)``: the same content, the same name), and stamps the
folder with the archive's sha256 (``<run>/.run.unpacked``, beside it: run/ holds the run's files and nothing else):
a folder stamped so is left as it is; one stamped otherwise, or not at all, is replaced, never merged. An archive
that does not verify (a member not in the manifest, or its hash another, a link, a path outside the folder) unpacks
nothing: the folder is written beside it and moved in whole.

    python3 -m carry.evidence.records unpack [ROOT]      # every <run>/run.tar.xz under ROOT (default integration)
    python3 -m carry.evidence.records pack RUN...         # RUN/run/ -> RUN/run.tar.xz (run/ kept as it is, stamped)
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import io
import json
import lzma
import os
import shutil
import sys
import tarfile
from pathlib import Path

from ..errors import CarryError, IntegrityError, UsageError
from ..files import write_atomic

ARCHIVE = "run.tar.xz"
FOLDER = "run"
STAMP = ".run.unpacked"   # beside run/, which git ignores too
MANIFEST = "MANIFEST.json"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pack(run: Path) -> Path:
    """RUN/run/ as RUN/run.tar.xz (deterministic: sorted names, no times or owners); RUN/run/ stays, stamped."""
    folder = run / FOLDER
    if not folder.is_dir():
        raise UsageError(f"{folder}: no such folder to pack")
    files: dict[str, dict] = {}
    contents: list[tuple[str, bytes]] = []
    for path in sorted(folder.rglob("*")):
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            raise UsageError(f"{path}: a link or special file; a run's records are plain files")
        if path.is_dir():
            continue
        name, data = path.relative_to(folder).as_posix(), path.read_bytes()
        zipped = name.endswith(".gz")
        if zipped:
            data = gzip.decompress(data)
        stored = name[:-3] if zipped else name
        if any(stored == other for other, _ in contents):
            raise UsageError(f"{path}: both it and its name without .gz are there; one archive name would hold two")
        files[name] = {"sha256": _sha(data), "gzip": zipped}
        contents.append((stored, data))
    manifest = json.dumps({"format": 1, "files": files}, indent=1, sort_keys=True).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in [(MANIFEST, manifest), *contents]:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tf.addfile(info, io.BytesIO(data))
    archive, packed = run / ARCHIVE, lzma.compress(buf.getvalue(), preset=9 | lzma.PRESET_EXTREME)
    write_atomic(archive, packed)
    write_atomic(run / STAMP, _sha(packed) + "\n")
    return archive


def unpack(archive: Path) -> Path:
    """ARCHIVE's records in the run/ folder beside it, checked against its manifest; nothing written where one
    does not verify. Returns the folder. Two at once (two test sessions in one checkout) take turns: each holds
    a lock on the archive itself while it looks and writes, and the second finds the folder stamped."""
    with open(archive, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        return _unpack(archive)


def _unpack(archive: Path) -> Path:
    folder = archive.parent / FOLDER
    raw = archive.read_bytes()
    digest = _sha(raw)
    stamp = archive.parent / STAMP
    if folder.is_dir() and stamp.is_file() and stamp.read_text().strip() == digest:
        return folder
    try:
        members = _verified(lzma.decompress(raw))
    except (lzma.LZMAError, tarfile.TarError, ValueError, KeyError) as e:
        raise IntegrityError(f"{archive}: not a run's records archive ({e})") from e
    except IntegrityError as e:
        raise IntegrityError(f"{archive}: {e}") from e
    tmp = archive.parent / f".{FOLDER}.unpacking.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for name, data in members.items():
            out = tmp / name
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)
    except BaseException:   # a full disk, an interrupt: nothing half-written stays, the folder there is untouched
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = archive.parent / f".{FOLDER}.replaced.{os.getpid()}"
    stamp.unlink(missing_ok=True)
    if folder.exists():
        os.replace(folder, old)
    os.replace(tmp, folder)
    shutil.rmtree(old, ignore_errors=True)
    write_atomic(stamp, digest + "\n")
    return folder


def _verified(tar_bytes: bytes) -> dict[str, bytes]:
    """The files of an archive (their names as unpacked, gzipped again where they were), each checked against the
    manifest; IntegrityError for anything else in it, or anything missing."""
    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as tf:
        got: dict[str, bytes] = {}
        for info in tf.getmembers():
            name = info.name
            if not info.isfile() or name.startswith("/") or ".." in Path(name).parts or name in got:
                raise IntegrityError(f"{name!r}: not a plain file inside the folder")
            got[name] = tf.extractfile(info).read()
    manifest = json.loads(got.pop(MANIFEST))
    files: dict[str, dict] = manifest["files"]
    out: dict[str, bytes] = {}
    for name, meta in files.items():
        stored = name[:-3] if meta["gzip"] else name
        if stored not in got:
            raise IntegrityError(f"{name}: in the manifest, not in the archive")
        data = got.pop(stored)
        if _sha(data) != meta["sha256"]:
            raise IntegrityError(f"{name}: sha256 {_sha(data)[:12]}, the manifest says {meta['sha256'][:12]}")
        out[name] = gzip.compress(data, mtime=0) if meta["gzip"] else data
    if got:
        raise IntegrityError(f"{sorted(got)[0]}: in the archive, not in the manifest")
    return out


def unpacked_for(path: Path) -> None:
    """Where PATH lies in the run/ folder of a run kept as an archive (RUN/run/..., RUN/run.tar.xz), that archive
    unpacked first (nothing done where it is already, or where PATH lies in no such folder)."""
    for parent in Path(os.path.abspath(path)).parents:
        if parent.name == FOLDER and (parent.parent / ARCHIVE).is_file():
            unpack(parent.parent / ARCHIVE)
            return


def members(archive: Path) -> list[str]:
    """The files ARCHIVE holds, named as they unpack (relative to run/), read from its manifest unchecked."""
    with tarfile.open(fileobj=io.BytesIO(lzma.decompress(archive.read_bytes())), mode="r:") as tf:
        manifest = tf.extractfile(MANIFEST)
        if manifest is None:
            raise IntegrityError(f"{archive}: no {MANIFEST}")
        return sorted(json.loads(manifest.read())["files"])


def unpack_all(root: Path) -> list[Path]:
    """Every run.tar.xz under ROOT unpacked beside it (one already unpacked from the same archive is left)."""
    return [unpack(a) for a in sorted(root.rglob(ARCHIVE))]


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    try:
        if argv[:1] == ["unpack"] and len(argv) <= 2:
            done = unpack_all(Path(argv[1] if len(argv) == 2 else "integration"))
            print(f"{len(done)} run(s) unpacked or already so", file=sys.stderr)
            return 0
        if argv[:1] == ["pack"] and len(argv) >= 2:
            for run in argv[1:]:
                print(pack(Path(run)))
            return 0
    except CarryError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print("usage:\n" + __doc__.split("\n\n")[-1].rstrip(), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
