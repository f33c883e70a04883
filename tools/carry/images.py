"""Container images of the patched stack (``images/<name>/``), built for real.

An image folder holds a Dockerfile, ``image.toml`` (its inputs) and
``steps/`` (the build logic as scripts that also run outside Docker). Building
means: apply the series and write the patched wheels, lay out a build context
(Dockerfile, steps, wheelhouse/), derive a content-addressed tag from every
input, and run ``docker build`` only when no image has that tag yet.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from . import progress
from .docker import BuildStep, Docker, export_squashfs
from .errors import CommandError, ConfigError, OperationError, UsageError
from .manifest import Series, _suggest, file_sha256
from .runner import Git, run

TAG_SCHEMA = "gtp-carry-image-1"
LABEL_NS = "io.gtp-carry"


# -- typed errors ----------------------------------------------------------------------
class ImageInputError(UsageError):
    """A bad input to an image build (exit 2)."""


class UnknownImageError(ImageInputError):
    pass


class UnknownFlavorError(ImageInputError):
    pass


class BaseImageMissingError(ImageInputError):
    pass


class TEVersionError(ImageInputError):
    """The TE version is below the GTP floor, or has no known cudnn-frontend floor."""


class ImageBuildError(OperationError):
    """docker build failed (a step, or the verify step) -- exit 1."""


class ImageVerifyError(OperationError):
    """The built image does not verify (versions, HAVE_GTP, digest vs labels) -- exit 1."""


# -- image.toml ------------------------------------------------------------------------
@dataclass(frozen=True)
class Flavor:
    name: str
    description: str
    base: str
    base_script: str | None = None
    stand_in_venvs: tuple[str, ...] = ()
    uv: str | None = None


@dataclass(frozen=True)
class ImageConfig:
    name: str
    root: Path
    description: str
    series: str
    wheels: tuple[str, ...]
    venvs: tuple[str, ...]
    nemo_rl_dir: str
    te_version: str
    te_floor: str
    te_core: str
    cuda_archs: str
    max_jobs: int
    cudnn_frontend_floor: dict[str, str]
    flavors: dict[str, Flavor]

    def flavor(self, name: str) -> Flavor:
        if name not in self.flavors:
            raise UnknownFlavorError(f"unknown flavour {name!r} for image {self.name} "
                                     f"(its image.toml has {', '.join(sorted(self.flavors))})",
                                     hint=_suggest(name, list(self.flavors)))
        return self.flavors[name]


def _vtuple(v: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in v.split("+")[0].split("."):
        m = re.match(r"\d+", part)
        if not m:
            break
        out.append(int(m.group()))
        if m.group() != part:
            break
    return tuple(out)


def version_ge(a: str, b: str) -> bool:
    ta, tb = _vtuple(a), _vtuple(b)
    n = max(len(ta), len(tb))
    return ta + (0,) * (n - len(ta)) >= tb + (0,) * (n - len(tb))


def _keys(table: dict, allowed: list[str], where: str, path: Path) -> None:
    for k in table:
        if k not in allowed:
            raise ConfigError(f"{path}: unknown key {k!r} in [{where}]",
                              hint=_suggest(k, allowed) or f"allowed keys: {', '.join(allowed)}")


def _need(table: dict, key: str, kind: type, where: str, path: Path):
    if key not in table:
        raise ConfigError(f"{path}: [{where}] is missing required key {key!r}")
    if not isinstance(table[key], kind):
        raise ConfigError(f"{path}: [{where}] {key} must be {kind.__name__}")
    return table[key]


def load_image(repo_root: Path, name: str) -> ImageConfig:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise UnknownImageError(f"bad image name {name!r}")
    root = repo_root / "images" / name
    path = root / "image.toml"
    if not path.exists():
        known = sorted(p.parent.name for p in (repo_root / "images").glob("*/image.toml"))
        raise UnknownImageError(f"no image {name!r} (no images/{name}/image.toml)",
                                hint=_suggest(name, known) or f"images here: {', '.join(known) or 'none'}")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    _keys(raw, ["image", "te", "flavors"], "<top>", path)
    img = _need(raw, "image", dict, "image", path)
    _keys(img, ["description", "series", "wheels", "venvs", "nemo_rl_dir"], "image", path)
    te = _need(raw, "te", dict, "te", path)
    _keys(te, ["version", "floor", "core", "cuda_archs", "max_jobs", "cudnn_frontend_floor"], "te", path)
    flavors = {}
    for fname, f in _need(raw, "flavors", dict, "flavors", path).items():
        where = f"flavors.{fname}"
        if not isinstance(f, dict):
            raise ConfigError(f"{path}: [{where}] must be a table")
        _keys(f, ["description", "base", "base_script", "stand_in_venvs", "uv"], where, path)
        flavors[fname] = Flavor(fname, f.get("description", ""), _need(f, "base", str, where, path),
                                f.get("base_script"), tuple(f.get("stand_in_venvs", ())), f.get("uv"))
    for required in ("cpu", "cuda"):
        if required not in flavors:
            raise ConfigError(f"{path}: needs a [flavors.{required}] table")
    floors = _need(te, "cudnn_frontend_floor", dict, "te", path)
    return ImageConfig(
        name=name, root=root, description=img.get("description", ""),
        series=_need(img, "series", str, "image", path), wheels=tuple(_need(img, "wheels", list, "image", path)),
        venvs=tuple(_need(img, "venvs", list, "image", path)), nemo_rl_dir=img.get("nemo_rl_dir", "/opt/nemo-rl"),
        te_version=_need(te, "version", str, "te", path), te_floor=_need(te, "floor", str, "te", path),
        te_core=te.get("core", "core_cu13"), cuda_archs=_need(te, "cuda_archs", str, "te", path),
        max_jobs=int(te.get("max_jobs", 8)), cudnn_frontend_floor={str(k): str(v) for k, v in floors.items()},
        flavors=flavors)


def check_te(cfg: ImageConfig, te_version: str) -> str:
    """The cudnn-frontend floor for this TE version; TEVersionError when TE is too old or unknown."""
    if not version_ge(te_version, cfg.te_floor):
        raise TEVersionError(f"TransformerEngine {te_version} is below the GTP floor {cfg.te_floor} "
                             f"(megatron-core sets HAVE_GTP = False below it)",
                             hint=f"use TE >= {cfg.te_floor}: [te] version in images/{cfg.name}/image.toml")
    floor = cfg.cudnn_frontend_floor.get(te_version)
    if floor is None:
        raise TEVersionError(f"no nvidia-cudnn-frontend floor known for TransformerEngine {te_version}",
                             hint=f"add it to [te.cudnn_frontend_floor] in images/{cfg.name}/image.toml "
                                  f"(known: {', '.join(sorted(cfg.cudnn_frontend_floor))})")
    return floor


# -- the build context -------------------------------------------------------------------
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
    from . import apply as applying
    opts = applying.Options(workdir=workdir, cache=cache, only=list(cfg.wheels), wheels_dir=out)
    rep = applying.apply(series, opts)
    if not rep.ok:
        raise OperationError(f"applying series {series.name} failed: {rep.error}",
                             hint=f"python3 tools/apply.py --series {series.name} --workdir {workdir}")
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
            shutil.copy2(series.patch_path(p), house / "nemo-rl" / f"{i:04d}-{p.id}.patch")
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


# -- network settings for pip inside the build (secrets, never layers) -----------------
def _pip_config() -> dict[str, str]:
    """pip's effective settings on this machine: `pip config list`, then PIP_* env."""
    out: dict[str, str] = {}
    try:
        res = run(["python3", "-m", "pip", "config", "list"], check=False, timeout=60)
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
    revision: str | None = None


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
        hint = (f"bash {flavor.base_script}" if flavor.base_script and not o.base
                else f"load the image and tag it {base} (docker tag IMAGE {base}), or pass --base")
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
    labels = labels_for(cfg, flavor, ctx, tag, base, base_id, o.revision or _git_revision(o.repo_root))
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
