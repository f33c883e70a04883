"""The shape of the library, checked: what issue 14's redesign promised stays true.

- plumbing (clone a base, git am) lives in carry.workspace.am; carry.workspace.apply is the
  transaction, and a module that imports it takes only apply_series and its Options, under their
  own names;
- every git command goes through carry.runner (no ["git", ...] argv elsewhere);
- one CLI: tools/*.py are shims onto carry.cli, commands live in carry.commands, library
  modules do not import the command line; `gtp-carry` is a console script that works;
- no module over 400 lines; the lock timeout is written once.
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


def test_every_git_command_goes_through_the_runner():
    offenders = []
    for path in EVERY:
        if path.name == "runner.py":
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


def test_no_module_over_400_lines():
    sizes = {p.relative_to(PKG).as_posix(): len(p.read_text().splitlines()) for p in EVERY}
    assert max(sizes.values()) <= 400, sorted(sizes.items(), key=lambda kv: -kv[1])[:3]


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
