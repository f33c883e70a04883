"""The proofs' bytecode cache (tools/carry/evidence/proofsite/carry_bytecode.py): a tree's module
compiles once per content, into the cache and never into the tree; a copy of the tree elsewhere
loads it under its own path; changed source, or a torn cache file, compiles afresh; the
interpreter's own packages keep their own bytecode."""

from __future__ import annotations

import marshal
import os
import subprocess
import sys
from pathlib import Path

from helpers import TOOLS

PROOFSITE = TOOLS / "carry" / "evidence" / "proofsite"

RUN = """
import json, sys, traceback
import carry_bytecode
carry_bytecode.install(sys.argv[1])
import pkg.mod, json as stdlib_json
try:
    pkg.mod.fails()
except ValueError:
    where = traceback.extract_tb(sys.exc_info()[2])[-1].filename
print(json.dumps({"value": pkg.mod.VALUE, "file": pkg.mod.__file__, "co": pkg.mod.fails.__code__.co_filename,
                  "tb": where}))
"""


def _tree(root: Path, value: str) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "mod.py").write_text(f"VALUE = {value!r}\n\n\ndef fails():\n    raise ValueError(VALUE)\n")
    return root


def _run(tree: Path, cache: Path) -> dict:
    import json

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROOFSITE), str(tree)]), "PYTHONDONTWRITEBYTECODE": "1"}
    res = subprocess.run([sys.executable, "-c", RUN, str(cache)], env=env, capture_output=True, text=True, check=True)
    return json.loads(res.stdout)


def _entries(cache: Path) -> dict[str, Path]:
    return {p.name: p for p in cache.rglob("*") if p.is_file()}


def test_a_tree_compiles_once_per_content_and_never_into_itself(tmp_path):
    cache = tmp_path / "cache"
    one = _tree(tmp_path / "one", "source")
    seen = _run(one, cache)
    assert seen["value"] == "source" and seen["co"] == seen["tb"] == str(one / "pkg" / "mod.py")
    entries = _entries(cache)
    assert len(entries) == 2, entries  # pkg/__init__.py and pkg/mod.py; json's bytecode stays its own
    assert not list(one.rglob("__pycache__")), "bytecode was written into the tree"

    # The same bytes elsewhere load from the cache: shown by a cached code object that says so.
    key = next(k for k, p in entries.items() if b"source" in p.read_bytes())
    entries[key].write_bytes(marshal.dumps(compile("VALUE = 'cached'\n\n\ndef fails():\n    raise ValueError(VALUE)\n",
                                                   "elsewhere.py", "exec")))
    two = _tree(tmp_path / "two", "source")
    seen = _run(two, cache)
    assert seen["value"] == "cached", seen
    assert seen["co"] == seen["tb"] == str(two / "pkg" / "mod.py"), seen  # the importing tree's path

    # Other bytes: another key, compiled from the source.
    three = _tree(tmp_path / "three", "edited")
    assert _run(three, cache)["value"] == "edited"
    assert len(_entries(cache)) == 3

    # A torn cache file is compiled again, and replaced whole.
    entries[key].write_bytes(entries[key].read_bytes()[:7])
    assert _run(two, cache)["value"] == "source"
    assert _run(two, cache)["value"] == "source"
    assert not [p for p in cache.rglob("*.tmp")]
