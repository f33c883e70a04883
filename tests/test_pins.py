"""The real pins: megatron-core 0.19.2 and megatron-bridge 0.6.2 from PyPI,
downloaded once (hash-checked, cached), applied, turned into wheels that pip
installs into a fresh venv."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from carry.workspace.export import format_patch
from carry.git import Git
from helpers import ROOT, SERIES, git, need_python, read_json, tool

pytestmark = pytest.mark.network

PINS_ONLY = "megatron-lm,megatron-bridge"


def _pins_toml() -> str:
    """The real series' [series] and [upstreams] tables, with no patches."""
    text = (SERIES / "series.toml").read_text()
    return text.split("\n[[patches]]")[0].replace('name = "gtp"', 'name = "pins"')


@pytest.fixture
def pin_series(tmp_path, pin_cache):
    """A series on the real pins whose one patch edits a real megatron-core module."""
    work = tmp_path / "w0"
    tool("apply", "--series", "gtp", "--workdir", work, "--cache", pin_cache, "--only", "megatron-lm", "--check",
         check=0)
    # a base workspace of our own to author the patch in
    scratch = tmp_path / "author"
    sdir = tmp_path / "patches" / "pins"
    sdir.mkdir(parents=True)
    (sdir / "series.toml").write_text(_pins_toml())
    tool("apply", "--series", sdir, "--workdir", scratch, "--cache", pin_cache, "--only", "megatron-lm", check=0)
    ws = scratch / "megatron-lm"
    f = ws / "megatron/core/package_info.py"
    f.write_text(f.read_text() + "\nCARRY_MARK = 'patched by the pins test'\n")
    commit = Git(ws).commit_all("pins: mark package_info")
    (sdir / "megatron-lm").mkdir()
    (sdir / "megatron-lm/0001-mark.patch").write_bytes(format_patch(ws, commit))
    (sdir / "series.toml").write_text(_pins_toml() + """
[[patches]]
id = "mark"
upstream = "megatron-lm"
title = "Mark package_info"
file = "megatron-lm/0001-mark.patch"
status = "inappropriate"
owner = "tests"
why = "exercise apply and --wheels on the real pin"
retire_when = "never"
""")
    return sdir


def test_materialise_both_pins_layout_and_report(tmp_path, pin_cache):
    out = tmp_path / "r.json"
    tool("apply", "--series", "gtp", "--workdir", tmp_path / "w", "--cache", pin_cache, "--only", PINS_ONLY,
         "--json", out, check=0)
    doc = read_json(out)
    assert doc["ok"] is True and doc["series"] == "gtp"
    names = [u["name"] for u in doc["upstreams"]]
    assert names == ["megatron-lm", "megatron-bridge"]
    mlm = tmp_path / "w/megatron-lm"
    br = tmp_path / "w/megatron-bridge"
    assert (mlm / "megatron/core/extensions/transformer_engine.py").is_file()
    assert (mlm / "megatron/core/inference/shards.py").is_file()
    assert not list(mlm.rglob("*.so")), "the compiled helper is not source"
    assert (br / "src/megatron/bridge/training/checkpointing.py").is_file()
    assert not (br / "megatron").exists()
    for u in doc["upstreams"]:
        ws = Path(u["workspace"])
        assert u["head"] == git(ws, "rev-parse", "HEAD")
        subjects = git(ws, "log", "--reverse", "--format=%s").splitlines()
        assert subjects[0].startswith("base: ")
        assert len(subjects) == 1 + sum(p["status"] == "applied" for p in u["patches"])
    assert "megatron-core==0.19.2" in doc["upstreams"][0]["base"]
    assert "megatron-bridge==0.6.2" in doc["upstreams"][1]["base"]


def test_second_run_downloads_nothing(tmp_path, pin_cache):
    tool("apply", "--series", "gtp", "--workdir", tmp_path / "w", "--cache", pin_cache, "--only", PINS_ONLY,
         check=0)
    # No network at all for the second run: pip would fail if it were asked.
    res = tool("apply", "--series", "gtp", "--workdir", tmp_path / "w2", "--cache", pin_cache, "--only",
               PINS_ONLY, env={"PIP_INDEX_URL": "http://127.0.0.1:9/", "PIP_NO_INDEX": "1",
                               "HTTPS_PROXY": "http://127.0.0.1:9"}, check=0)
    assert "megatron-lm" in res.stdout


def test_tampered_cache_artifact_is_detected(tmp_path, pin_cache):
    tool("apply", "--series", "gtp", "--workdir", tmp_path / "w", "--cache", pin_cache, "--only", "megatron-bridge",
         check=0)
    cache = tmp_path / "cache"
    shutil.copytree(pin_cache / "artifacts", cache / "artifacts")
    wheel = next((cache / "artifacts").rglob("megatron_bridge-*.whl"))
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 0xFF
    wheel.write_bytes(bytes(data))
    res = tool("apply", "--series", "gtp", "--workdir", tmp_path / "w2", "--cache", cache, "--only",
               "megatron-bridge", check=1)
    assert "sha256" in res.stderr and "megatron-bridge" in res.stderr
    assert not (tmp_path / "w2/megatron-bridge").exists()
    # The hint, run as written, clears the bad copy; the next run downloads the pinned one again.
    rm, again = re.findall(r"`([^`]+)`", res.stderr.split("next:")[1])
    assert rm == f"rm -rf {wheel.parent}"
    subprocess.run(["bash", "-c", rm], check=True)
    assert "--only megatron-bridge" in again and f"--cache {cache}" in again
    subprocess.run(["bash", "-c", again], cwd=ROOT, check=True, capture_output=True)  # the same run, pasted
    assert (tmp_path / "w2/megatron-bridge").is_dir()


def test_unreachable_index_then_again_with_the_wheel(tmp_path, pin_cache):
    """No package index: the hint's --source NAME=PATH, with PATH the pinned wheel, is enough."""
    tool("apply", "--series", "gtp", "--workdir", tmp_path / "w0", "--cache", pin_cache, "--only", "megatron-bridge",
         check=0)
    offline = {"PIP_INDEX_URL": "http://127.0.0.1:9/", "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": "",
               "PIP_NO_INDEX": "1", "HTTPS_PROXY": "http://127.0.0.1:9"}
    args = ["--series", "gtp", "--workdir", tmp_path / "w", "--cache", tmp_path / "empty-cache", "--only",
            "megatron-bridge"]
    res = tool("apply", *args, env=offline, check=1)
    (again,) = re.findall(r"`([^`]+)`", res.stderr.split("next:")[1])
    # The whole command again, with the user's own options, and the one word to fill in.
    argv = shlex.split(again)
    assert argv[1].endswith("tools/apply.py") and argv[-2:] == ["--source", "megatron-bridge=PATH"], again
    assert [str(a) for a in args if str(a) not in argv] == [], again
    wheel = next((pin_cache / "artifacts").rglob("megatron_bridge-0.6.2-*.whl"))
    out = tmp_path / "r.json"
    tool("apply", *argv[2:-1], f"megatron-bridge={wheel}", "--json", out, env=offline, check=0)
    assert "megatron_bridge-0.6.2-py3-none-any.whl" in read_json(out)["upstreams"][0]["base"]


def _pip_accepts(wheel: Path, python: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """pip's own verdict on ``wheel`` for a Python ``python`` (X.Y): may it be installed there?"""
    links = tmp_path / f"links-{wheel.name}"
    links.mkdir()
    shutil.copy2(wheel, links / wheel.name)
    dist, version, *_, abi, plats = wheel.name[:-4].split("-")
    return subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-index",
                           "--find-links", str(links), "--dest", str(tmp_path / f"dl-{wheel.name}"),
                           "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
                           "--abi", abi, *[a for plat in plats.split(".") for a in ("--platform", plat)],
                           f"{dist.replace('_', '-')}=={version}"], capture_output=True, text=True)


def test_wheels_are_only_those_pip_accepts(pin_series, tmp_path, pin_cache):
    """megatron-core 0.19.2 says Requires-Python >=3.12: its cp311 wheel is not written (pip would
    refuse it on 3.11), the report says why, and pip accepts every wheel that is written."""
    out = tmp_path / "r.json"
    wheels = tmp_path / "wheels"
    res = tool("apply", "--series", pin_series, "--workdir", tmp_path / "w", "--cache", pin_cache, "--only",
               "megatron-lm", "--wheels", wheels, "--json", out, check=0)
    up = read_json(out)["upstreams"][0]
    digest = read_json(out)["digest"]
    assert sorted(Path(w).name.split("-")[2] for w in up["wheels"]) == ["cp312", "cp313"]
    (skip,) = up["wheels_skipped"]
    assert f"megatron_core-0.19.2+pins.{digest}-cp311-" in skip["file"]
    assert "'>=3.12'" in skip["reason"] and "3.11" in skip["reason"] and "pip would refuse it" in skip["reason"]
    assert f"no wheel {skip['file']}" in res.stdout
    assert sorted(p.name for p in wheels.iterdir()) == sorted(Path(w).name for w in up["wheels"])
    for w in map(Path, up["wheels"]):
        tag = w.name.split("-")[2]
        accepted = _pip_accepts(w, f"{tag[2]}.{tag[3:]}", tmp_path)
        assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    # The reason is pip's own: the pinned cp311 wheel itself is refused on 3.11.
    original = next((pin_cache / "artifacts").rglob("megatron_core-0.19.2-cp311-*.whl"))
    refused = _pip_accepts(original, "3.11", tmp_path)
    assert refused.returncode != 0 and "requires a different Python" in refused.stdout + refused.stderr


def test_wheel_installs_and_imports(pin_series, tmp_path, pin_cache):
    """The patched wheel for a Python >= 3.12 installs with plain pip (no --ignore-requires-python)
    into a fresh venv of that Python, carries the series' edit and its local version."""
    python = need_python(3, 12, "the patched megatron-core wheels are for 3.12 and 3.13 only (megatron-core says >=3.12)")
    out = tmp_path / "r.json"
    wheels = tmp_path / "wheels"
    tool("apply", "--series", pin_series, "--workdir", tmp_path / "w", "--cache", pin_cache, "--only",
         "megatron-lm", "--wheels", wheels, "--json", out, check=0)
    digest = read_json(out)["digest"]
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "--no-index",
                    "--find-links", str(wheels), f"megatron-core==0.19.2+pins.{digest}"], check=True)
    # package_info.py is plain Python; importing megatron.core itself would need torch in this venv.
    res = subprocess.run([str(py), "-c",
                          "import importlib.metadata as m, runpy; d = m.distribution('megatron-core');"
                          "f = next(f for f in d.files if str(f).endswith('core/package_info.py'));"
                          "print(d.version); print(runpy.run_path(str(f.locate()))['CARRY_MARK']);"
                          "print(f.locate())"],
                         capture_output=True, text=True, check=True, env={**os.environ, "NO_VCS_VERSION": "1"})
    version, mark, where = res.stdout.split("\n")[:3]
    assert version == f"0.19.2+pins.{digest}"
    assert mark == "patched by the pins test"
    assert str(venv) in where
    with zipfile.ZipFile(next(wheels.glob("*-cp312-*.whl"))) as zf:
        names = zf.namelist()
        assert any(n.endswith(".so") for n in names), "untouched members (the compiled helper) are kept"
        record = zf.read(f"megatron_core-0.19.2+pins.{digest}.dist-info/RECORD").decode()
        assert "megatron/core/package_info.py,sha256=" in record
