"""The proof of nrl-gtp-shim, run red/green here without a NeMo-RL checkout.

The shim's tests are its proof, proofs/nemo_rl/test_gtp_shim.py. The patch adds
``nemo_rl/models/megatron/gtp.py`` whole, and that module imports only the standard library
and megatron.core, so a NeMo-RL "tree" holding just that file (read from the patch) is enough
for the proof to go green against the real pinned megatron-core, and a tree without it must
make it go red: CI runs the proof for real although it cannot fetch NeMo-RL.
"""

from __future__ import annotations

import ast
import sys

from carry.errors import PatchFormatError
from carry.manifest import load
from carry.patchfile import new_file_text
from carry.prove import run_proof
from helpers import SERIES

GTP_MODULE = "nemo_rl/models/megatron/gtp.py"


def _module_text(series) -> str:
    patch = series.patch("nrl-gtp-shim")
    try:
        return new_file_text(series.patch_path(patch), GTP_MODULE)
    except PatchFormatError as exc:
        raise AssertionError(f"nrl-gtp-shim no longer adds {GTP_MODULE} whole: {exc.message}") from None


def test_module_imports_only_stdlib_and_megatron():
    """What lets CI run the proof from the patch alone: the module needs no other NeMo-RL code."""
    tree = ast.parse(_module_text(load(SERIES)))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            roots.add((node.module or "").split(".")[0])
    foreign = roots - set(sys.stdlib_module_names) - {"megatron", "transformer_engine"}
    assert not foreign, f"{GTP_MODULE} imports {sorted(foreign)}: it must stay testable from its patch"


def test_shim_proof_is_red_without_the_module_and_green_with_it(mcore_tree, tmp_path):
    series = load(SERIES)
    patch = series.patch("nrl-gtp-shim")
    assert patch.proofs == ("proofs/nemo_rl/test_gtp_shim.py",)
    pristine = tmp_path / "pristine"
    (pristine / "nemo_rl").mkdir(parents=True)
    patched = tmp_path / "patched"
    (patched / GTP_MODULE).parent.mkdir(parents=True)
    (patched / GTP_MODULE).write_text(_module_text(series))
    logs = tmp_path / "logs"
    red = run_proof(series, patch, {"megatron-lm": mcore_tree, "nemo-rl": pristine}, 900, logs, "pristine")
    green = run_proof(series, patch, {"megatron-lm": mcore_tree, "nemo-rl": patched}, 900, logs, "patched")
    assert red.result == "fail" and f"no {GTP_MODULE}" in red.detail, red
    assert green.result == "pass", (green, (logs / "nrl-gtp-shim.test_gtp_shim.patched.log").read_text()[-3000:])
    assert green.detail.startswith("8 passed") or green.detail == "7 passed, 1 skipped", green
