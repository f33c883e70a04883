"""stage: everything the GPU host needs for the NeMo-RL GRPO run, as ferry parts.

Layout of the payload (``payload.tar.xz`` inside the ``nrl`` ferry):

  wheels/<file>.whl/     the lock's dependency wheels, hash-checked, unpacked (wheels.py)
  context/               the gtp-te219 build context: steps/, wheelhouse/ with the patched
                         megatron-core (cp312) and megatron-bridge wheels, series.json, image.env
                         and the NeMo-RL patches (tools/build_image.py --context-only, in process)
  sources/               the pinned pristine artifacts: the megatron-core and megatron-bridge
                         wheels of series.toml, and nemo-rl.git (a shallow bare clone at the pin)
  fixtures/model/        the Qwen2.5-0.5B-shaped model's config and its tokenizer (chat template); no
                         weights: about 1 GB, they are built from the config and the seed on the GPU host
                         (fixtures.build_weights, run-on-gpu-host's setup)
  fixtures/moe-model/    the MoE case's tiny Qwen3-MoE config and the same tokenizer; weights built there
                         too (moe_fixtures.build_weights)
  fixtures/data/train.jsonl
  fixtures/prompt.txt    NeMo-RL's examples/prompts/cot.txt (the pretrain step's prompt; checked against
                         fixtures.COT_PROMPT)
  stage.json             what is inside and where it came from

TransformerEngine travels separately (the "te" ferry), and so do the upstreams' own tests (the "tests"
ferry, tests_ferry.py, with --tests-source).
"""

from __future__ import annotations

import json
import lzma
import os
import platform
import shutil
import subprocess
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from carry import progress
from carry.errors import SourceError, UsageError
from carry.git import Git
from carry.runner import run
from carry.series.manifest import Series
from carry.workspace.artifacts import fetch_artifact, sha256_file
from carry.workspace.sources import mirror_path

from ..models import fixtures, moe_fixtures
from . import coverage, ferry, tests_ferry, wheel_lock, wheels

HERE = Path(__file__).resolve().parents[2]           # integration/nemo_rl_gtp
HOST_PACKAGES = HERE.parent / "proofs" / "h200-host-packages.txt"   # every distribution on the GPU host, measured
REPO = HERE.parents[1]
LOCK = HERE / "wheels.toml"
FERRY_NAME = "nrl"
IMAGE = "gtp-te219"
HOST_TAG = "cp312"  # the GPU host's Python; the other megatron-core wheels stay here


@dataclass
class Options:
    out: Path                      # the staging folder (payload before packing)
    cache: Path                    # downloads (wheels) and apply's bases
    workdir: Path                  # apply workspaces
    series: Series
    sources: dict[str, Path] = field(default_factory=dict)
    seed: int = 1234
    pack: bool = True
    xz_level: int = 9              # xz preset: 9 the smallest payload, 1 much faster to pack
    te: bool = True                # also the "te" ferry: TransformerEngine's pinned files ([[te]] of the lock)
    part_mib: int = 0              # ferry part size; 0: what fits a call beside the working tree
    tests_sources: dict[str, Path] = field(default_factory=dict)   # also the "tests" ferry (tests_ferry.py)
    ferry_root: Path = REPO
    lock_path: Path = LOCK


def _dir_files(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): sha256_file(p) for p in sorted(root.rglob("*")) if p.is_file()}


def stage_series(o: Options, dest: Path) -> dict:
    """Apply the whole series (it must apply), then the image context with the patched wheels."""
    from carry.images.config import load_image
    from carry.images.context import make_context
    from carry.workspace import apply as applying

    progress.say(f"applying series {o.series.name}")
    rep = applying.apply_series(o.series, applying.Options(workdir=o.workdir, cache=o.cache, sources=dict(o.sources)))
    if not rep.ok:
        raise SourceError(f"series {o.series.name} does not apply: {rep.error}")
    heads = {u.name: {"base": u.base, "base_commit": u.base_commit, "head": u.head} for u in rep.upstreams}
    cfg = load_image(REPO, IMAGE)
    flavor = cfg.flavor("cuda")
    progress.say("writing the gtp-te219 context (patched wheels)")
    ctx = make_context(cfg, flavor, o.series, dest / "context", base=flavor.base, te_version=cfg.te_version,
                              workdir=o.workdir / "image", cache=o.cache)
    house = dest / "context" / "wheelhouse"
    for w in house.glob("megatron_core-*.whl"):
        if f"-{HOST_TAG}-" not in w.name:
            w.unlink()
    (dest / "context" / "Dockerfile").unlink(missing_ok=True)  # no Docker there; the steps are the recipe
    return {"digest": rep.digest, "series_digest": ctx.series_doc["digest"], "upstreams": heads,
            "context_wheels": sorted(w.name for w in house.glob("*.whl"))}


def _nemo_rl_repo(o: Options) -> Path:
    up = o.series.upstream("nemo-rl")
    if "nemo-rl" in o.sources:
        return o.sources["nemo-rl"].expanduser().resolve()
    assert up.git is not None
    mirror = mirror_path(up, o.cache)
    if not mirror.exists():
        raise UsageError("no NeMo-RL repository with the pinned commit here",
                         hint="pass --source nemo-rl=PATH (a checkout that has the pin), as for tools/apply.py")
    return mirror


def stage_sources(o: Options, dest: Path) -> dict:
    """The pristine inputs exactly as series.toml pins them (nightly's --source there)."""
    dest.mkdir(parents=True, exist_ok=True)
    out = {}
    for name in ("megatron-lm", "megatron-bridge"):
        up = o.series.upstream(name)
        assert up.pypi is not None
        art = up.pypi.tree_artifact
        path = fetch_artifact(name, up.pypi, art, o.cache)
        shutil.copy2(path, dest / art.file)
        out[name] = {"file": art.file, "sha256": art.sha256}
    up = o.series.upstream("nemo-rl")
    assert up.git is not None and up.git.commit
    repo = dest / "nemo-rl.git"
    if repo.exists():
        shutil.rmtree(repo)
    run(["git", "init", "-q", "--bare", str(repo)])
    src = _nemo_rl_repo(o)
    g = Git(repo)
    res = g("fetch", "-q", "--depth=1", "--no-tags", f"file://{src}", up.git.commit, check=False)
    if not res.ok:
        raise SourceError(f"nemo-rl: {src} does not give the pinned commit {up.git.commit}: {res.stderr.strip()}",
                          hint="pass --source nemo-rl=PATH with a checkout that has it")
    g("update-ref", "refs/heads/main", up.git.commit)
    g("symbolic-ref", "HEAD", "refs/heads/main")
    g("gc", "-q", "--prune=now")
    out["nemo-rl"] = {"git": "nemo-rl.git", "commit": up.git.commit, "depth": 1}
    return out


def stage_fixtures(o: Options, dest: Path, prompt_file: Path) -> dict:
    prompt = prompt_file.read_text(encoding="utf-8")
    if prompt != fixtures.COT_PROMPT:
        # The pretrain step can run without a NeMo-RL tree from fixtures.COT_PROMPT: it must be this file.
        raise SourceError(f"{prompt_file} differs from fixtures.COT_PROMPT, the copy the pretrain step uses",
                          hint="update COT_PROMPT in integration/nemo_rl_gtp/harness/models/fixtures.py")
    fixtures.build_all(dest, o.seed, prompt)
    moe = moe_fixtures.stage(dest)
    return {**moe, "seed": o.seed, "model": "fixtures/model", "data": "fixtures/data/train.jsonl",
            "prompt": f"fixtures/{fixtures.PROMPT_FILE}",
            "shape": "Qwen/Qwen2.5-0.5B", "weights": "built from config.json and the seed where the run is "
                                                  "(fixtures.build_weights)",
            "prompt_file": "examples/prompts/cot.txt", "files": _dir_files(dest),
            "built_by": {"python": platform.python_version(), "transformers": _version("transformers"),
                         "tokenizers": _version("tokenizers"), "torch": _version("torch")}}


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def compress(src: Path, out: Path, every: float = progress.TICK, level: int = 9) -> Path:
    """src/ as a tar.xz at preset ``level``; the xz binary (multi-threaded) when present, else Python's lzma.

    xz -9 of the payload runs minutes: a line every ``every`` seconds says how far it is.
    """
    if not 0 <= level <= 9:
        raise UsageError(f"xz level {level}: choose 0 to 9")
    members = sorted(p for p in src.rglob("*"))
    tmp = out.with_suffix(".tmp")
    xz = shutil.which("xz")
    total = sum(p.stat().st_size for p in members if p.is_file())
    progress.say(f"compressing {total / 1e6:.0f} MB with {f'xz -{level}' if xz else f'lzma preset {level}'}"
                 f"{' (minutes)' if level >= 6 else ''}")
    done = [0]  # bytes of the members handed to the compressor so far

    def status() -> str:
        written = tmp.stat().st_size if tmp.exists() else 0
        return f"{done[0] / 1e6:.0f} of {total / 1e6:.0f} MB read, {written / 1e6:.0f} MB written"

    def add_all(tf: tarfile.TarFile) -> None:
        for p in members:
            tf.add(p, p.relative_to(src).as_posix(), recursive=False)
            if p.is_file():
                done[0] += p.stat().st_size

    with progress.ticking(f"compressing {out.name}", status, every):
        if xz:
            with open(tmp, "wb") as f:
                proc = subprocess.Popen([xz, f"-{level}", "-T0", "-c"], stdin=subprocess.PIPE, stdout=f)
                assert proc.stdin is not None
                with tarfile.open(fileobj=proc.stdin, mode="w|", format=tarfile.GNU_FORMAT) as tf:
                    add_all(tf)
                proc.stdin.close()
                if proc.wait() != 0:
                    raise SourceError(f"xz failed with exit status {proc.returncode}")
        else:
            with lzma.open(tmp, "wb", preset=level) as f, tarfile.open(fileobj=f, mode="w|", format=tarfile.GNU_FORMAT) as tf:
                add_all(tf)
    os.replace(tmp, out)
    return out


def stage(o: Options) -> dict:
    t0 = time.monotonic()
    lk = wheel_lock.load(o.lock_path)
    payload = o.out / "payload"
    if payload.exists():
        shutil.rmtree(payload)
    payload.mkdir(parents=True)
    doc: dict = {"schema": 1, "ferry": FERRY_NAME, "series": o.series.name,
                 "stage": {"python": platform.python_version(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                 "lock": {"file": str(o.lock_path.relative_to(REPO)) if o.lock_path.is_relative_to(REPO) else o.lock_path.name,
                          "sha256": sha256_file(o.lock_path)}}
    doc["wheels"] = wheels.stage_wheels(lk, o.cache, payload / "wheels")
    doc["series_trees"] = stage_series(o, payload)
    # what NeMo-RL declares at the pin (its tree, applied above), against the stage and the measured host
    coverage.check_nrl_covered(lk, o.workdir / "nemo-rl" / "pyproject.toml", HOST_PACKAGES)
    doc["sources"] = stage_sources(o, payload / "sources")
    prompt = o.workdir / "nemo-rl" / "examples" / "prompts" / "cot.txt"
    doc["fixtures"] = stage_fixtures(o, payload / "fixtures", prompt)
    doc["context_files"] = _dir_files(payload / "context")
    (payload / "stage.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    result = {"ok": True, "payload": str(payload), "stage": doc, "seconds": 0.0}
    if o.pack:
        xz = compress(payload, o.out / "payload.tar.xz", level=o.xz_level)
        manifest = {k: doc[k] for k in ("schema", "ferry", "series", "stage", "lock")}
        manifest.update(series_digest=doc["series_trees"]["series_digest"], payload_sha256=sha256_file(xz),
                        payload_bytes=xz.stat().st_size, wheels=len(doc["wheels"]))
        part_bytes = _part_bytes(o)
        progress.say(f"parts of at most {part_bytes / 2**20:.0f} MiB"
                     + ("" if o.part_mib else " (64 MB a call, less the working tree that travels with each)"))
        parts = ferry.pack(o.ferry_root, FERRY_NAME, xz, manifest, part_bytes)
        result.update(parts=[str(p) for p in parts], part_mb=ferry.sizes_mb(parts),
                      payload_mb=round(xz.stat().st_size / 1e6, 1))
    if o.pack and o.te:
        result.update(stage_te(o, lk))
    if o.pack and o.tests_sources:
        result.update(tests_ferry.stage_tests(o.series, o.tests_sources, o.out / "tests", o.cache, o.ferry_root,
                                              _part_bytes(o), o.xz_level, wheels.fetch_tests(lk, o.cache / "tests-wheels")))
    result["seconds"] = round(time.monotonic() - t0, 1)
    return result


TE_FERRY = "te"


def _part_bytes(o: Options) -> int:
    """A ferry part: --part-mib, else what fits one call beside the working tree."""
    return (o.part_mib * 1024 * 1024) if o.part_mib else ferry.part_bytes_for(o.ferry_root)


def stage_te(o: Options, lk: wheel_lock.Lock) -> dict:
    """The "te" ferry: TransformerEngine's pinned wheels, the torch extension's source and what TE requires
    that the host lacks, hash-checked and checked to cover TE's requirements (coverage.check_te_covered),
    as te/wheels/ (the folder run-on-gpu-host --te reads; images/gtp-te219 step 20 installs from it
    offline and builds the extension there). Not xz-compressed: the wheels are compressed already."""
    files = wheels.fetch_te(lk, o.cache / "te")
    coverage.check_te_covered(lk, wheels.te_requirements(lk, files))
    manifest = {"schema": 1, "ferry": TE_FERRY, "te": [{"name": a.name, "version": a.version, "file": a.file,
                                                        "sha256": a.sha256} for a in lk.te]}
    parts = ferry.pack_files(o.ferry_root, TE_FERRY, {f"wheels/{f.name}": f for f in files}, manifest, _part_bytes(o))
    return {"te_parts": [str(p) for p in parts], "te_part_mb": ferry.sizes_mb(parts),
            "te_mb": round(sum(f.stat().st_size for f in files) / 1e6, 1), "te_files": [f.name for f in files]}
