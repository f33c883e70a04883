"""The dependency wheels: fetched and hash-checked here, unpacked for transport, zipped again there.

A wheel is a zip; compressed once more inside an xz payload it barely
shrinks, while its unpacked files shrink by about 40%. So the stage unpacks
each checked wheel (leaving out the lock's ``drop`` globs and their RECORD
lines), and run-on-gpu-host checks every file against RECORD and zips the
wheel again under its own name, for pip to install. RECORD is what ties the
files back to the hash-checked download.
"""

from __future__ import annotations

import base64
import csv
import email.parser
import hashlib
import io
import os
import platform
import re
import shutil
import ssl
import sys
import tarfile
import urllib.request
import zipfile
from pathlib import Path

from carry import progress
from carry.errors import IntegrityError, OperationError, SourceError
from carry.runner import run
from carry.workspace.artifacts import sha256_file
from carry.workspace.wheels import metadata_text

from .wheel_lock import Artifact, Lock, check_file, is_sdist, load, render, with_artifact

LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


def wheel_glibc(file: str) -> tuple[int, int] | None:
    """The oldest glibc that one of the wheel's platform tags accepts; None when it names no glibc."""
    if not file.endswith(".whl"):
        return None
    found = []
    for tag in file[:-4].split("-")[-1].split("."):
        m = re.fullmatch(r"manylinux_(\d+)_(\d+)_\w+", tag)
        if m:
            found.append((int(m[1]), int(m[2])))
        elif tag.split("_", 1)[0] in LEGACY_MANYLINUX:
            found.append(LEGACY_MANYLINUX[tag.split("_", 1)[0]])
    return min(found) if found else None


def glibc_needed(files: list[str]) -> tuple[tuple[int, int], str] | None:
    """The newest glibc any of FILES needs, and the wheel that needs it."""
    need = [(v, f) for f in files if (v := wheel_glibc(f)) is not None]
    return max(need) if need else None


def this_glibc() -> tuple[int, int] | None:
    lib, version = platform.libc_ver()
    m = re.match(r"(\d+)\.(\d+)", version) if lib == "glibc" else None
    return (int(m[1]), int(m[2])) if m else None


def check_glibc(files: list[str], have: tuple[int, int] | None = None) -> tuple[int, int] | None:
    """Stop early, with the wheel's name, when this machine's glibc is older than a wheel needs."""
    need = glibc_needed(files)
    have = have if have is not None else this_glibc()
    if need is not None and (have is None or have < need[0]):
        here = "no glibc" if have is None else "glibc %d.%d" % have
        raise OperationError(f"this machine has {here}; the staged wheel {need[1]} needs glibc >= "
                             f"{need[0][0]}.{need[0][1]} (its manylinux tag), so pip would refuse it",
                             hint="run on a GPU host with that glibc, or pin a release of it with an older "
                                  "manylinux tag in integration/nemo_rl_gtp/wheels.toml")
    return need[0] if need else None


def _platform_args(lock: Lock) -> list[str]:
    args = ["--only-binary=:all:", "--python-version", lock.python, "--implementation", "cp"]
    for plat in lock.platforms:
        args += ["--platform", plat]
    return args


def _pip_download(reqs: str, dest: Path, extra: list[str], what: str) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    req = dest / ".requirements.txt"
    req.write_text(reqs)
    try:
        res = run([sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--disable-pip-version-check",
                   "--no-input", "--progress-bar", "off", "--dest", str(dest), "-r", str(req), *extra], check=False)
    finally:
        req.unlink(missing_ok=True)
    if not res.ok:
        tail = " ".join((res.stderr or res.stdout).strip().splitlines()[-3:])
        if "DO NOT MATCH" in res.stderr.upper():
            raise IntegrityError(f"{what}: the index served other bytes than the lock pins: {tail}")
        raise SourceError(f"{what}: pip download failed: {tail}",
                          hint="check access to the package index (the stage runs where it is reachable)")


def fetch(lock: Lock, cache: Path) -> dict[str, Path]:
    """Every pinned artifact in CACHE, downloaded once, always hash-checked; {name: path}."""
    out: dict[str, Path] = {}
    missing_w = [a for a in lock.wheels if not (cache / a.file).exists()]
    missing_s = [a for a in lock.sdists if not (cache / a.file).exists()]
    if missing_w:
        progress.say(f"downloading {len(missing_w)} wheel(s)")
        _pip_download(lock.pip_requirements(tuple(missing_w)), cache, _platform_args(lock), "wheels")
    if missing_s:
        progress.say(f"downloading {len(missing_s)} source distribution(s)")
        _pip_download(lock.pip_requirements(tuple(missing_s)), cache, ["--no-binary=:all:"], "sdists")
    for a in lock.artifacts:
        out[a.name] = _checked(cache, a)
    return out


def _checked(cache: Path, a: Artifact) -> Path:
    """CACHE's copy of A, which the download must have written, with A's sha256."""
    path = cache / a.file
    if not path.exists():
        raise SourceError(f"{a.pin}: pip did not write {a.file}",
                          hint="the pinned file name may be wrong for this platform: check wheels.toml")
    check_file(path, a)
    return path


def fetch_te(lock: Lock, cache: Path) -> list[Path]:
    """The [[te]] files in CACHE, downloaded once, always hash-checked, in the lock's order."""
    return _fetch(lock, lock.te, cache, "TransformerEngine for the GPU host")


def fetch_tests(lock: Lock, cache: Path) -> list[Path]:
    """The [[tests]] wheels (what the upstreams' own tests import that the host's stack lacks) in CACHE,
    as fetch_te."""
    return _fetch(lock, lock.tests, cache, "what the upstreams' own tests import")


def _fetch(lock: Lock, items: tuple, cache: Path, what: str) -> list[Path]:
    missing = [a for a in items if not (cache / a.file).exists()]
    binary = tuple(a for a in missing if not is_sdist(a))
    source = tuple(a for a in missing if is_sdist(a))
    if missing:
        progress.say(f"downloading {what}: {len(missing)} file(s)")
    if binary:
        _pip_download(lock.pip_requirements(binary), cache, _platform_args(lock), what)
    for a in source:   # by its link (_sdist_by_link); a file that is not the pin is removed, not kept in the cache
        got = _sdist_by_link(a, cache)
        try:
            check_file(got, a)
        except IntegrityError:
            got.unlink()
            raise
    return [_checked(cache, a) for a in items]


def requirements_of(path: Path) -> list[str]:
    """The Requires-Dist lines of a wheel's METADATA or a source distribution's PKG-INFO."""
    text = ""
    try:
        if path.name.endswith(".whl"):
            text = metadata_text(path)
        else:
            with tarfile.open(path) as tf:
                info = [m for m in tf.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO")]
                text = tf.extractfile(info[0]).read().decode("utf-8") if info else ""
    except (zipfile.BadZipFile, tarfile.TarError, UnicodeDecodeError) as exc:
        raise IntegrityError(f"{path.name}: not a readable Python distribution ({exc})") from None
    if not text:
        raise IntegrityError(f"{path.name}: no METADATA or PKG-INFO in it (not a Python distribution)")
    return email.parser.Parser().parsestr(text, headersonly=True).get_all("Requires-Dist") or []


def te_requirements(lock: Lock, files: list[Path]) -> list[tuple[str, list[str]]]:
    """Each [[te]] pin with the Requires-Dist lines of its file (FILES, in the lock's order): what
    coverage.te_uncovered checks."""
    return [(a.pin, requirements_of(path)) for a, path in zip(lock.te, files)]


def _pip_cert() -> str | None:
    """The CA bundle pip is configured with ($PIP_CERT, else pip's global.cert), if any."""
    if os.environ.get("PIP_CERT"):
        return os.environ["PIP_CERT"]
    res = run([sys.executable, "-m", "pip", "config", "get", "global.cert"], check=False)
    return (res.stdout.strip() or None) if res.ok else None


def _sdist_by_link(a: Artifact, dest: Path) -> Path:
    """A source distribution pip can find but not download here: ``pip download`` prepares its metadata
    first, and the TE torch extension's setup.py parses torch's CUDA version (None with a CPU torch), so
    it fails on the staging machine. pip still resolves the file's link with the index, extra indexes,
    find-links and certificate it is configured with, and ``-vv`` names it ("Found link"); the file is
    fetched from that link into DEST under the name the link gives (the caller checks name and sha256)."""
    scratch = dest / ".link-probe"
    shutil.rmtree(scratch, ignore_errors=True)
    res = run([sys.executable, "-m", "pip", "download", "-vv", "--no-deps", "--no-binary=:all:", "--no-build-isolation",
               "--disable-pip-version-check", "--no-input", "--progress-bar", "off", "--dest", str(scratch), a.pin],
              check=False)
    shutil.rmtree(scratch, ignore_errors=True)
    # The file name of A's version, whatever separators the index uses (antlr4-python3-runtime-4.9.3.tar.gz,
    # transformer_engine_torch-2.20.2.tar.gz). An index link ends at a space, a find-links one at ", version".
    stem = r"[-_.]".join(re.escape(w) for w in re.split(r"[-_.]+", a.name)) + "-" + re.escape(a.version)
    found = re.search(rf"Found link (\S+?/({stem}\.(?:tar\.gz|zip)))(?:#[^\s,]*)?[\s,]", f"{res.stdout}\n{res.stderr}",
                      re.IGNORECASE)
    if not found:
        tail = " ".join((res.stderr or res.stdout).strip().splitlines()[-2:])
        raise SourceError(f"{a.pin}: pip found no link to a source distribution of it: {tail}",
                          hint="check access to the package index (the stage runs where it is reachable)")
    url, path = found.group(1), dest / found.group(2)
    cafile = _pip_cert()
    ctx = ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()
    part = path.with_name(path.name + ".part")
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=300) as resp, open(part, "wb") as out:
            shutil.copyfileobj(resp, out)
    except OSError as exc:
        part.unlink(missing_ok=True)
        raise SourceError(f"{a.pin}: downloading {path.name} failed: {exc}") from None
    return part.rename(path)


def build_sdist(sdist: Path, a: Artifact, out: Path) -> Path:
    """A pure-Python sdist built into a wheel with this machine's pip (setuptools needed)."""
    out.mkdir(parents=True, exist_ok=True)
    res = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--disable-pip-version-check",
               "--no-input", "-w", str(out), str(sdist)], check=False)
    built = sorted(out.glob(f"{a.name.replace('-', '_')}-{a.version}-*.whl"))
    if not res.ok or len(built) != 1:
        tail = " ".join((res.stderr or res.stdout).strip().splitlines()[-3:])
        raise SourceError(f"{a.pin}: building a wheel from {sdist.name} failed: {tail}",
                          hint=f"{sys.executable} needs setuptools and wheel to build it")
    if not built[0].name.endswith("-py3-none-any.whl"):
        raise IntegrityError(f"{a.pin}: the build gave {built[0].name}, not a pure-Python wheel")
    return built[0]


def _record_digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _record_path(names: list[str]) -> str:
    recs = [n for n in names if n.endswith(".dist-info/RECORD") and n.count("/") == 1]
    if len(recs) != 1:
        raise IntegrityError(f"a wheel must have one top-level *.dist-info/RECORD, found {len(recs)}")
    return recs[0]


def unpack(wheel: Path, a: Artifact | None, dest: Path) -> dict:
    """WHEEL's files into DEST/<wheel file name>/, minus the drop globs; RECORD checked and trimmed."""
    target = dest / wheel.name
    if target.exists():
        shutil.rmtree(target)
    dropped, kept, dropped_bytes = [], 0, 0
    with zipfile.ZipFile(wheel) as zf:
        names = [i.filename for i in zf.infolist() if not i.is_dir()]
        record_name = _record_path(names)
        rows = list(csv.reader(io.StringIO(zf.read(record_name).decode())))
        listed = {r[0]: r[1] for r in rows if r and r[0] != record_name}
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in zf.infolist()}
        for name in names:
            if name == record_name:
                continue
            if ".." in Path(name).parts or name.startswith("/"):
                raise IntegrityError(f"{wheel.name}: member {name!r} escapes the wheel")
            data = zf.read(name)
            if listed.get(name) and listed[name] != _record_digest(data):
                raise IntegrityError(f"{wheel.name}: {name} does not match its RECORD hash")
            if a is not None and a.dropped(name):
                dropped.append(name)
                dropped_bytes += len(data)
                continue
            out = target / name
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)
            if modes.get(name, 0) & 0o111:
                out.chmod(0o755)  # ray's gcs_server and raylet, console scripts: keep them runnable
            kept += 1
    keep_rows = [r for r in rows if r and r[0] not in set(dropped)]
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(keep_rows)
    (target / record_name).parent.mkdir(parents=True, exist_ok=True)
    (target / record_name).write_text(buf.getvalue())
    return {"file": wheel.name, "files": kept, "dropped_files": len(dropped), "dropped_bytes": dropped_bytes}


def verify_unpacked(folder: Path) -> int:
    """Every file of an unpacked wheel against its RECORD; returns how many were checked."""
    names = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    record_name = _record_path(names)
    rows = list(csv.reader(io.StringIO((folder / record_name).read_text())))
    listed = {r[0]: r[1] for r in rows if r and r[0] != record_name}
    extra = [n for n in names if n != record_name and n not in listed]
    if extra:
        raise IntegrityError(f"{folder.name}: files not in RECORD: {', '.join(extra[:5])}")
    checked = 0
    for name, digest in listed.items():
        path = folder / name
        if not path.is_file():
            raise IntegrityError(f"{folder.name}: {name} is in RECORD but missing")
        if digest and digest != _record_digest(path.read_bytes()):
            raise IntegrityError(f"{folder.name}: {name} does not match its RECORD hash")
        checked += 1
    return checked


def rezip(folder: Path, out_dir: Path) -> Path:
    """The unpacked wheel FOLDER as a wheel file named like the folder, after verify_unpacked."""
    verify_unpacked(folder)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / folder.name
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    record = [p for p in files if p.name == "RECORD" and p.parent.name.endswith(".dist-info")]
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for p in [f for f in files if f not in record] + record:  # RECORD last, as wheels have it
            zf.write(p, p.relative_to(folder).as_posix())
    return out


# -- what the stage does with them (stage.py), and --relock -------------------------------------
def stage_wheels(lk: Lock, cache: Path, dest: Path) -> list[dict]:
    """Every pin fetched and checked, each unpacked into DEST (an sdist built first): what stage.json lists."""
    got = fetch(lk, cache / "wheels")
    built_dir = cache / "built"
    out = []
    for a in lk.wheels:
        info = unpack(got[a.name], a, dest)
        out.append({"name": a.name, "version": a.version, "sha256": a.sha256, "source": "index", **info})
    for a in lk.sdists:
        whl = build_sdist(got[a.name], a, built_dir)
        info = unpack(whl, None, dest)
        out.append({"name": a.name, "version": a.version, "sha256": a.sha256, "source": "built from the sdist",
                    "built_sha256": sha256_file(whl), **info})
    return out


def relock(path: Path, cache: Path) -> list[str]:
    """Re-download every pin for the target platform and write its file name and sha256."""
    lk = load(path)
    changed = []
    tmp = cache / "relock"
    for a in lk.artifacts + lk.te + lk.tests:
        d = tmp / a.name
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        if a in lk.te and is_sdist(a):   # pip cannot prepare its metadata here: by its link (_sdist_by_link)
            got = [_sdist_by_link(a, d)]
        else:
            extra = ["--no-binary=:all:"] if a in lk.sdists else _platform_args(lk)
            res = run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                       "--no-input", "--progress-bar", "off", "--dest", str(d), a.pin, *extra], check=False)
            got = sorted(d.iterdir())
            if not res.ok or len(got) != 1:
                raise SourceError(f"{a.pin}: could not download it for the target: {res.stderr.strip()[-300:]}")
        sha = sha256_file(got[0])
        if (got[0].name, sha) != (a.file, a.sha256):
            changed.append(f"{a.pin}: {got[0].name} {sha[:12]}")
            lk = with_artifact(lk, Artifact(a.name, a.version, got[0].name, sha, a.why, a.drop))
    path.write_text(render(lk))
    return changed
