"""The real pins: megatron-core 0.19.2 and megatron-bridge 0.6.2 from PyPI,
downloaded once (hash-checked, cached), applied, turned into wheels that pip
installs into a fresh venv."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from carry.export import format_patch
from carry.runner import Git
from helpers import SERIES, git, read_json, tool

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
    (sdir / "megatron-lm/0001-mark.patch").write_text(format_patch(ws, commit))
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
    assert "sha256" in res.stderr and "megatron-bridge" in res.stderr and "delete" in res.stderr
    assert not (tmp_path / "w2/megatron-bridge").exists()


def _fresh_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    py = path / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # torch & co. come from the test interpreter; the package under test only from the wheel.
    Path(purelib, "test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return py


def test_wheels_install_and_import(pin_series, tmp_path, pin_cache):
    out = tmp_path / "r.json"
    wheels = tmp_path / "wheels"
    tool("apply", "--series", pin_series, "--workdir", tmp_path / "w", "--cache", pin_cache, "--only",
         "megatron-lm", "--wheels", wheels, "--json", out, check=0)
    doc = read_json(out)
    built = doc["upstreams"][0]["wheels"]
    assert len(built) == 3  # cp311, cp312, cp313
    digest = doc["digest"]
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    mine = next(Path(w) for w in built if f"-{tag}-" in w)
    assert f"megatron_core-0.19.2+pins.{digest}-" in mine.name
    with zipfile.ZipFile(mine) as zf:
        names = zf.namelist()
        assert any(n.endswith(".so") for n in names), "untouched members (the compiled helper) are kept"
        record = zf.read(f"megatron_core-0.19.2+pins.{digest}.dist-info/RECORD").decode()
        assert "megatron/core/package_info.py,sha256=" in record
    venv = tmp_path / "venv"
    py = _fresh_venv(venv)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
                    "--ignore-requires-python", "--no-index", str(mine)], check=True)
    res = subprocess.run([str(py), "-c",
                          "import importlib.metadata as m, megatron.core.package_info as p, megatron.core as c;"
                          "print(m.version('megatron-core')); print(p.CARRY_MARK); print(c.__file__)"],
                         capture_output=True, text=True, check=True)
    version, mark, where = res.stdout.split("\n")[:3]
    assert version == f"0.19.2+pins.{digest}"
    assert mark == "patched by the pins test"
    assert str(venv) in where
