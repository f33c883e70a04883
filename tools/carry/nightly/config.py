"""The nightly matrix (``integration/nightly.toml``) as frozen dataclasses.

Three tables: ``[nightly]`` (which series, default timeout), ``[images.NAME]``
(where a test runs: this machine, a Docker image, a Slurm squashfs) and
``[[tests]]`` (what runs and how it is judged). Unknown keys are errors with a
suggestion, like the series manifest. Strings may use ``${VAR}`` /
``${VAR:-default}`` (expanded when a run is planned, so a missing variable
only matters where it is used) and the placeholders ``{python}``, ``{repo}``,
``{out}``, ``{seed}``, ``{run_id}`` and ``{tree:UPSTREAM}``.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import ConfigError
from ..files import read_input_text
from ..series.manifest import _suggest, _Table
from .judge import Gate, StepMarker, parse_gate, parse_step_marker
from .launch import LAUNCHERS

KINDS = ("functional", "command", "proof", "upstream-tests")
METRIC_SOURCES = ("result-line", "none")  # or "file:RELATIVE/PATH" under {out}


@dataclass(frozen=True)
class TreeMount:
    upstream: str
    subdir: str
    target: str


@dataclass(frozen=True)
class Image:
    name: str
    launcher: str
    description: str = ""
    docker: str | None = None
    squashfs: str | None = None
    workdir: str | None = None
    python: str | None = None
    gpus: int = 0
    env: tuple[str, ...] = ()
    mounts: tuple[str, ...] = ()
    pythonpath: tuple[str, ...] = ()  # upstreams whose trees go first on PYTHONPATH
    tree_mounts: tuple[TreeMount, ...] = ()
    # How this image runs a functional test, when not through run-in-image.sh (an argv with
    # the placeholders, {script} included): e.g. the offline GPU host's own harness.
    functional: tuple[str, ...] = ()

    @property
    def swaps_trees(self) -> bool:
        """Whether tonight's (or a prefix's) trees replace the image's own copies."""
        return bool(self.pythonpath or self.tree_mounts)


@dataclass(frozen=True)
class Spec:
    name: str
    kind: str
    images: tuple[str, ...]
    description: str = ""
    argv: tuple[str, ...] = ()
    script: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    gates: tuple[Gate, ...] = ()
    markers: tuple[str, ...] = ()
    step_markers: tuple[StepMarker, ...] = ()
    watch: tuple[str, ...] = ()
    metrics: str = "none"
    timeout_s: float | None = None
    gpus: int = 0
    bisect: bool = True
    patches: tuple[str, ...] = ()
    # How many steps the run makes (``steps``, else ``--steps N`` in argv): gated series must show
    # steps 1..steps (carry.nightly.judge.gated_steps). None: the series decide.
    steps: int | None = None

    @property
    def watched(self) -> tuple[str, ...]:
        """Metrics checked for bit-identical repeats: ``watch``, else the gated ones."""
        return self.watch or tuple(g.key for g in self.gates)


@dataclass(frozen=True)
class NightlyConfig:
    path: Path
    series: tuple[str, ...]
    images: dict[str, Image]
    tests: tuple[Spec, ...]
    timeout_s: float = 3600.0
    bisect: bool = True
    # [canary]: where each upstream's main comes from (tools/nightly.py --fetch-mains), and its branch.
    mains: dict[str, str] = field(default_factory=dict)
    main_branch: str = "main"

    @property
    def root(self) -> Path:
        return self.path.parent


def load(path: Path) -> NightlyConfig:
    try:
        raw = tomllib.loads(read_input_text(path))
    except FileNotFoundError:
        raise ConfigError(f"no nightly matrix at {path}", hint="pass --config integration/nightly.toml") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:  # tomllib reads nested arrays and tables by recursion
        raise ConfigError(f"{path}: values nested too deeply to read") from None
    except ValueError as exc:  # an integer past Python's digit limit, and the like
        raise ConfigError(f"{path}: a value this tool cannot read ({str(exc).split(';')[0]})") from None
    top = _Table(raw, "<top>", path)
    top.check_keys(["nightly", "images", "tests", "canary"])
    n = _Table(top.get("nightly", dict, required=True), "nightly", path)
    n.check_keys(["series", "timeout_s", "bisect"])
    series = n.strings("series")
    if not series:
        raise ConfigError(f"{path}: [nightly] series must name at least one series")

    images: dict[str, Image] = {}
    for name, data in top.get("images", dict, required=True).items():
        images[name] = _image(_Table(data, f"images.{name}", path), name)

    tests: list[Spec] = []
    for i, data in enumerate(top.get("tests", list, required=True)):
        t = _Table(data, f"tests[{i}]", path)
        spec = _test(t, images)
        if spec.name in [x.name for x in tests]:
            raise ConfigError(f"{path}: two tests are named {spec.name!r}")
        tests.append(spec)
    c = _Table(top.get("canary", dict, {}), "canary", path)
    c.check_keys(["mains", "branch"])
    mains = c.get("mains", dict, {})
    if not all(isinstance(v, str) and v for v in mains.values()):
        raise ConfigError(f"{path}: [canary] mains must map an upstream to its git URL",
                          hint='mains = { megatron-lm = "https://.../Megatron-LM.git" }')
    return NightlyConfig(path.resolve(), series, images, tuple(tests),
                         float(n.get("timeout_s", (int, float), 3600.0)), n.get("bisect", bool, True),
                         dict(mains), c.get("branch", str, "main"))


def _image(t: _Table, name: str) -> Image:
    t.check_keys(["launcher", "description", "docker", "squashfs", "workdir", "python", "gpus", "env",
                  "mounts", "pythonpath", "tree_mounts", "functional"])
    launcher = t.get("launcher", str, required=True)
    if launcher not in LAUNCHERS:
        raise ConfigError(f"{t.path}: [{t.where}] launcher {launcher!r} is not one of {', '.join(LAUNCHERS)}",
                          hint=_suggest(launcher, LAUNCHERS))
    mounts = []
    for j, raw in enumerate(t.get("tree_mounts", list, [])):
        m = _Table(raw, f"{t.where}.tree_mounts[{j}]", t.path)
        m.check_keys(["upstream", "subdir", "target"])
        mounts.append(TreeMount(m.get("upstream", str, required=True), m.get("subdir", str, "."),
                                m.get("target", str, required=True)))
    if mounts and launcher == "local":
        raise ConfigError(f"{t.path}: [{t.where}] tree_mounts need a container launcher",
                          hint="on this machine, put the trees on pythonpath = [...] instead")
    return Image(name, launcher, t.get("description", str, ""), t.get("docker", str, None),
                 t.get("squashfs", str, None), t.get("workdir", str, None), t.get("python", str, None),
                 t.get("gpus", int, 0), t.strings("env"), t.strings("mounts"), t.strings("pythonpath"),
                 tuple(mounts), t.strings("functional"))


def _test(t: _Table, images: dict[str, Image]) -> Spec:
    t.check_keys(["name", "kind", "images", "description", "argv", "script", "env", "gates", "markers",
                  "step_markers", "watch", "metrics", "timeout_s", "gpus", "bisect", "patches", "steps"])
    name = t.get("name", str, required=True)
    t.where = f"{t.where} ({name})"
    kind = t.get("kind", str, required=True)
    if kind not in KINDS:
        raise ConfigError(f"{t.path}: [{t.where}] kind {kind!r} is not one of {', '.join(KINDS)}",
                          hint=_suggest(kind, KINDS))
    on = t.strings("images")
    if not on:
        raise ConfigError(f"{t.path}: [{t.where}] needs images = [...] (where it runs)")
    for img in on:
        if img not in images:
            raise ConfigError(f"{t.path}: [{t.where}] names an unknown image {img!r}",
                              hint=_suggest(img, images) or f"declare [images.{img}]")
    env = t.get("env", dict, {})
    if not all(isinstance(v, str) for v in env.values()):
        raise ConfigError(f"{t.path}: [{t.where}] env values must be strings")
    metrics = t.get("metrics", str, "none")
    if metrics not in METRIC_SOURCES and not metrics.startswith("file:"):
        raise ConfigError(f"{t.path}: [{t.where}] metrics must be result-line, none or file:PATH")
    gates, markers, step_markers = _checks(t, kind)
    spec = Spec(
        name=name, kind=kind, images=on, description=t.get("description", str, ""),
        argv=t.strings("argv"), script=t.get("script", str, None), env=tuple(sorted(env.items())),
        gates=gates, markers=markers, step_markers=step_markers,
        watch=t.strings("watch"), metrics=metrics, timeout_s=t.get("timeout_s", (int, float), None),
        gpus=t.get("gpus", int, 0), bisect=t.get("bisect", bool, True), patches=t.strings("patches"),
        steps=_steps(t))
    if kind == "command" and not spec.argv:
        raise ConfigError(f"{t.path}: [{t.where}] a command test needs argv = [...]")
    if kind == "functional" and not spec.script:
        raise ConfigError(f"{t.path}: [{t.where}] a functional test needs script = \"tests/functional/...sh\"")
    if kind == "functional" and spec.metrics == "none":
        spec = replace(spec, metrics="file:metrics.json")
    if kind in ("proof", "upstream-tests"):
        for img in on:
            if images[img].launcher != "local":
                raise ConfigError(f"{t.path}: [{t.where}] {kind} cells run on this machine: image {img!r} is not local")
    return spec


def _steps(t: _Table) -> int | None:
    """The run's step count: ``steps = N``, else the value of ``--steps N`` / ``--steps=N`` in argv."""
    steps = t.get("steps", int, None)
    if isinstance(steps, bool):
        raise ConfigError(f"{t.path}: [{t.where}] steps must be int, got bool")
    argv = list(t.strings("argv"))
    given = None
    for i, a in enumerate(argv):
        raw = argv[i + 1] if a == "--steps" and i + 1 < len(argv) else a[8:] if a.startswith("--steps=") else None
        if raw is not None:
            if not raw.isdigit():
                return steps  # a placeholder or a variable: only the matrix's own steps can say
            given = int(raw)
    if steps is not None and given is not None and steps != given:
        raise ConfigError(f"{t.path}: [{t.where}] steps = {steps}, but its argv says --steps {given}")
    steps = steps if steps is not None else given
    if steps is not None and steps < 1:
        raise ConfigError(f"{t.path}: [{t.where}] steps = {steps}: a run makes at least one step")
    return steps


def _checks(t: _Table, kind: str) -> tuple[tuple[Gate, ...], tuple[str, ...], tuple[StepMarker, ...]]:
    """Gates, markers and step markers, each able to fail: a command or functional test with
    none would pass on its exit status alone (a proof is judged red/green instead)."""
    try:
        gates = tuple(parse_gate(g) for g in t.strings("gates"))
        step_markers = tuple(parse_step_marker(s) for s in t.strings("step_markers"))
    except ConfigError as exc:
        raise ConfigError(f"{t.path}: [{t.where}] {exc.message}", hint=exc.hint) from None
    markers = t.strings("markers")
    if any(not m.strip() for m in markers):
        raise ConfigError(f"{t.path}: [{t.where}] has an empty marker: it would match every line",
                          hint="a marker is the start of a line the run prints only when it did the work")
    if step_markers and not gates:
        raise ConfigError(f"{t.path}: [{t.where}] step_markers need gates: the steps to check are those "
                          f"the gated metrics show", hint='add gates = [\'max(data["NAME"]) < N\'] on a per-step metric')
    if kind not in ("proof", "upstream-tests") and not gates and not markers:
        raise ConfigError(f"{t.path}: [{t.where}] has neither gates nor markers: it would pass on exit 0 alone",
                          hint='add gates = [\'max(data["NAME"]) < N\'] on its metrics and/or markers = ["the start '
                               'of a line the run prints only when it did the work"]')
    return gates, markers, step_markers


# -- expansion -------------------------------------------------------------------------------
_ENV_RE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}")
_PH_RE = re.compile(r"\{(?P<key>python|repo|out|seed|run_id|script|tree:[a-z0-9-]+)\}")


def expand_env(text: str, where: str, env: dict[str, str] | None = None) -> str:
    env = os.environ if env is None else env

    def sub(m: re.Match) -> str:
        if m["name"] in env:
            return env[m["name"]]
        if m["default"] is not None:
            return m["default"]
        raise ConfigError(f"{where} uses ${{{m['name']}}}, which is not set",
                          hint=f"export {m['name']}=... or use ${{{m['name']}:-default}}")
    return _ENV_RE.sub(sub, text)


def expand(text: str, values: dict[str, str], where: str) -> str:
    """Environment variables first, then placeholders (their values are never re-expanded)."""
    text = expand_env(text, where)

    def sub(m: re.Match) -> str:
        key = m["key"]
        if key not in values:
            what = f"upstream {key[5:]!r}" if key.startswith("tree:") else key
            raise ConfigError(f"{where} uses {{{key}}}, but no {what} is known here")
        return values[key]
    return _PH_RE.sub(sub, text)
