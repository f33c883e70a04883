"""A proof folder with a requirements.txt runs in an environment built from it, once, then reused.

As proofs/nemo_rl/ does for NeMo-RL's import dependencies; here a small package the test
extra does not have (inflection) stands for them, so the first build stays quick. The proof
can only pass where that package is importable: in the environment, not in this interpreter.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from fakeup import add_proofs
from helpers import HOST_PACKAGES, SERIES, apply_demo, pins, read_json, tiny_wheel, tool

network = pytest.mark.network
BRIDGE_WHEELS = SERIES.parents[1] / "integration" / "proofs" / "megatron-bridge-py312-wheels.txt"

NEEDS_PACKAGE = '''
import inflection
import megatron.core.alpha as alpha

PRISTINE_FAILS = r"^AssertionError: assert .*'patched'"   # what the pristine base fails with


def test_value_5_is_patched_and_the_package_is_there():
    assert inflection.underscore("ValueFive") == "value_five"
    assert alpha.value_5 == "patched"
'''


@pytest.fixture
def envs(demo, tmp_path):
    assert importlib.util.find_spec("inflection") is None, "this test needs a package the test extra lacks"
    add_proofs(demo["series"], {"needs_package": NEEDS_PACKAGE}, {"clean": "needs_package"},
               SERIES / "proofs" / "pytest.ini")
    (demo["series"] / "proofs" / "megatron_lm" / "requirements.txt").write_text("inflection==0.5.1\n")
    apply_demo(demo, check=0)
    return dict(demo, cache=tmp_path / "cache")


def prove(d, *extra, check=0):
    out = d["tmp"] / "prove.json"
    res = tool("prove", "--series", d["series"], "--workdir", d["work"], "--cache", d["cache"], "--only", "clean",
               "--json", out, *extra, env={"GTP_CARRY_VERBOSE": "1"}, check=check)
    return res, read_json(out) if out.exists() else None


@network
def test_built_once_then_reused(envs):
    res, doc = prove(envs)
    (r,) = doc["proofs"]
    assert (r["pristine"], r["patched"], r["ok"]) == ("fail", "pass", True), r
    assert "building the proof environment" in res.stderr
    (env,) = (envs["cache"] / "proof-envs").iterdir()
    marker = env / ".carry-complete"
    stamp = marker.stat().st_mtime_ns
    res, doc = prove(envs)
    assert doc["proofs"][0]["ok"] is True
    assert "building the proof environment" not in res.stderr and marker.stat().st_mtime_ns == stamp
    # A changed requirements file is another environment.
    (envs["series"] / "proofs" / "megatron_lm" / "requirements.txt").write_text("inflection==0.5.0\n")
    res, doc = prove(envs)
    assert "building the proof environment" in res.stderr and len(list((envs["cache"] / "proof-envs").iterdir())) == 2


@network
def test_a_build_that_cannot_install_is_a_clear_failure(envs):
    (envs["series"] / "proofs" / "megatron_lm" / "requirements.txt").write_text("inflection==0.0.0.999\n")
    # An environment error of the proof (exit 2), not a red proof and not a crash of the command.
    res, doc = prove(envs, check=2)
    (r,) = doc["proofs"]
    assert (r["pristine"], r["patched"], r["ok"]) == ("error", "error", None), r
    assert "could not build the proof environment" in r["pristine_detail"] and "inflection" in r["pristine_detail"]
    assert "ERROR" in res.stdout
    assert not [p for p in (envs["cache"] / "proof-envs").glob("*") if not p.name.startswith(".")]


@network
def test_an_environment_half_built_by_a_killed_run_is_rebuilt(envs):
    env_dir = envs["cache"] / "proof-envs"
    res, doc = prove(envs)
    assert doc["proofs"][0]["ok"] is True
    # A half-made environment (no completion mark: the build was killed) is removed and built again.
    (built,) = env_dir.iterdir()
    (built / ".carry-complete").unlink()
    (built / "half-done").write_text("")
    res, doc = prove(envs)
    assert doc["proofs"][0]["ok"] is True and "building the proof environment" in res.stderr
    assert not (built / "half-done").exists() and (built / ".carry-complete").exists()


def test_the_nemo_rl_folder_pins_its_environment():
    req = (SERIES / "proofs" / "nemo_rl" / "requirements.txt").read_text()
    pins = [line for line in req.splitlines() if line and not line.startswith("#")]
    assert pins and all("==" in line for line in pins), pins
    transformers = next(line for line in pins if line.startswith("transformers=="))
    major, minor = map(int, transformers.split("==")[1].split(".")[:2])
    assert (5, 5) <= (major, minor) < (5, 9), "NeMo-RL at the pin needs transformers >=5.5,<5.9"


ONLY_IN_THE_RUNNING_VENV = '''
import carry_test_only_in_the_running_venv as here
import megatron.core.alpha as alpha

PRISTINE_FAILS = r"^AssertionError: assert .*'patched'"   # what the pristine base fails with


def test_value_5_is_patched_and_the_running_interpreters_package_is_there():
    assert here.WHERE == "the venv that runs prove"
    assert alpha.value_5 == "patched"
'''


def test_the_environment_sees_the_running_interpreters_site_not_its_base(demo, tmp_path):
    """22.3: run from a venv, the proof environment saw the *base* interpreter's site
    (--system-site-packages), which lacked the venv's torch. Here a module only the running venv
    has stands for torch; the requirement (pytest) is already met, so nothing is downloaded."""
    import subprocess
    import sys

    from helpers import TOOLS

    venv = tmp_path / "user-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True)
    purelib = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    (Path(purelib) / "carry_test_only_in_the_running_venv.py").write_text('WHERE = "the venv that runs prove"\n')
    add_proofs(demo["series"], {"venv": ONLY_IN_THE_RUNNING_VENV}, {"clean": "venv"}, SERIES / "proofs" / "pytest.ini")
    (demo["series"] / "proofs" / "megatron_lm" / "requirements.txt").write_text("pytest\n")
    apply_demo(demo, check=0)
    out = tmp_path / "prove.json"
    res = subprocess.run([str(venv / "bin" / "python"), str(TOOLS / "prove.py"), "--series", str(demo["series"]),
                          "--workdir", str(demo["work"]), "--cache", str(tmp_path / "cache"), "--only", "clean",
                          "--json", str(out)], capture_output=True, text=True, timeout=900)
    (r,) = read_json(out)["proofs"]
    assert (r["pristine"], r["patched"], r["ok"]) == ("fail", "pass", True), (r, res.stderr)
    assert res.returncode == 0, res.stderr


def test_the_bridge_folder_pins_what_the_test_extra_holds():
    """The Bridge proof's environment pins its import dependencies at the test extra's versions."""
    import tomllib

    pinned = pins(SERIES / "proofs" / "megatron_bridge" / "requirements.txt")
    assert "omegaconf" in pinned and "datasets" in pinned, pinned
    extra = tomllib.loads((SERIES.parents[1] / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    held = dict(x.split("==") for x in extra if "==" in x)
    for name, version in pinned.items():
        if name in held:
            assert held[name] == version, (name, version, held[name])
    # The wheels staged for an offline GPU host (integration/README.md) carry the same pins.
    staged = pins(BRIDGE_WHEELS)
    for name, version in pinned.items():
        assert staged.get(name) == version, (name, version, staged.get(name))


def test_the_environment_gets_no_pip_of_its_own_where_this_pip_can_install_into_it(tmp_path, monkeypatch):
    """The environment is built --without-pip and this interpreter's pip installs into it (pip's
    --python): ensurepip was most of a build's time. Where this interpreter has no pip, or one older
    than 22.3, the environment gets its own pip as before; that way is built here too, and the
    requirement (pytest, met by this interpreter's site) is there either way."""
    import subprocess
    import sys

    from carry.evidence import proofenv

    req = tmp_path / "requirements.txt"
    req.write_text("pytest\n")
    dest, python = tmp_path / "env", tmp_path / "env" / "bin" / "python"
    for own, ensurepip in (((23, 2), False), ((22, 3), False), ((22, 2), True), (None, True)):
        monkeypatch.setattr(proofenv, "_own_pip", lambda own=own: own)
        venv, pip = proofenv.build_commands(dest, python)
        assert ("--without-pip" not in venv) == ensurepip, (own, venv)
        assert pip == ([str(python), "-m", "pip"] if ensurepip else [sys.executable, "-m", "pip", "--python", str(python)])
    monkeypatch.undo()
    assert proofenv._own_pip() >= proofenv.PIP_PYTHON_OPTION, "this test's Python takes the --without-pip way"
    built = {}
    for way, own in (("own pip", None), ("this pip", proofenv._own_pip())):
        monkeypatch.setattr(proofenv, "_own_pip", lambda own=own: own)
        env_python = proofenv.ensure(req, tmp_path / way)
        has_pip = subprocess.run([str(env_python), "-c", "import pip, sys; print(pip.__file__.startswith(sys.prefix))"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        got = subprocess.run([str(env_python), "-c", "import pytest; print(pytest.__version__)"], capture_output=True,
                             text=True, check=True).stdout.strip()
        built[way] = (has_pip, got)
    import pytest as here

    assert built == {"own pip": ("True", here.__version__), "this pip": ("False", here.__version__)}, built


def test_a_conflict_names_who_wants_what(tmp_path, monkeypatch):
    """Offline, a pin that no wheel beside the host's packages can satisfy: the error says which
    packages want which versions of what (before: only pip's last lines, "ResolutionImpossible",
    and a hint about network access that did not apply)."""
    from carry.evidence import proofenv
    from carry.errors import SourceError

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    tiny_wheel(wheels, "carrytesta", "1.0", ("carrytestc>=2",))
    tiny_wheel(wheels, "carrytestb", "1.0", ("carrytestc<2",))
    tiny_wheel(wheels, "carrytestc", "1.0")
    tiny_wheel(wheels, "carrytestc", "2.0")
    req = tmp_path / "requirements.txt"
    req.write_text("carrytesta==1.0\ncarrytestb==1.0\n")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    with pytest.raises(SourceError) as err:
        proofenv.ensure(req, tmp_path / "cache")
    msg = err.value.message
    assert "carrytesta 1.0 depends on carrytestc>=2" in msg and "carrytestb 1.0 depends on carrytestc<2" in msg, msg
    assert "PIP_FIND_LINKS" in err.value.hint and "network" not in err.value.hint, err.value.hint
    assert not [p for p in (tmp_path / "cache" / "proof-envs").glob("*") if not p.name.startswith(".")]


@network
def test_the_staged_bridge_wheels_hold_what_the_gpu_hosts_pip_wants(tmp_path):
    """The wheel list staged for the offline H200 (integration/README.md) covers what pip installs
    there: the Bridge proof's requirements resolved beside exactly the host's measured packages
    (h200-host-packages.txt, stood in by their dist-info), every version held to the list. Before
    filelock 4.3.1 was listed this failed naming filelock, as the host's pip did (2026-12-01:
    ResolutionImpossible, its filelock 3.32.5 below multi-storage-client's >=4.1)."""
    import json
    import subprocess
    import sys

    from packaging.utils import canonicalize_name

    site_dir = tmp_path / "host-site"
    site_dir.mkdir()
    for name, version in pins(HOST_PACKAGES).items():
        if name == "pip":  # the environment's own pip runs the resolution
            continue
        info = site_dir / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "INSTALLER").write_text("pip\n")
        (info / "RECORD").write_text("")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    # The host's own setuptools stands for it (an older Python's venv brings one of its own; 3.12's none).
    subprocess.run([python, "-m", "pip", "uninstall", "-q", "-y", "setuptools"], capture_output=True)
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    (Path(purelib) / "host-site.pth").write_text(f"import site; site.addsitedir({str(site_dir)!r})\n")
    report = tmp_path / "report.json"
    req = SERIES / "proofs" / "megatron_bridge" / "requirements.txt"
    res = subprocess.run([python, "-m", "pip", "install", "--dry-run", "--quiet", "--disable-pip-version-check",
                          "--only-binary=:all:", "--report", str(report), "-r", str(req), "-c", str(BRIDGE_WHEELS)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    listed = pins(BRIDGE_WHEELS)
    wanted = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    missing = {n: v for n, v in wanted.items() if listed.get(n) != v}
    assert not missing, f"the host's pip would need wheels the staged list lacks: {missing}"
    assert {"datasets", "megatron-energon", "omegaconf"} <= set(wanted), sorted(wanted)
