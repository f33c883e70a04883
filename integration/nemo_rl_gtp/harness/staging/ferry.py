"""Ferry parts: files too big for one device call, in the format of shared/gpu/ferry.sh.

``.ferry/NAME.part00``, ``.part01``, ... are consecutive slices of one tar;
``.ferry/NAME.sha256`` holds ``"<sha256 of the tar> <number of parts>"``;
``.ferry/recv.sh`` (shared by every ferry) collects the parts on the GPU host,
one call each, and unpacks the tar once all are there. A ferry packed here is
received by the same recv.sh as the TransformerEngine ferry, and the other way
round.

The tar holds ``NAME/payload.tar.xz`` and ``NAME/manifest.json``: the payload is
compressed once, here, so the parts are as few as they can be; recv.sh only
joins and untars, and run-on-gpu-host decompresses with Python's lzma (no xz
binary needed there).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

from carry.errors import CommandError, IntegrityError, UsageError

# What one device call carries, the working tree and one part: its limit is written as 64 MiB, but a call of
# 64.7 MB (61.7 MiB: a 19.7 MB tree, a 45.0 MB part) was refused and one of 62.7 MB went (2026-12-06): read as
# 64,000,000 bytes
CALL_BYTES = 64 * 1000 * 1000
MARGIN_BYTES = 2 * 1024 * 1024  # for what the tree gains between staging and the calls (a commit's logs)
PART_BYTES = 56 * 1024 * 1024   # the most a part holds (room for an 8 MiB tree)
MIN_PART_BYTES = 16 * 1024 * 1024


def travelling_bytes(root: Path) -> int:
    """What a device call carries besides its part: the checkout's tracked files and those git does
    not ignore (the device tool's rule), as they are on disk now."""
    from carry.git import Git

    out = Git(root)("ls-files", "-z", "--cached", "--others", "--exclude-standard", binary=True).stdout
    total = 0
    for rel in filter(None, out.split(b"\0")):
        path = root / os.fsdecode(rel)
        if path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    return total


def part_bytes_for(root: Path) -> int:
    """The largest part that fits one call beside the working tree (with a margin), at most
    PART_BYTES; a tree that leaves less than MIN_PART_BYTES is an error (too many calls)."""
    room = CALL_BYTES - travelling_bytes(root) - MARGIN_BYTES
    if room < MIN_PART_BYTES:
        raise UsageError(f"{root}: the working tree that travels with every device call leaves {room / 2**20:.1f} MiB "
                         f"of the {CALL_BYTES / 1e6:.0f} MB a call carries for a ferry part",
                         hint="ignore or remove what need not travel (git status), then stage again")
    return min(PART_BYTES, room // (1024 * 1024) * 1024 * 1024)

# The receiving side of the protocol, written only where .ferry/recv.sh is missing (stage-te.sh
# writes an equivalent one). Usage there: bash .ferry/recv.sh NAME [DEST]
RECV_SH = r"""#!/usr/bin/env bash
# One ferry part arrives per call:  bash .ferry/recv.sh NAME [DEST]   (DEST: /tmp/ferry/NAME.d)
# The parts wait in /tmp/ferry/NAME; with the last one they are joined, hash-checked and untarred.
set -euo pipefail
ferry_name=$1
target=${2:-/tmp/ferry/$ferry_name.d}
src_dir=$(cd "$(dirname "$0")" && pwd)
read -r want count < "$src_dir/$ferry_name.sha256"
if [ "$(cat "$target/.ferry-ok" 2>/dev/null || true)" = "$want" ]; then
  echo "ferry $ferry_name: already unpacked in $target"; exit 0
fi
hold=/tmp/ferry/$ferry_name
mkdir -p "$hold"
shopt -s nullglob
for part in "$src_dir/$ferry_name".part*; do cp -f "$part" "$hold/"; done
got=("$hold/$ferry_name".part*)
if [ "${#got[@]}" -lt "$count" ]; then echo "ferry $ferry_name: have ${#got[@]} of $count parts"; exit 0; fi
cat "${got[@]}" > "$hold/joined.tar"
if [ "$(sha256sum "$hold/joined.tar" | cut -d' ' -f1)" != "$want" ]; then
  rm -f "$hold/joined.tar"; echo "ferry $ferry_name: hash mismatch" >&2; exit 1
fi
mkdir -p "$target"
tar -xf "$hold/joined.tar" -C "$target"
rm -f "$hold/joined.tar" "${got[@]}"
echo "$want" > "$target/.ferry-ok"
echo "ferry $ferry_name: complete, unpacked in $target"
"""


def _member(tf: tarfile.TarFile, arcname: str, data_path: Path | None = None, data: bytes | None = None) -> None:
    info = tarfile.TarInfo(arcname)
    info.mode, info.mtime, info.uid, info.gid = 0o644, 0, 0, 0
    if data_path is not None:
        info.size = data_path.stat().st_size
        with open(data_path, "rb") as f:
            tf.addfile(info, f)
    else:
        assert data is not None
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))


def pack(root: Path, name: str, payload: Path, manifest: dict, part_bytes: int = PART_BYTES) -> list[Path]:
    """Write ROOT/.ferry/NAME.part*, NAME.sha256 (and recv.sh if missing); return the parts."""
    return pack_files(root, name, {payload.name: payload}, manifest, part_bytes)


def pack_files(root: Path, name: str, files: dict[str, Path], manifest: dict, part_bytes: int = PART_BYTES) -> list[Path]:
    """As pack, with FILES ({path under NAME/: file}) in the ferry beside its manifest.json."""
    if not name.replace("-", "").replace("_", "").isalnum():
        raise UsageError(f"ferry name {name!r}: letters, digits, - and _ only")
    ferry = root / ".ferry"
    ferry.mkdir(exist_ok=True)
    for old in ferry.glob(f"{name}.part*"):
        old.unlink()
    tmp = ferry / f".{name}.tar.tmp"
    with tarfile.open(tmp, "w", format=tarfile.GNU_FORMAT) as tf:
        _member(tf, f"{name}/manifest.json", data=(json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())
        for arcname, path in files.items():
            _member(tf, f"{name}/{arcname}", data_path=path)
    h = hashlib.sha256()
    parts: list[Path] = []
    try:
        with open(tmp, "rb") as f:
            while chunk := f.read(part_bytes):
                h.update(chunk)
                part = ferry / f"{name}.part{len(parts):02d}"
                part.write_bytes(chunk)
                parts.append(part)
    finally:
        tmp.unlink(missing_ok=True)
    (ferry / f"{name}.sha256").write_text(f"{h.hexdigest()} {len(parts)}\n")
    recv = ferry / "recv.sh"
    if not recv.exists():
        recv.write_text(RECV_SH)
        recv.chmod(0o755)
    _exclude(root)
    return parts


def _exclude(root: Path) -> None:
    """.ferry/ never belongs in a commit (the same line ferry.sh adds)."""
    git = root / ".git"
    if git.is_file():  # a worktree: the exclude file lives in the common git dir
        text = git.read_text().strip()
        gitdir = Path(text.split(":", 1)[1].strip()) if text.startswith("gitdir:") else None
        common = gitdir / "commondir" if gitdir else None
        git = (gitdir / common.read_text().strip()).resolve() if common and common.exists() else gitdir
    if git is None or not git.is_dir():
        return
    exclude = git / "info" / "exclude"
    lines = exclude.read_text().splitlines() if exclude.exists() else []
    if "/.ferry/" not in lines:
        exclude.parent.mkdir(parents=True, exist_ok=True)
        with open(exclude, "a") as f:
            f.write("/.ferry/\n")


def check(root: Path, name: str) -> dict:
    """Join the parts here, check the recorded hash and read the manifest (what recv.sh will do)."""
    ferry = root / ".ferry"
    meta = ferry / f"{name}.sha256"
    if not meta.exists():
        raise UsageError(f"no ferry {name!r} in {ferry}", hint="run integration/nemo_rl_gtp/stage first")
    fields = meta.read_text().split()
    if len(fields) != 2 or not fields[1].isdigit():
        raise IntegrityError(f"{meta}: expected '<sha256> <parts>', got {meta.read_text().strip()!r}")
    want, n = fields[0], int(fields[1])
    parts = sorted(ferry.glob(f"{name}.part*"))
    if len(parts) != n:
        raise IntegrityError(f"ferry {name}: {len(parts)} part(s) in {ferry}, {meta.name} says {n}")
    h = hashlib.sha256()
    sizes = []
    for p in parts:
        data = p.read_bytes()
        sizes.append(len(data))
        h.update(data)
    if h.hexdigest() != want:
        raise IntegrityError(f"ferry {name}: the joined parts have sha256 {h.hexdigest()}, {meta.name} says {want}",
                             hint="a part is missing, stale or damaged: run the stage again")
    manifest = None
    joined = io.BytesIO(b"".join(p.read_bytes() for p in parts))
    with tarfile.open(fileobj=joined) as tf:
        names = tf.getnames()
        m = tf.extractfile(f"{name}/manifest.json") if f"{name}/manifest.json" in names else None
        if m is not None:
            manifest = json.load(m)
    if manifest is None:
        raise IntegrityError(f"ferry {name}: no {name}/manifest.json in the tar")
    return {"name": name, "sha256": want, "parts": [str(p) for p in parts], "part_bytes": sizes,
            "members": names, "manifest": manifest, "recv_sh": (ferry / "recv.sh").exists(),
            "over_limit": [str(p) for p, s in zip(parts, sizes) if s > _room(root)]}


def _room(root: Path) -> int:
    """What a part may weigh in a call from this checkout as it is now (no margin: the calls are next)."""
    try:
        return min(PART_BYTES, CALL_BYTES - travelling_bytes(root))
    except (CommandError, OSError):  # not a git checkout (a copy of the parts): the fixed limit
        return PART_BYTES


def receive_local(parts_root: Path, name: str, dest: Path) -> Path:
    """What recv.sh does, in Python: for tests and the dry-run (no GPU host involved)."""
    info = check(parts_root, name)
    dest.mkdir(parents=True, exist_ok=True)
    joined = io.BytesIO(b"".join(Path(p).read_bytes() for p in info["parts"]))
    with tarfile.open(fileobj=joined) as tf:
        tf.extractall(dest, filter="data")
    (dest / ".ferry-ok").write_text(info["sha256"] + "\n")
    return dest / name


def sizes_mb(paths: list[Path]) -> list[float]:
    return [round(os.path.getsize(p) / 1e6, 1) for p in paths]
