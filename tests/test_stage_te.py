"""TransformerEngine for an offline GPU host: the stage's "te" ferry and what the host does with it.

The stage fetches the [[te]] pins of integration/nemo_rl_gtp/wheels.toml (TE's wheels and the torch
extension's source, which only the host can build), checks each sha256 and packs them as the "te"
ferry; on the host, run-on-gpu-host hands the unpacked te/wheels/ to images/gtp-te219's step 20,
with a prebuilt extension when te/ holds one and a build from the source otherwise (that needs nvcc).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import io
from pathlib import Path

import pytest
from helpers import ROOT, tiny_wheel

NRL = ROOT / "integration" / "nemo_rl_gtp"
sys.path.insert(0, str(NRL))

from carry.errors import IntegrityError, SourceError, UsageError  # noqa: E402
from harness.host import setup as hostsetup  # noqa: E402
from harness.staging import coverage, ferry, wheel_lock, wheels  # noqa: E402
from harness.staging import stage as staging  # noqa: E402


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _sdist(path: Path, name: str, version: str, setup_py: str) -> Path:
    """A real source distribution whose setup.py is SETUP_PY (the TE extension's fails without CUDA)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tf:
        for member, text in ((f"{name}-{version}/setup.py", setup_py),
                             (f"{name}-{version}/PKG-INFO", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")):
            data = text.encode()
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def test_the_lock_pins_transformer_engine_for_the_host_with_its_extensions_source():
    """wheels.toml's [[te]]: TE >= the GTP floor (its package and CUDA 13 core), the cuDNN frontend, the
    extension's source (no wheel of it on the index) and pybind11 to build it; canonical as rendered."""
    path = NRL / "wheels.toml"
    lk = wheel_lock.load(path)
    te = {a.name: a for a in lk.te}
    assert {"transformer-engine", "transformer-engine-cu13", "transformer-engine-torch", "nvidia-cudnn-frontend",
            "pybind11"} <= set(te), sorted(te)
    version = tuple(int(x) for x in te["transformer-engine"].version.split(".")[:2])
    assert version >= (2, 19) and len({te[n].version for n in te if n.startswith("transformer-engine")}) == 1
    assert [a.name for a in lk.te if wheel_lock.is_sdist(a)] == ["transformer-engine-torch"]
    assert wheel_lock.render(lk) == path.read_text()


def test_the_te_ferry_carries_the_pinned_files_and_unpacks_where_the_host_reads_them(tmp_path):
    """stage_te with the pins already in the cache (hash-checked, not downloaded again): the te ferry's
    parts, received as on the host, give te/wheels/ with every pinned file and te/manifest.json."""
    cache = tmp_path / "cache"
    (cache / "te").mkdir(parents=True)
    whl = tiny_wheel(cache / "te", "tinyte", "2.20.2", ("tinyte-torch==2.20.2; extra == 'pytorch'",))
    src = _sdist(cache / "te" / "tinyte_torch-2.20.2.tar.gz", "tinyte_torch", "2.20.2", "raise SystemExit(1)\n")
    pins = (wheel_lock.Artifact("tinyte", "2.20.2", whl.name, _sha(whl)),
            wheel_lock.Artifact("tinyte-torch", "2.20.2", src.name, _sha(src)))
    lk = wheel_lock.Lock(tmp_path / "w.toml", "3.12", ("any",), (), (), pins)
    root = tmp_path / "repo"
    root.mkdir()
    o = staging.Options(out=tmp_path / "out", cache=cache, workdir=tmp_path / "w", series=None, sources={}, seed=1,
                        pack=True, part_mib=16, ferry_root=root)
    res = staging.stage_te(o, lk)
    assert res["te_files"] == [whl.name, src.name] and res["te_parts"]
    te = ferry.receive_local(root, "te", tmp_path / "host")   # recv.sh te DEST: DEST/te/
    assert te == tmp_path / "host" / "te"
    assert sorted(p.name for p in (te / "wheels").iterdir()) == sorted([whl.name, src.name])
    assert (te / "wheels" / src.name).read_bytes() == src.read_bytes()
    assert '"tinyte-torch"' in (te / "manifest.json").read_text()
    # Other bytes under a pinned name: refused, and no ferry is written.
    whl.write_bytes(whl.read_bytes() + b"other bytes")
    for part in (root / ".ferry").glob("te.part*"):
        part.unlink()
    with pytest.raises(IntegrityError, match="the lock says"):
        staging.stage_te(o, lk)
    assert not list((root / ".ferry").glob("te.part*"))


@pytest.mark.parametrize("pinned", ["right", "wrong"])
def test_an_extension_source_pip_cannot_prepare_is_fetched_by_its_link_and_hash_checked(tmp_path, monkeypatch, pinned):
    """The TE torch extension's setup.py fails without CUDA, so `pip download` refuses it on a CPU host;
    pip still finds its link (here through find-links, as through an index), and the stage's fetch takes
    the file from that link: with the pinned sha256 it is the one fetched, else it is refused and removed.
    The project's name and the file's may differ in separators (tiny-ext, tiny_ext-1.0.tar.gz)."""
    index = tmp_path / "index"
    src = _sdist(index / "tiny_ext-1.0.tar.gz", "tiny_ext", "1.0",
                 "raise RuntimeError('no CUDA here: the version of torch.version.cuda is None')\n")
    for key, value in (("PIP_CONFIG_FILE", os.devnull), ("PIP_NO_INDEX", "1"), ("PIP_FIND_LINKS", str(index))):
        monkeypatch.setenv(key, value)
    for key in ("PIP_CONSTRAINT", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL"):
        monkeypatch.delenv(key, raising=False)
    refused = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:all:",
                              "--no-build-isolation", "--dest", str(tmp_path / "pip"), "tiny-ext==1.0"],
                             capture_output=True, text=True)
    assert refused.returncode != 0, "pip itself must fail to download it here, or this test shows nothing"
    sha = _sha(src) if pinned == "right" else "0" * 64
    lk = wheel_lock.Lock(tmp_path / "w.toml", "3.12", ("any",), (), (),
                         (wheel_lock.Artifact("tiny-ext", "1.0", src.name, sha),))
    cache = tmp_path / "cache"
    if pinned == "right":
        (got,) = wheels.fetch_te(lk, cache)
        assert got == cache / src.name and got.read_bytes() == src.read_bytes()
    else:
        with pytest.raises(IntegrityError, match="the lock says 0{64}"):
            wheels.fetch_te(lk, cache)
        assert not (cache / src.name).exists(), "a file that is not the pin is not kept in the cache"
    other = wheel_lock.Lock(lk.path, "3.12", ("any",), (), (), (wheel_lock.Artifact("tiny-ext", "2.0", "tiny_ext-2.0.tar.gz", sha),))
    with pytest.raises(SourceError, match="found no link"):
        wheels.fetch_te(other, tmp_path / "cache2")


def test_the_host_builds_the_extension_from_the_source_or_takes_a_prebuilt_one(tmp_path):
    """Step 20's TE arguments: the te ferry's wheels always; a prebuilt extension beside them is taken as
    it is; else the source is built there, which needs nvcc: without it, a clear error, before anything."""
    te = tmp_path / "te"
    with pytest.raises(UsageError, match="the te ferry's wheels"):
        hostsetup.te_args(te, "/usr/local/cuda/bin/nvcc")
    (te / "wheels").mkdir(parents=True)
    with pytest.raises(UsageError, match="neither the TE torch extension's source"):
        hostsetup.te_args(te, "/usr/local/cuda/bin/nvcc")
    (te / "wheels" / "transformer_engine_torch-2.20.2.tar.gz").write_bytes(b"source")
    build = hostsetup.te_args(te, "/usr/local/cuda/bin/nvcc")
    assert build == ["--te-wheelhouse", str(te / "wheels"), "--te-no-deps"]
    with pytest.raises(UsageError, match="no nvcc") as err:
        hostsetup.te_args(te, None)
    assert "CUDA toolkit" in err.value.hint
    (te / hostsetup.TE_SO).write_bytes(b"\x7fELF")
    assert hostsetup.te_args(te, None) == build + ["--te-torch-prebuilt", str(te / hostsetup.TE_SO)]


# What TransformerEngine 2.20.2's own files declare (Requires-Dist of the wheels' METADATA and the
# extension source's PKG-INFO, read from the pinned files on 2026-12-04), and the cuDNN frontend's.
TE_DECLARES = {
    "transformer-engine": ["transformer_engine_cu13==2.20.2; extra == \"core-cu13\"",
                           "transformer_engine_torch==2.20.2; extra == \"pytorch\"", "pydantic",
                           "importlib-metadata>=1.0", "packaging", "pytest>=8.2.1; extra == \"test\""],
    "transformer-engine-cu13": ["importlib-metadata>=1.0", "packaging", "pydantic"],
    "transformer-engine-torch": ["torch>=2.1", "einops", "onnxscript", "onnx", "packaging", "pydantic",
                                 "nvdlfw-inspect", "nvidia-cudnn-frontend>=1.29.0", "transformer_engine_cu13==2.20.2"],
    "nvidia-cudnn-frontend": ["nvidia-cutlass-dsl[cu13]>=4.8.0; sys_platform != \"win32\" or platform_machine != \"ARM64\"",
                              "apache-tvm-ffi>=0.1.11; sys_platform != \"win32\" or platform_machine != \"ARM64\""],
    "pydantic": ["annotated-types>=0.6.0", "pydantic-core==2.50.5", "typing-extensions>=4.16.0",
                 "typing-inspection>=0.4.4", "email-validator>=2.0.0; extra == \"email\""],
    "pydantic-core": ["typing-extensions>=4.14.1"],
    "typing-inspection": ["typing-extensions>=4.12.0"],
    "nvdlfw-inspect": ["pyyaml>=6.0.0", "torch>=2.1.0"],
}


def _as_files(lk: wheel_lock.Lock, folder: Path, declares: dict[str, list[str]]) -> list[Path]:
    """A real distribution file per [[te]] pin, its metadata stating what DECLARES says."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for a in lk.te:
        if wheel_lock.is_sdist(a):
            meta = "".join(f"Requires-Dist: {r}\n" for r in declares.get(a.name, []))
            data = f"Metadata-Version: 2.1\nName: {a.name}\nVersion: {a.version}\n{meta}".encode()
            out.append(folder / a.file)
            with tarfile.open(out[-1], "w:gz") as tf:
                info = tarfile.TarInfo(f"{a.name.replace('-', '_')}-{a.version}/PKG-INFO")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
        else:
            out.append(tiny_wheel(folder, a.name.replace("-", "_"), a.version, tuple(declares.get(a.name, []))))
    return out


def test_the_te_ferry_carries_what_te_requires_that_the_host_lacks(tmp_path):
    """Step 20 installs the te ferry with --no-deps, so each runtime requirement TE's files declare must be
    in [[te]], on the host ([dryrun]) or waived with why ([[te_without]]). The committed lock meets what
    TE 2.20.2 declares; without the pydantic pins (the ferry the H200 setup got on 2026-12-04) it does not."""
    from dataclasses import replace

    lk = wheel_lock.load(NRL / "wheels.toml")
    assert set(TE_DECLARES) <= {a.name for a in lk.te}
    assert coverage.te_uncovered(lk, wheels.te_requirements(lk, _as_files(lk, tmp_path / "a", TE_DECLARES))) == []

    host = {p.partition("==")[0]: p for p in lk.host_packages}
    for drop in ("pydantic", "nvdlfw-inspect", "typing-inspection"):
        less = replace(lk, te=tuple(a for a in lk.te if a.name != drop),
                       host_packages=tuple(p for n, p in host.items() if n != drop))
        found = coverage.te_uncovered(less, wheels.te_requirements(less, _as_files(less, tmp_path / drop, TE_DECLARES)))
        assert found and all(f" requires {drop}" in f for f in found), found
    # A waiver gone: what it covered is named; a version the specifier excludes is named too.
    unwaived = replace(lk, te_without=tuple(w for w in lk.te_without if w.name != "onnx"))
    files = _as_files(lk, tmp_path / "w", TE_DECLARES)
    assert coverage.te_uncovered(unwaived, wheels.te_requirements(unwaived, files)) == [
        "transformer-engine-torch==2.20.2 requires onnx: not in [[te]], not on the host ([dryrun])"]
    # A waiver nothing asks for (the requirement it was for dropped by a new TE): named, not kept silently.
    stale = replace(lk, te_without=lk.te_without + (wheel_lock.Waiver("tensorflow", "never asked for"),))
    assert coverage.te_uncovered(stale, wheels.te_requirements(stale, _as_files(lk, tmp_path / "s", TE_DECLARES))) == [
        "[[te_without]] tensorflow: no [[te]] file requires it"]
    newer = dict(TE_DECLARES, pydantic=["typing-extensions>=9"])
    assert coverage.te_uncovered(lk, wheels.te_requirements(lk, _as_files(lk, tmp_path / "v", newer))) == [
        "pydantic==2.14.4 requires typing-extensions>=9: typing-extensions 4.16.0 is what the ferry and host give"]


def test_stage_refuses_a_te_ferry_that_misses_a_requirement(tmp_path):
    """stage_te checks before it packs: a TE pin whose metadata asks for what nothing provides is a
    named error, and no part is written."""
    cache = tmp_path / "cache"
    (cache / "te").mkdir(parents=True)
    whl = tiny_wheel(cache / "te", "tinyte", "2.20.2", ("pydantic", "einops; python_version < '3'"))
    lk = wheel_lock.Lock(tmp_path / "w.toml", "3.12", ("any",), (), (),
                         (wheel_lock.Artifact("tinyte", "2.20.2", whl.name, _sha(whl)),))
    root = tmp_path / "repo"
    root.mkdir()
    o = staging.Options(out=tmp_path / "out", cache=cache, workdir=tmp_path / "w", series=None, sources={}, seed=1,
                        pack=True, part_mib=16, ferry_root=root)
    from carry.errors import ConfigError
    with pytest.raises(ConfigError, match=r"tinyte==2.20.2 requires pydantic: not in \[\[te\]\]") as err:
        staging.stage_te(o, lk)
    assert "einops" not in str(err.value)   # a marker false for the host's Python: not asked
    assert not list(root.glob(".ferry/te.part*"))
    waived = wheel_lock.Lock(lk.path, "3.12", ("any",), (), (), lk.te,
                             te_without=(wheel_lock.Waiver("pydantic", "the test's host has it"),))
    assert staging.stage_te(o, waived)["te_parts"]


@pytest.mark.parametrize("table, error", [
    ('name = "onnx"', "needs a name and why"),
    ('name = "onnx"\nwhy = ""', "needs a name and why"),
    ('why = "export only"', "needs a name and why"),
    ('name = "onnx"\nwhy = "export only"\nversion = "1"', "unknown key 'version'"),
])
def test_a_waiver_without_its_reason_is_refused(tmp_path, table, error):
    """[[te_without]] holds a requirement the te ferry does without, and why: one without a name or a reason
    (or with a key of another table) is an error naming it, not a silent waiver."""
    path = tmp_path / "wheels.toml"
    path.write_text(f'[target]\npython = "3.12"\nplatforms = []\n\n[[te_without]]\n{table}\n')
    from carry.errors import ConfigError
    with pytest.raises(ConfigError, match=error):
        wheel_lock.load(path)
    path.write_text('[target]\npython = "3.12"\nplatforms = []\n\n[[te_without]]\nname = "onnx"\nwhy = "export only"\n')
    assert wheel_lock.load(path).te_without == (wheel_lock.Waiver("onnx", "export only"),)
