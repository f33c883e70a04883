"""Calls from NeMo-RL into megatron-core / Megatron-Bridge that the installed versions cannot take.

    python probe_signatures.py ROOT FILE...      (FILE relative to the NeMo-RL tree ROOT)

NeMo-RL at its pin is written against the Megatron-LM and Megatron-Bridge of its own
submodules; the series runs it on the PyPI releases. Importing catches missing names; this
catches the next kind of mismatch before a GPU does: for every call of a function (or a
module attribute) imported from ``megatron.*`` it checks, against the signature of what is
installed here, each keyword argument and the number of positional ones, and that a called
module attribute exists. Calls on objects (methods of a returned config, say) are not seen.
One JSON line per finding, then a summary line; exit 1 when something was found.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import json
import sys
from pathlib import Path

import probe_imports


def _resolve(mod: str, name: str):
    module = importlib.import_module(mod)
    if hasattr(module, name):
        return getattr(module, name)
    return importlib.import_module(f"{mod}.{name}")  # a submodule not yet loaded as an attribute


def _check(obj, call: ast.Call) -> str | None:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    params = sig.parameters.values()
    if not any(p.kind == p.VAR_KEYWORD for p in params):
        unknown = [k.arg for k in call.keywords if k.arg and k.arg not in sig.parameters]
        if unknown:
            return f"no parameter(s) {', '.join(unknown)}"
    if not inspect.isclass(obj) and not any(p.kind == p.VAR_POSITIONAL for p in params):
        npos = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
        if len(call.args) > npos and not any(isinstance(a, ast.Starred) for a in call.args):
            return f"takes {npos} positional argument(s), given {len(call.args)}"
    return None


def scan(root: Path, rel: str) -> list[dict]:
    tree = ast.parse((root / rel).read_text(), rel)
    imported: dict[str, tuple[str, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "megatron":
            for alias in node.names:
                imported[alias.asname or alias.name] = (node.module, alias.name)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id in imported:
            (mod, name), attr = imported[f.id], None
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in imported:
            (mod, name), attr = imported[f.value.id], f.attr
        else:
            continue
        where = f"{rel}:{node.lineno}"
        what = f"{mod}.{name}" + (f".{attr}" if attr else "")
        try:
            obj = _resolve(mod, name)
        except Exception as exc:  # noqa: BLE001 - reported (the import probe says more)
            found.append({"at": where, "call": what, "problem": f"cannot import: {type(exc).__name__}: {exc}"[:300]})
            continue
        if attr is not None:
            if not inspect.ismodule(obj):
                continue  # a method of a class or object: not followed
            if not hasattr(obj, attr):
                found.append({"at": where, "call": what, "problem": "no such attribute"})
                continue
            obj = getattr(obj, attr)
        problem = _check(obj, node)
        if problem:
            found.append({"at": where, "call": what, "problem": problem})
    return found


def main(argv: list[str]) -> int:
    root, files = Path(argv[0]), argv[1:]
    if importlib.util.find_spec("transformer_engine") is None:
        sys.meta_path.insert(0, probe_imports.FINDER)
    found = []
    for rel in files:
        found += scan(root, rel)
    for f in found:
        print(json.dumps(f))
    print(json.dumps({"summary": True, "files": len(files), "found": len(found)}))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
