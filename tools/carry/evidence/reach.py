"""Whether a set of proofs reaches torch: the zygote preloads torch's stack only for proofs that do.

The zygote (carry.evidence.zygote) imports torch and what megatron-core pulls in of it, 3.6-6 s on
2 cores, so that every run forked from it has them. A series whose proofs never import torch (a
series of pure-Python fixes, or the test suite's demo upstream) would pay that for nothing at
every prove. ``reaches_torch`` reads, without importing anything, the proof files, the modules of
the proofs folder they import (``_world``, ``_layouts``, ... recursively), and for each tree
package they import, that package's own files: it is True as soon as one of them imports
``torch`` (an ``import`` statement found by ``ast``, or for a tree's files, the words ``import
torch`` / ``from torch``), or when a proof file cannot be parsed (the safe answer). Preloading less
changes no verdict: a run imports what it needs itself, as a fresh interpreter does.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

from ..files import read_input


def _imported_tops(path: Path) -> set[str] | None:
    """Top-level names a Python file imports anywhere in it; None where it does not parse."""
    try:
        tree = ast.parse(read_input(path), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return None
    tops = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            tops.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            tops.add(node.module.split(".")[0])
    return tops


def _mentions_torch(path: Path) -> bool:
    try:
        text = path.read_bytes()
    except OSError:
        return False
    return b"import torch" in text or b"from torch" in text


def _tree_imports_torch(package: Path) -> bool:
    """Whether any file of a tree's package (a folder, or one module file) imports torch."""
    if package.is_file():
        return _mentions_torch(package)
    for root, dirs, files in os.walk(package):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        if any(_mentions_torch(Path(root) / name) for name in files if name.endswith(".py")):
            return True
    return False


def reaches_torch(proof_files: list[Path], proofs_dir: Path, tree_roots: list[Path]) -> bool:
    """See the module's docstring. ``tree_roots``: each tree's import root (where its packages are)."""
    seen: set[Path] = set()
    queue = list(proof_files)
    packages: set[str] = set()
    while queue:
        path = queue.pop()
        if path in seen:
            continue
        seen.add(path)
        tops = _imported_tops(path)
        if tops is None or "torch" in tops:
            return True
        for top in tops:
            local = proofs_dir / f"{top}.py"
            if local.is_file():
                queue.append(local)
            else:
                packages.add(top)
    return any(_tree_imports_torch(path) for top in sorted(packages) for root in tree_roots
               for path in (root / top, root / f"{top}.py") if path.exists())
