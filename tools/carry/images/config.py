"""An image folder's ``image.toml`` as a frozen dataclass, and the image build's typed errors.

``images/<name>/image.toml`` names the series, the wheels and venvs, the
TransformerEngine version and its floors, and the flavours (cpu, cuda) with
their base images. Unknown keys are errors with a suggestion.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, OperationError, UsageError
from ..files import read_input_text
from ..series.manifest import _suggest


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
        raw = tomllib.loads(read_input_text(path))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:  # tomllib reads nested arrays and tables by recursion
        raise ConfigError(f"{path}: values nested too deeply to read") from None
    except ValueError as exc:  # an integer past Python's digit limit, and the like
        raise ConfigError(f"{path}: a value this tool cannot read ({str(exc).split(';')[0]})") from None
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
