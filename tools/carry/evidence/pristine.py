"""What a proof's pristine run must show (carry.evidence.prove): the tree it runs on, and the red it declares.

- The tree: the pristine base plus the patches of its upstream the patch ``requires`` (``pristine_tree``). A
  proof of a patch that builds on another would otherwise meet that other's bug first and be red for it.
- The red: each proof file declares ``PRISTINE_FAILS``, what its failing test bodies fail with there; a red for
  another reason, or from a proof that declares nothing, is no red (``red_for_its_reason``).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from ..files import read_input_text
from ..git import Git
from ..series.manifest import PatchMeta, Series

if TYPE_CHECKING:
    from .outcome import Outcome


# What a proof declares it fails with on the pristine base: a module-level literal of the proof file
# (read with ast: the file is not imported). A string is a regular expression that every failing test
# body's "Type: message" (the innermost exception, a rank's own) must match (re.search). A dict maps a
# test function's name to its regex, or to None for a test that is no proof of the bug (it checks what
# the patch adds: its pristine outcome counts for nothing, it must still pass patched); a test it does
# not name may not fail there.
PRISTINE_FAILS = "PRISTINE_FAILS"


def declared_failure(proof_file: Path) -> str | dict | None:
    """The proof's PRISTINE_FAILS, or None when it declares none (or the file cannot be read)."""
    import ast

    try:
        tree = ast.parse(read_input_text(proof_file))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == PRISTINE_FAILS
                                                for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return None
            return value if isinstance(value, (str, dict)) else None
    return None


def _test_name(nodeid: str) -> str:
    return nodeid.rsplit("::", 1)[-1].split("[", 1)[0]


def red_for_its_reason(outcome: Outcome, proof_file: Path) -> str:
    """Why a pristine ``fail`` is not the red its proof declares ("" when it is): a failing test body
    that is a proof of the bug, and each such body failing with what PRISTINE_FAILS says; a proof that
    declares nothing cannot show it."""
    if outcome.result != "fail":
        return ""
    expected = declared_failure(proof_file)
    if expected is None:
        return f"{proof_file.name} declares no {PRISTINE_FAILS}: what it fails with on the pristine base is unchecked"
    if not outcome.failures:   # a body started and the interpreter died or hung: no exception to compare
        return f"no test body failed with an exception to compare with {PRISTINE_FAILS} ({outcome.detail[:200]})"
    counted = 0
    for nodeid, reason in outcome.failures:
        want = expected if isinstance(expected, str) else expected.get(_test_name(nodeid), "")
        if want is None:
            continue   # declared no proof of the bug: its failure there says nothing
        if not want or not re.search(want, reason):
            return (f"red on the pristine base for another reason: {_test_name(nodeid)}: {reason[:200]} "
                    f"(it declares {want!r})" if want else
                    f"red on the pristine base in {_test_name(nodeid)}, which its {PRISTINE_FAILS} does not name: "
                    f"{reason[:200]}")
        counted += 1
    if not counted:
        return f"only tests its {PRISTINE_FAILS} counts for nothing failed on the pristine base"
    return ""


def prerequisites(series: Series, patch: PatchMeta) -> list[PatchMeta]:
    """The patches of PATCH's own upstream that it requires, directly or not, in series order: its
    proof's pristine run has them (each upstream's other trees are at their patched heads anyway)."""
    wanted, stack = set(), list(patch.requires)
    while stack:
        dep = series.patch(stack.pop())
        if dep.id not in wanted:
            wanted.add(dep.id)
            stack.extend(dep.requires)
    return [p for p in series.patches if p.id in wanted and p.upstream == patch.upstream]


def pristine_tree(series: Series, patch: PatchMeta, base: Path, dest: Path) -> Path:
    """The tree PATCH's proof must fail on: the pristine base, plus the patches PATCH requires (a proof
    of a patch that builds on another would otherwise meet that other's bug first, and be red for it).
    BASE itself when it requires none."""
    needed = prerequisites(series, patch)
    if not needed:
        return base
    if not dest.exists():
        shutil.copytree(base, dest, symlinks=True)
        for dep in needed:
            Git(dest)("apply", "--whitespace=nowarn", str(series.patch_path(dep).resolve()))
    return dest
