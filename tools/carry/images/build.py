"""Container images of the patched stack (``images/<name>/``), built for real.

An image folder holds a Dockerfile, ``image.toml`` (its inputs, carry.images.config)
and ``steps/`` (the build logic as scripts that also run outside Docker).
Building means: lay out the build context with the patched wheels
(carry.images.context), derive a content-addressed tag from every input, run
``docker build`` only when no image has that tag yet, and verify the result.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import progress
from ..errors import CommandError
from ..git import Git
from ..runner import run
from ..series.manifest import Series
from ..shell import Raw, code
from .config import (
    BaseImageMissingError,
    Flavor,
    ImageBuildError,
    ImageConfig,
    ImageInputError,
    ImageVerifyError,
    check_te,
    load_image,
)
from .context import Context, content_tag, make_context
from .docker import BuildStep, Docker, export_squashfs

LABEL_NS = "io.gtp-carry"


# -- network settings for pip inside the build (secrets, never layers) -----------------
def _pip_config() -> dict[str, str]:
    """pip's effective settings on this machine: `pip config list`, then PIP_* env."""
    out: dict[str, str] = {}
    try:
        res = run([sys.executable, "-m", "pip", "config", "list"], check=False, timeout=60)
        lines = res.stdout.splitlines() if res.ok else []
    except CommandError:  # no python3/pip, or it hung: no settings to pass on
        lines = []
    for line in lines:
        key, _, value = line.partition("=")
        name = key.split(".", 1)[-1]
        out[name] = value.strip().strip("'\"")
    for env, name in (("PIP_INDEX_URL", "index-url"), ("PIP_EXTRA_INDEX_URL", "extra-index-url"),
                      ("PIP_CERT", "cert")):
        if os.environ.get(env):
            out[name] = os.environ[env]
    return out


def ca_bundle(explicit: str | None) -> Path | None:
    if explicit == "none":
        return None
    if explicit:
        p = Path(explicit)
        if not p.is_file():
            raise ImageInputError(f"--ca-bundle {explicit}: no such file")
        return p
    for cand in (os.environ.get("GTP_CARRY_CA_BUNDLE"), _pip_config().get("cert"),
                 os.environ.get("SSL_CERT_FILE"), os.environ.get("REQUESTS_CA_BUNDLE")):
        if cand and Path(cand).is_file():
            return Path(cand)
    return None


def index_settings() -> dict[str, str]:
    """The package index URLs a container can use (http/https only: file:// mirrors stay on the host)."""
    cfg = _pip_config()
    out = {}
    for name, key in (("index-url", "PIP_INDEX_URL"), ("extra-index-url", "PIP_EXTRA_INDEX_URL")):
        urls = [u for u in cfg.get(name, "").split() if u.startswith(("http://", "https://"))]
        if urls:
            out[key] = " ".join(urls) if key == "PIP_EXTRA_INDEX_URL" else urls[0]
    return out


# -- the build -------------------------------------------------------------------------------
@dataclass
class BuildOptions:
    image: str
    flavor: str
    series: Series
    repo_root: Path
    cache: Path
    workdir: Path
    repository: str | None = None
    tags: list[str] = field(default_factory=list)
    base: str | None = None
    te_version: str | None = None
    wheelhouse: Path | None = None
    squashfs: Path | None = None
    ca_bundle: str | None = None
    log: Path | None = None
    context_dir: Path | None = None


def labels_for(cfg: ImageConfig, flavor: Flavor, ctx: Context, tag: str, base: str, base_id: str,
               revision: str | None) -> dict[str, str]:
    doc = ctx.series_doc
    labels = {
        "org.opencontainers.image.title": f"{cfg.name} ({flavor.name})",
        "org.opencontainers.image.description": cfg.description,
        "org.opencontainers.image.version": tag.split(":")[-1],
        "org.opencontainers.image.created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "org.opencontainers.image.base.name": base,
        "org.opencontainers.image.base.digest": base_id,
        "org.opencontainers.image.vendor": "gtp-carry maintainers",
        f"{LABEL_NS}.image": cfg.name,
        f"{LABEL_NS}.flavor": flavor.name,
        f"{LABEL_NS}.series": doc["series"],
        f"{LABEL_NS}.series.digest": doc["digest"],
        f"{LABEL_NS}.patches": ",".join(p["id"] for p in doc["patches"]),
        f"{LABEL_NS}.pins": json.dumps({k: v["pin"] for k, v in doc["pins"].items()}, sort_keys=True),
        f"{LABEL_NS}.wheels": json.dumps(doc["wheels"], sort_keys=True),
        f"{LABEL_NS}.te.version": ctx.build_args["GTP_TE_VERSION"] if flavor.name == "cuda" else "none",
        f"{LABEL_NS}.te.floor": ctx.build_args["GTP_TE_FLOOR"],
        f"{LABEL_NS}.te.target": ctx.build_args["GTP_TE_VERSION"],
    }
    if revision:
        labels["org.opencontainers.image.revision"] = revision
    return labels


def _git_revision(repo_root: Path) -> str | None:
    """The project's own commit for the revision label (None outside a checkout)."""
    try:
        return Git(repo_root).rev_parse("HEAD")
    except CommandError:
        return None


def build_image(o: BuildOptions) -> dict:
    t0 = time.monotonic()
    cfg = load_image(o.repo_root, o.image)
    flavor = cfg.flavor(o.flavor)
    te_version = o.te_version or cfg.te_version
    check_te(cfg, te_version)
    if o.context_dir is not None:
        ctx = make_context(cfg, flavor, o.series, o.context_dir, base=o.base or flavor.base, te_version=te_version,
                           workdir=o.workdir, cache=o.cache, wheelhouse=o.wheelhouse)
        return {"ok": True, "image": cfg.name, "flavor": flavor.name, "context": str(ctx.dir),
                "build_args": ctx.build_args, "series": ctx.series_doc, "wheels": ctx.wheels,
                "seconds": round(time.monotonic() - t0, 1)}
    docker = Docker()
    server = docker.require()
    base = o.base or flavor.base
    base_id = docker.image_id(base)
    if base_id is None:
        hint = (code("bash", flavor.base_script) if flavor.base_script and not o.base
                else f"load the image and tag it {base} ({code('docker', 'tag', Raw('IMAGE'), base)}), or pass --base")
        raise BaseImageMissingError(f"base image {base!r} of flavour {flavor.name} is not in the engine", hint=hint)
    scratch = Path(tempfile.mkdtemp(prefix=f"gtp-image-{cfg.name}-"))
    try:
        progress.say(f"{cfg.name} ({flavor.name}): preparing the context (patched wheels)")
        ctx = make_context(cfg, flavor, o.series, scratch / "context", base=base, te_version=te_version,
                           workdir=o.workdir, cache=o.cache, wheelhouse=o.wheelhouse)
        repository = o.repository or cfg.name
        tag = f"{repository}:{content_tag(ctx, base_id, flavor.name)}"
        result: dict = {"ok": False, "image": cfg.name, "flavor": flavor.name, "tag": tag, "engine": server,
                        "base": base, "base_id": base_id, "series": ctx.series_doc["series"],
                        "digest": ctx.series_doc["digest"], "wheels": ctx.series_doc["wheels"],
                        "te_version": te_version if flavor.name == "cuda" else None}
        existing = docker.image_id(tag)
        if existing:
            progress.say(f"{tag} exists: nothing to build")
            result.update(built=False, steps=[], image_id=existing)
        else:
            result.update(_run_build(docker, cfg, flavor, ctx, tag, base, base_id, o, scratch))
        for extra in o.tags:
            docker.tag(tag, extra)
        result["tags"] = [tag, *o.tags]
        doc = docker.inspect(tag) or {}
        result["labels"] = (doc.get("Config") or {}).get("Labels") or {}
        result["size"] = doc.get("Size")
        result["verify"] = verify_image(docker, tag, result["labels"])
        if o.squashfs is not None:
            progress.say(f"exporting {tag} to {o.squashfs}")
            result["squashfs"] = export_squashfs(docker, tag, o.squashfs)
        result["ok"] = True
        result["seconds"] = round(time.monotonic() - t0, 1)
        return result
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run_build(docker: Docker, cfg: ImageConfig, flavor: Flavor, ctx: Context, tag: str, base: str,
               base_id: str, o: BuildOptions, scratch: Path) -> dict:
    secrets: dict[str, Path] = {}
    ca = ca_bundle(o.ca_bundle)
    if ca:
        secrets["gtp-ca"] = ca
    index = index_settings()
    if index:
        p = scratch / "index.env"
        p.write_text("".join(f"{k}={v}\n" for k, v in index.items()))
        p.chmod(0o600)
        secrets["gtp-index"] = p
    labels = labels_for(cfg, flavor, ctx, tag, base, base_id, _git_revision(o.repo_root))
    log_file = o.log or (o.cache / "images" / "logs" / f"{tag.replace('/', '_').replace(':', '_')}.log")
    progress.say(f"building {tag} from {base} (log: {log_file})")
    t0 = time.monotonic()

    def on_step(step: BuildStep) -> None:
        progress.say(f"  {step.name[:110]}")

    def on_line(line: str) -> None:
        # The steps' own log lines ("[20-te] ...") are the interesting progress.
        m = re.match(r"^#\d+ \d+(?:\.\d+)? (\[[\w-]+\] .*)$", line)
        if m:
            progress.say(f"    {m.group(1)[:140]}")

    rc, log = docker.build(ctx.dir, tag=tag, build_args=ctx.build_args, labels=labels, secrets=secrets,
                           log_file=log_file, on_step=on_step, on_line=on_line)
    steps = [s.to_dict() for s in log.dockerfile_steps()]
    if rc != 0:
        failed = [s["name"] for s in steps if s["error"]]
        said = [m.group(1) for line in log.tail if (m := re.match(r"^#\d+ [\d.]+ (\[[\w-]+\] error: .*)$", line))]
        raise ImageBuildError(
            f"docker build of {cfg.name} ({flavor.name}) failed" + (f" at {failed[0]}" if failed else "")
            + "".join(f"\n    {line}" for line in (said or log.tail[-10:])),
            hint=f"full log: {log_file}")
    return {"built": True, "steps": steps, "log": str(log_file), "build_seconds": round(time.monotonic() - t0, 1),
            "image_id": docker.image_id(tag)}


def verify_image(docker: Docker, tag: str, labels: dict[str, str]) -> dict:
    """Run the image's verify (its CMD's script) and check its digest against the labels."""
    res = docker.run_rm(tag, "/opt/gtp/steps/90-verify.sh", "--json", "-")
    try:
        report = json.loads(res.stdout)
    except json.JSONDecodeError:
        raise ImageVerifyError(f"{tag}: verify printed no report (exit {res.returncode}): "
                               f"{(res.stderr or res.stdout).strip()[-800:]}") from None
    label_digest = labels.get(f"{LABEL_NS}.series.digest")
    if report.get("digest") != label_digest:
        raise ImageVerifyError(f"{tag}: series digest {report.get('digest')} inside the image differs from "
                               f"its label {label_digest}")
    if not report.get("ok"):
        probs = report.get("problems", []) + [f"{v['venv']}: {p}" for v in report.get("venvs", [])
                                              for p in v.get("problems", [])]
        raise ImageVerifyError(f"{tag}: verify failed: " + "; ".join(probs))
    return report
