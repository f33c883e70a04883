"""Import NeMo-RL's GRPO + Megatron path in the environment that runs it; one JSON line per module.

Run by the dry-run with the dry-run venv's python (and usable on the GPU host as a preflight):
    python probe_imports.py [--te-placeholder] [--call MODULE:FUNCTION:ARG]... [--flag MODULE:NAME]... MODULE...

--call runs FUNCTION(ARG) (ARG a string) after the imports and reports whether it raised: what
a worker calls at start, e.g. megatron-core's get_async_strategy("nvrx"), which imports
nvidia-resiliency-ext's async checkpointing for Bridge.

--flag reads the module attribute NAME after the imports and reports its value; it passes when
the value is True: a capability megatron-core decides at import, e.g.
megatron.core.transformer.attention's HAVE_FA4 (FlashAttention-4 importable, and its
distribution new enough), without which the dynamic-batching attention stops.

TransformerEngine cannot load on a machine without a CUDA-capable glibc/driver stack. With
--te-placeholder, the modules that import it unconditionally (megatron.bridge.peft.lora_layers)
get an inert placeholder for their own import statements only; sys.modules never holds it, so
megatron-core still sees TE as absent and takes its non-TE paths. Each module's result says
whether the placeholder was used. Without the flag nothing is stood in for.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import traceback
from pathlib import Path

# The finder lives with the series' CPU proofs (patches/gtp/proofs/_cpu.py), which need the same.
sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "patches" / "gtp" / "proofs"))
from _cpu import BridgeWithoutTE  # noqa: E402

FINDER = BridgeWithoutTE()


def _failure(exc: BaseException) -> dict:
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    text = f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__ or exc.__context__
    if cause is not None:  # a re-raised ImportError hides which module was missing
        text += f" (cause: {type(cause).__name__}: {cause})"
    return {"ok": False, "error": text[:600], "where": [f"{f.filename}:{f.lineno}" for f in frames]}


def main(argv: list[str]) -> int:
    placeholder = "--te-placeholder" in argv
    calls = [argv[i + 1] for i, a in enumerate(argv) if a == "--call"]
    flags = [argv[i + 1] for i, a in enumerate(argv) if a == "--flag"]
    mods = [a for i, a in enumerate(argv) if not a.startswith("--") and (i == 0 or argv[i - 1] not in ("--call", "--flag"))]
    have_te = importlib.util.find_spec("transformer_engine") is not None
    if placeholder and not have_te:
        sys.meta_path.insert(0, FINDER)
    bad = 0
    for m in mods:
        before = len(FINDER.used)
        try:
            importlib.import_module(m)
            rec = {"module": m, "ok": True}
        except BaseException as exc:  # noqa: BLE001 - every failure is a finding
            bad += 1
            rec = {"module": m, **_failure(exc)}
        rec["te_placeholder"] = sorted(set(FINDER.used[before:])) or None
        print(json.dumps(rec), flush=True)
    for spec in calls:
        mod, func, arg = spec.split(":", 2)
        try:
            got = getattr(importlib.import_module(mod), func)(arg)
            rec = {"call": spec, "ok": True, "returned": type(got).__name__, "value": repr(got)[:200]}
        except BaseException as exc:  # noqa: BLE001 - every failure is a finding
            bad += 1
            rec = {"call": spec, **_failure(exc)}
        print(json.dumps(rec), flush=True)
    for spec in flags:
        mod, name = spec.split(":", 1)
        try:
            value = getattr(importlib.import_module(mod), name)
            rec = {"flag": spec, "ok": value is True, "value": repr(value)[:200]}
        except BaseException as exc:  # noqa: BLE001 - every failure is a finding
            rec = {"flag": spec, **_failure(exc)}
        bad += not rec["ok"]
        print(json.dumps(rec), flush=True)
    print(json.dumps({"summary": True, "modules": len(mods), "calls": len(calls), "flags": len(flags), "failed": bad,
                      "transformer_engine": have_te}))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
