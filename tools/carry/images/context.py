"""An image's build context: Dockerfile, steps, and a wheelhouse of the patched stack.

The wheelhouse holds the series' patched wheels (``apply --wheels``), the
NeMo-RL patches, ``series.json`` (digest, pins, patch hashes) and
``image.env`` (the build args, for running the steps outside Docker). The
content tag is a hash of all of it plus the base image's id, so an unchanged
input never rebuilds.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..errors import OperationError
from ..series.entries import house_patch_name
from ..series.manifest import Series, file_sha256
from ..series.repo import command
from ..workspace.apply import Options, apply_series
from .config import Flavor, ImageConfig, check_te

TAG_SCHEMA = "gtp-carry-image-1"


@dataclass
class Context:
    dir: Path
    build_args: dict[str, str]
    series_doc: dict
    wheels: list[str]


def _image_env(args: dict[str, str]) -> str:
    lines = ["# The build args of this context, for running the steps outside Docker (run-local.sh)."]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(args.items()) if k != "BASE_IMAGE"]
    return "\n".join(lines) + "\n"


def series_document(series: Series, wheel_versions: dict[str, str], wheels_digest: str) -> dict:
    pins = {}
    for u in series.upstreams:
        pin = {"pin": u.pin_text()}
        if u.git and u.git.commit:
            pin["commit"] = u.git.commit
        pins[u.name] = pin
    return {
        "series": series.name,
        "digest": series.digest(series.patches),
        "wheels_digest": wheels_digest,
        "patches": [{"id": p.id, "upstream": p.upstream, "file": p.file, "status": p.status,
                     "sha256": file_sha256(series.patch_path(p))} for p in series.patches],
        "pins": pins,
        "wheels": wheel_versions,
    }


def make_wheels(series: Series, cfg: ImageConfig, out: Path, workdir: Path, cache: Path) -> tuple[list[Path], str]:
    """tools/apply.py --only <image wheels> --wheels OUT, in process."""
    opts = Options(workdir=workdir, cache=cache, only=list(cfg.wheels), wheels_dir=out)
    rep = apply_series(series, opts)
    if not rep.ok:
        raise OperationError(f"applying series {series.name} failed: {rep.error}",
                             hint=rep.next or f"`{command('apply', series, '--workdir', workdir)}`")
    return [Path(w) for u in rep.upstreams for w in u.wheels], rep.digest


def wheel_versions(wheels: list[Path]) -> dict[str, str]:
    out: dict[str, str] = {}
    for w in wheels:
        dist, version = w.name.split("-")[:2]
        name = dist.replace("_", "-").lower()
        if out.setdefault(name, version) != version:
            raise OperationError(f"wheels of {name} disagree on the version ({out[name]} vs {version})")
    for need in ("megatron-core", "megatron-bridge"):
        if need not in out:
            raise OperationError(f"no {need} wheel was written", hint="check [image] wheels in image.toml")
    return out


def make_context(cfg: ImageConfig, flavor: Flavor, series: Series, ctx_dir: Path, *, base: str,
                 te_version: str, workdir: Path, cache: Path, wheelhouse: Path | None = None) -> Context:
    frontend_floor = check_te(cfg, te_version)
    if ctx_dir.exists():
        shutil.rmtree(ctx_dir)
    house = ctx_dir / "wheelhouse"
    house.mkdir(parents=True)
    shutil.copy2(cfg.root / "Dockerfile", ctx_dir / "Dockerfile")
    shutil.copytree(cfg.root / "steps", ctx_dir / "steps")
    if wheelhouse is not None:
        wheels = [Path(shutil.copy2(w, house / w.name)) for w in sorted(wheelhouse.glob("*.whl"))]
        # "0.19.2+gtp.<digest>": the digest apply put into the local version label.
        wheels_digest = wheel_versions(wheels)["megatron-core"].partition("+")[2].rpartition(".")[2]
    else:
        wheels, wheels_digest = make_wheels(series, cfg, house, workdir, cache)
    for w in wheels:
        w.chmod(0o644)  # readable by whoever runs the image (enroot maps users)
    versions = wheel_versions(wheels)
    doc = series_document(series, versions, wheels_digest)
    nrl = [p for p in series.patches if p.upstream == "nemo-rl"]
    if nrl:
        (house / "nemo-rl").mkdir()
        for i, p in enumerate(nrl, 1):
            shutil.copy2(series.patch_path(p), house / "nemo-rl" / house_patch_name(i, p.id))
    pristine = " ".join(f"{series.upstream(u).pypi.name}=={series.upstream(u).pypi.version}"
                        for u in cfg.wheels if series.upstream(u).pypi)
    args = {
        "BASE_IMAGE": base,
        "GTP_FLAVOR": flavor.name,
        "GTP_VENVS": " ".join(cfg.venvs),
        "GTP_TE_VERSION": te_version,
        "GTP_TE_FLOOR": cfg.te_floor,
        "GTP_CUDNN_FRONTEND_FLOOR": frontend_floor,
        "GTP_TE_CORE": cfg.te_core,
        "NVTE_CUDA_ARCHS": cfg.cuda_archs,
        "MAX_JOBS": str(cfg.max_jobs),
        "GTP_NEMO_RL_DIR": cfg.nemo_rl_dir,
        "GTP_SERIES_DIGEST": doc["digest"],
    }
    if flavor.name == "cpu":
        args.update(GTP_STAND_IN_VENVS=" ".join(flavor.stand_in_venvs), GTP_UV_VERSION=flavor.uv or "",
                    GTP_PRISTINE=pristine)
    (house / "series.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    (house / "image.env").write_text(_image_env(args))
    return Context(ctx_dir, args, doc, [w.name for w in wheels])


def content_tag(ctx: Context, base_id: str, flavor: str) -> str:
    """sha256 over every input: the context's files (Dockerfile, steps, wheels,
    series.json with the series digest and pins, image.env from image.toml),
    the build args and the base image's id."""
    h = hashlib.sha256()
    h.update(json.dumps({"schema": TAG_SCHEMA, "flavor": flavor, "base_id": base_id,
                         "args": ctx.build_args}, sort_keys=True).encode())
    for path in sorted(p for p in ctx.dir.rglob("*") if p.is_file()):
        rel = path.relative_to(ctx.dir).as_posix()
        mode = "x" if os.access(path, os.X_OK) else "-"
        h.update(f"{rel}\0{mode}\0{file_sha256(path)}\n".encode())
    return f"{flavor}-{h.hexdigest()[:20]}"
