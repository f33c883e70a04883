"""The shape of the library, checked: what issue 14's redesign promised stays true.

- plumbing (clone a base, git am) lives in carry.workspace.am; carry.workspace.apply is the
  transaction, and a module that imports it takes only apply_series and its Options, under their
  own names;
- every git command goes through carry.git (no ["git", ...] argv elsewhere), whose Git runs it
  with carry.runner, the one subprocess runner;
- one CLI: tools/*.py are shims onto carry.cli, commands live in carry.commands, library
  modules do not import the command line; `gtp-carry` is a console script that works;
- the rooms (the core, carry.series, .workspace, .evidence, .images, .nightly, .commands) import
  one way, as MAY_IMPORT says, and no two modules import each other, even round a circle or
  from inside a function;
- no module over 400 lines and no function over 120, in carry and in integration/*/ (the
  harness, the mini test, the hooks); the lock timeout is written once;
- the committed evidence keeps its files over 20 KB gzipped (integration/README.md), so that the
  checkout stays small.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

from helpers import ROOT, TOOLS

PKG = TOOLS / "carry"
WS = PKG / "workspace"
EVERY = sorted(PKG.rglob("*.py"))
# Everything but the command line: carry.cli and carry.commands (the verbs and their shared options).
LIBRARY = [p for p in EVERY if p.relative_to(PKG).parts[0] != "commands" and p.name != "cli.py"]


def _imports(path: Path) -> list[tuple[str, list[tuple[str, str | None]]]]:
    """(module as written, [(name, asname)]) for each import in a file of the package."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            out.append(("." * node.level + (node.module or ""), [(a.name, a.asname) for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(a.name, [(a.name, a.asname)]) for a in node.names]
    return out


def _resolves_to(path: Path, written: str, target: str) -> bool:
    """Whether an import written in ``path`` names carry.<target>."""
    if not written.startswith("."):
        return written == f"carry.{target}"
    dots = len(written) - len(written.lstrip("."))
    pkg = list(path.relative_to(TOOLS).parent.parts)
    base = pkg[: len(pkg) - (dots - 1)]
    return ".".join(base + [written.lstrip(".")] if written.lstrip(".") else base) == f"carry.{target}"


def test_plumbing_is_in_am_and_apply_is_only_the_transaction():
    def defined(path: Path) -> set[str]:
        return {n.name for n in ast.parse(path.read_text()).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}

    for name in ("am_patches", "am_each", "clone_base", "older_bases"):
        assert name in defined(WS / "am.py") and name not in defined(WS / "apply.py"), name
    assert "apply_series" in defined(WS / "apply.py") and "apply" not in defined(WS / "apply.py")
    importers = []
    for path in EVERY:
        for written, names in _imports(path):
            if _resolves_to(path, written, "workspace.apply"):
                importers.append(path.relative_to(PKG).as_posix())
                assert {n for n, _ in names} <= {"apply_series", "Options"}, (path, names)
                assert all(alias in (None, "ApplyOptions") for _, alias in names), (path, names)
            parent = _resolves_to(path, written, "workspace")
            assert not (parent and any(n == "apply" for n, _ in names)), f"{path} imports the module apply"
    # The modules that run the whole transaction (and nothing else does).
    assert sorted(set(importers)) == ["commands/apply.py", "evidence/retire.py", "images/context.py", "nightly/run.py",
                                      "workspace/trial.py"]


def test_every_git_command_goes_through_carry_git():
    offenders = []
    for path in EVERY:
        if path.name == "git.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.List, ast.Tuple)) and node.elts:
                first = node.elts[0]
                if isinstance(first, ast.Constant) and first.value == "git":
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, offenders


def test_tools_are_shims_and_the_library_does_not_import_the_command_line():
    for script in TOOLS.glob("*.py"):
        code = [line for line in script.read_text().splitlines() if line.strip() and not line.startswith("#")]
        assert len(code) <= 8 and "from carry.cli import run" in code, script
    for path in LIBRARY:
        for written, _ in _imports(path):
            for cli in ("cli", "commands", "commands.options"):
                assert not _resolves_to(path, written, cli), f"{path.relative_to(PKG)} imports carry.{cli}"


# The rooms of carry and the rooms each may import (besides its own). The core is the top level's
# modules; carry.cli imports only the core and reaches the verbs by name (importlib), so that
# nothing imports the command line. A new top-level module or sub-package has to be placed here.
CORE = {"runner", "git", "errors", "files", "lock", "progress", "report", "shell"}
MAY_IMPORT = {
    "core": set(),
    "series": {"core"},
    "workspace": {"core", "series"},
    "evidence": {"core", "series", "workspace"},
    "images": {"core", "series", "workspace"},
    "nightly": {"core", "series", "workspace", "evidence"},
    "commands": {"core", "series", "workspace", "evidence", "images", "nightly"},
    "cli": {"core"},
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(TOOLS).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _room(module: str) -> str:
    """The room of carry.<module...>: a sub-package's name, core, or cli."""
    parts = module.split(".")[1:]
    if not parts:
        return "core"  # the package's own __init__
    if len(parts) == 1 and (parts[0] in CORE or parts[0] == "cli"):
        return "core" if parts[0] in CORE else "cli"
    assert (PKG / parts[0]).is_dir() and parts[0] in MAY_IMPORT, f"carry.{parts[0]} is in no room of MAY_IMPORT"
    return parts[0]


def _carry_imports(path: Path, modules: set[str]) -> list[tuple[int, str]]:
    """(line, carry module) for every import of a carry module in the file, at any depth."""
    name = _module_name(path)
    pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module or ""
            else:
                base = ".".join(pkg[: len(pkg) - (node.level - 1)] + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        out += [(node.lineno, t) for t in targets if t == "carry" or t.startswith("carry.")]
    return out


def test_the_rooms_import_one_way():
    modules = {_module_name(p) for p in EVERY}
    wrong, seen = [], set()
    for path in EVERY:
        if path.parent.name == "proofsite":
            continue  # put on a proof interpreter's path as a folder: it imports nothing of carry
        mine = _room(_module_name(path))
        for line, target in _carry_imports(path, modules):
            theirs = _room(target)
            seen.add((mine, theirs))
            if theirs != mine and theirs not in MAY_IMPORT[mine]:
                wrong.append(f"{path.relative_to(TOOLS)}:{line}: {mine} imports {target} ({theirs})")
    assert not wrong, "imports against the rooms' direction:\n" + "\n".join(wrong)
    # and the table is the real graph, not a looser one: every import it allows is made (a room that
    # stops importing another loses that right here, so the table stays as tight as the code)
    unused = {(r, o) for r, others in MAY_IMPORT.items() for o in others} - seen
    assert not unused, f"MAY_IMPORT allows imports nothing makes: {sorted(unused)}"
    for room in MAY_IMPORT.keys() - {"core", "cli"}:
        doc = ast.get_docstring(ast.parse((PKG / room / "__init__.py").read_text()))
        assert doc and "import" in doc, f"carry.{room} says what it owns and what it may import"


# The house's limits, in carry and in the Python of integration/*/: a module of 400 lines, a function
# of 120 (from its def to its last line, what is nested in it included). A longer function is split
# into named steps (with a dataclass for the state they share, if need be). One that truly cannot be
# split is named here, "path::name" with why; none is.
INTEGRATION = sorted(p for p in (ROOT / "integration").glob("*/**/*.py") if "__pycache__" not in p.parts)
MODULE_LINES, FUNCTION_LINES = 400, 120
LONG_FUNCTIONS: dict[str, str] = {}


def test_no_module_over_400_lines():
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in EVERY + INTEGRATION}
    assert max(sizes.values()) <= MODULE_LINES, sorted(sizes.items(), key=lambda kv: -kv[1])[:3]


def _function_lines(paths: list[Path]) -> dict[str, tuple[int, int]]:
    """"path::name" -> (line of its def, its length in lines), for every function and method."""
    out = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                key = f"{path.relative_to(ROOT).as_posix()}::{node.name}"
                length = node.end_lineno - node.lineno + 1
                out[key] = max(out.get(key, (0, 0)), (node.lineno, length), key=lambda x: x[1])
    return out


def test_no_function_over_120_lines():
    sizes = _function_lines(EVERY + INTEGRATION)
    assert len(INTEGRATION) > 20 and any(k.startswith("integration/gtp_refit_mini/") for k in sizes)
    long = {k: v for k, v in sizes.items() if v[1] > FUNCTION_LINES}
    over = sorted(f"{k} (line {at}): {n} lines" for k, (at, n) in long.items() if k not in LONG_FUNCTIONS)
    assert not over, f"functions over {FUNCTION_LINES} lines (split them into named steps):\n" + "\n".join(over)
    stale = sorted(set(LONG_FUNCTIONS) - set(long))
    assert not stale, f"LONG_FUNCTIONS names functions that are no longer long (or there): {stale}"


def test_the_lock_timeout_is_written_once():
    hits = [p.name for p in EVERY if re.search(r"\b600(\.0)?\b", p.read_text())]
    assert hits == ["lock.py"], hits
    # and every command that takes the work directory's lock lets the user set how long to wait
    for verb in ("apply", "export", "prove"):
        res = subprocess.run([sys.executable, str(TOOLS / f"{verb}.py"), "--help"], capture_output=True, text=True)
        assert "--lock-timeout SECONDS" in res.stdout, verb


def test_the_console_script_runs(tmp_path):
    """pip installs `gtp-carry` from pyproject.toml; it runs the same commands as tools/*.py."""
    # pip builds in the source tree (build/, *.egg-info): build a copy, not the repository.
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy2(ROOT / "pyproject.toml", src / "pyproject.toml")
    shutil.copytree(PKG, src / "tools" / "carry", ignore=shutil.ignore_patterns("__pycache__"))
    # The wheel is built by the interpreter running the tests, with the build backend the test extra
    # installs (setuptools >= 70.1 writes wheels itself). It is installed into a venv that sees nothing
    # else: not this environment, and not the base interpreter's site-packages, whose setuptools may
    # be old or absent (a venv made from a venv takes the base interpreter's).
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
                    "--no-build-isolation", "--no-index", "-w", str(dist), str(src)], check=True, cwd=tmp_path)
    (wheel,) = dist.glob("gtp_carry-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--disable-pip-version-check", "--no-deps", "--no-index", str(wheel)], check=True, cwd=tmp_path)
    exe = venv / "bin" / "gtp-carry"
    res = subprocess.run([str(exe), "--help"], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0 and "apply" in res.stdout and "build-image" in res.stdout
    res = subprocess.run([str(exe), "lint", "--series", str(ROOT / "patches" / "gtp")], capture_output=True,
                         text=True, cwd=tmp_path)
    count = (ROOT / "patches" / "gtp" / "series.toml").read_text().count("\n[[patches]]\n")
    assert res.returncode == 0 and f"series gtp: {count} patch(es), 0 problem(s)" in res.stdout, res.stdout + res.stderr
    res = subprocess.run([str(exe), "apply", "--help"], capture_output=True, text=True, cwd=tmp_path)
    assert res.stdout.startswith("usage: gtp-carry apply")
    res = subprocess.run([str(exe), "aply"], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 2 and "unknown command 'aply'" in res.stderr


def test_exit_codes_are_stated_where_the_code_points():
    from carry import errors

    assert "README.md" in errors.__doc__ and "DESIGN.md" not in errors.__doc__
    readme = (ROOT / "README.md").read_text()
    assert "## Exit codes" in readme
    section = readme.split("## Exit codes")[1].split("\n## ")[0]
    for code in ("0", "1", "2"):
        assert f"`{code}`" in section


def _circles() -> list[list[str]]:
    """The import circles among carry's modules (every import, at any depth: a function-level
    import that closes a circle is a circle too), each as its modules in a cycle order."""
    modules = {_module_name(p) for p in EVERY}
    graph = {_module_name(p): {t for _, t in _carry_imports(p, modules) if t in modules} - {_module_name(p)}
             for p in EVERY if p.parent.name != "proofsite"}
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles_in_carry():
    circles = _circles()
    assert not circles, "modules that import each other (directly or round a circle):\n" + "\n".join(
        " <-> ".join(c) for c in circles)


def test_every_error_class_is_raised():
    """An error class of the carry or its harness is raised somewhere, or is the base of one that is:
    a class nothing raises tells a reader of a failure that cannot happen."""
    files = EVERY + sorted((ROOT / "integration").rglob("*.py"))
    trees = [ast.parse(p.read_text()) for p in files]
    defined, used = {}, set()
    for path, tree in zip(files, trees):
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
                used.update(bases)
                if node.name.endswith("Error") or any(b.endswith(("Error", "Exception")) for b in bases):
                    defined[node.name] = path.relative_to(ROOT).as_posix()
            elif isinstance(node, ast.Call):  # a class handed to what raises it (raise_as(..., SwapError))
                used.update(a.id for a in node.args if isinstance(a, ast.Name))
            elif isinstance(node, ast.Raise) and node.exc is not None:
                exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                used.add(exc.id if isinstance(exc, ast.Name) else getattr(exc, "attr", ""))
    never = sorted(f"{where}: {name}" for name, where in defined.items() if name not in used)
    assert not never, "error classes never raised:\n" + "\n".join(never)


EVIDENCE_PLAIN_BYTES = 20 * 1024


def test_the_committed_evidence_keeps_its_larger_files_gzipped():
    """Each run under integration/h100, h200 and cpu-runs: a file over 20 KB is gzipped (markdown, images
    and scripts apart), or a run's records archive (carry.evidence.records). A checkout of 38 MiB of plain logs
    once left no room beside a device call's 64 MiB."""
    from helpers import git
    tracked = git(ROOT, "ls-files", "integration/h100", "integration/h200", "integration/cpu-runs").splitlines()
    assert len(tracked) > 100, len(tracked)   # the evidence is there to check
    plain = [f for f in tracked if not f.endswith((".gz", ".md", ".png", ".py", ".sh", "/run.tar.xz"))
             and (ROOT / f).stat().st_size > EVIDENCE_PLAIN_BYTES]
    assert not plain, f"gzip these (gzip -n, as the others): {plain[:10]}"


def consoles_in(files: list[str]) -> list[str]:
    """The launches' consoles among FILES (console.log, console.tail.txt, gzipped or not)."""
    return [f for f in files if re.search(r"/launch-[^/]+/console(\.tail)?\.(log|txt)(\.gz)?$", f)]


def evidence_files(root: Path) -> list[str]:
    """The committed evidence's files under ROOT's integration/h100, h200 and cpu-runs, with what each run's
    records archive holds (RUN/run.tar.xz's members named as unpacked, RUN/run/...), so that a check of the
    files sees inside the archives too."""
    from helpers import git
    from carry.evidence.records import FOLDER, members
    tracked = git(root, "ls-files", "integration/h100", "integration/h200", "integration/cpu-runs").splitlines()
    inside = [f"{Path(f).parent}/{FOLDER}/{m}" for f in tracked if f.endswith("/run.tar.xz") for m in members(root / f)]
    return tracked + inside


def test_the_committed_evidence_quotes_no_upstream_source():
    """A launch's console (console.log, console.tail.txt of tools/upstream_tests.py) holds pytest's failure
    reports, which print upstream's test functions whole: the GPU host packs its tail to read there, but it
    is no evidence to commit (the ranks' records hold each outcome and its first error line). 68 such
    logs and tails had been committed with six runs; their READMEs say they are left out."""
    tracked = evidence_files(ROOT)
    assert len(tracked) > 1000, len(tracked)   # the evidence is there to check, the archives' members with it
    consoles = consoles_in(tracked)
    assert not consoles, f"leave out the launches' consoles: {consoles[:10]}"
