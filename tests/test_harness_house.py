"""The shape of the NeMo-RL harness (integration/nemo_rl_gtp/harness), checked as test_house checks
tools/carry: rooms by concept that import one way, as MAY_IMPORT says; every room says what it owns;
no module over 400 lines; no import cycle; the scripts the GPU host's venv runs import nothing of the
harness's other rooms nor of carry. Also checks tests/house_figures.py, which gives the figures
(rooms, floors, circles, the walk of stage's options) on a package written here whose answer is known.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from helpers import ROOT

sys.path.insert(0, str(Path(__file__).resolve().parent))
import house_figures  # noqa: E402

del sys.path[0]

PKG = ROOT / "integration" / "nemo_rl_gtp" / "harness"
EVERY = sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)

# The rooms of the harness and the rooms each may import (besides its own); "cli" is the top-level
# module cli.py, "top" the package's own __init__. A new module at the top level or a new
# sub-package has to be placed here.
MAY_IMPORT = {
    "top": set(),
    "models": set(),
    "probes": set(),
    "staging": {"models"},
    "host": {"models", "staging"},
    "dryrun": {"host", "staging"},
    "cli": {"host", "staging", "dryrun"},
}
SCRIPT_ROOMS = ("models", "probes")   # run by path in the GPU host's (or the stand-in's) venv


def _room(module: str) -> str:
    if module == "":
        return "top"
    first = module.split(".")[0]
    if "." not in module and not (PKG / first).is_dir():
        assert first == "cli", f"harness/{first}.py is in no room of MAY_IMPORT"
        return "cli"
    assert first in MAY_IMPORT, f"harness/{first}/ is in no room of MAY_IMPORT"
    return first


def test_the_rooms_import_one_way():
    mods = house_figures.load(PKG)
    wrong, seen = [], set()
    for name, m in mods.items():
        mine = _room(name)
        for target in m.all_imports:   # at module level and inside functions
            theirs = _room(target)
            seen.add((mine, theirs))
            if theirs != mine and theirs not in MAY_IMPORT[mine]:
                wrong.append(f"{m.path.relative_to(PKG)}: {mine} imports {target} ({theirs})")
    assert not wrong, "imports against the rooms' direction:\n" + "\n".join(sorted(wrong))
    # the table is the real graph, not a looser one
    unused = {(r, o) for r, others in MAY_IMPORT.items() for o in others} - seen
    assert not unused, f"MAY_IMPORT allows imports nothing makes: {sorted(unused)}"
    rooms = {p.parent.name for p in PKG.glob("*/__init__.py")}
    assert rooms == MAY_IMPORT.keys() - {"top", "cli"}, rooms
    for room in rooms:
        doc = ast.get_docstring(ast.parse((PKG / room / "__init__.py").read_text()))
        assert doc and "import" in doc, f"harness/{room} says what it owns and what it may import"
    assert all(r in ast.get_docstring(ast.parse((PKG / "__init__.py").read_text())) for r in rooms)


def test_the_scripts_import_nothing_of_carry_or_other_rooms():
    """models/ and probes/ run by path where carry is not installed (the host's venv)."""
    for room in SCRIPT_ROOMS:
        scripts = sorted((PKG / room).glob("*.py"))
        assert len(scripts) >= 3, f"harness/{room}/ holds its scripts"
        for path in scripts:
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
                assert not [n for n in names if n == "carry" or n.startswith(("carry.", "harness"))], (path, names)
                if isinstance(node, ast.ImportFrom):
                    assert node.level <= 1, f"{path.relative_to(PKG)}:{node.lineno} imports out of its room"


def test_the_models_scripts_run_by_path(tmp_path):
    for script in ("fixtures.py", "moe_fixtures.py", "pretrain.py"):
        res = subprocess.run([sys.executable, str(PKG / "models" / script), "--help"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0 and res.stdout.startswith("usage: "), (script, res.stderr[-500:])


def test_no_module_over_400_lines_and_no_circle():
    sizes = {p.relative_to(PKG).as_posix(): len(p.read_text().splitlines()) for p in EVERY}
    assert max(sizes.values()) <= 400, sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
    assert house_figures.circles(house_figures.load(PKG)) == []


def test_the_figures_of_the_harness():
    got = house_figures.figures(PKG, "cli.stage_main")
    assert got["rooms"] == len(MAY_IMPORT) - 1 and got["circles"] == [] and got["climbs"] == 0
    assert got["largest"]["lines"] <= 400 and got["stops"] > 0 and got["trail"][0].strip() == "staging.wheels.relock"


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_figures_script_counts_what_it_says(tmp_path):
    """A package whose answer is counted by hand: a flat one with a cycle, then the same in two rooms."""
    flat = _write(tmp_path / "flat", {
        "__init__.py": "",
        "cli.py": "import argparse\nfrom . import low\n\n\ndef stage_main(argv):\n"
                  "    a = argparse.ArgumentParser().parse_args(argv)\n"
                  "    x = low.f(a.n)\n    low.g(1)\n    return low.h(x)\n",
        "low.py": "def f(n):\n    return _k(n) + 1\n\n\ndef _k(n):\n    return n\n\n\ndef g(n):\n    return n\n\n\n"
                  "def h(x):\n    from . import up\n    up.back(x)\n\n",
        "up.py": "from . import low\n\n\ndef back(x):\n    print(x)\n",
    })
    got = house_figures.figures(flat, "cli.stage_main")
    # stops: low.f, low._k, low.h, up.back (low.g gets no option); climbs: low -> up (up imports low at
    # module level: floor 1 over low's 0); returns: f and _k hand a value back, h and back do not;
    # crossings: cli->low twice (f, h) and low->up.
    assert {k: got[k] for k in ("rooms", "room_floors", "module_floors", "circles", "stops", "climbs", "returns",
                                "crossings", "room_crossings")} == {
        "rooms": 1, "room_floors": 1, "module_floors": 2, "circles": [["low", "up"]], "stops": 4, "climbs": 1,
        "returns": 2, "crossings": 3, "room_crossings": 0}
    assert got["largest"] == {"module": "low.py", "lines": 16}
    rooms = _write(tmp_path / "rooms", {
        "__init__.py": "", "a/__init__.py": "", "b/__init__.py": "",
        "cli.py": "import argparse\nfrom .b import top\n\n\ndef stage_main(argv):\n"
                  "    a = argparse.ArgumentParser().parse_args(argv)\n    return top.run(a)\n",
        "b/top.py": "from ..a import base\n\n\ndef run(o):\n    return base.f(o.n)\n",
        "a/base.py": "def f(n):\n    return n\n",
    })
    got = house_figures.figures(rooms, "cli.stage_main")
    assert {k: got[k] for k in ("rooms", "room_floors", "circles", "stops", "climbs", "returns", "room_crossings")} \
        == {"rooms": 3, "room_floors": 3, "circles": [], "stops": 2, "climbs": 0, "returns": 2, "room_crossings": 2}
