"""Import NeMo-RL's GRPO + Megatron path in the environment that runs it; one JSON line per module.

Run by the dry-run with the dry-run venv's python (and usable on the GPU host as a preflight):
    python probe_imports.py [--te-placeholder] MODULE...

TransformerEngine cannot load on a machine without a CUDA-capable glibc/driver stack. With
--te-placeholder, the modules that import it unconditionally (megatron.bridge.peft.lora_layers)
get an inert placeholder for their own import statements only; sys.modules never holds it, so
megatron-core still sees TE as absent and takes its non-TE paths. Each module's result says
whether the placeholder was used. Without the flag nothing is stood in for.
"""

from __future__ import annotations

import builtins
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import sys
import traceback

NEEDS_TE = ("megatron.bridge.peft.lora_layers",)
USED: list[str] = []


class _TEPlaceholder(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _TEPlaceholder(name, (), {})

    def __call__(cls, *args, **kwargs):
        raise RuntimeError("TransformerEngine placeholder (dry-run): TE code cannot run here")


class _LocalTE(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in NEEDS_TE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        real = spec.loader.exec_module

        def local_import(mod, globals=None, locals=None, fromlist=(), level=0):
            if level == 0 and mod.split(".")[0] == "transformer_engine":
                USED.append(name)
                return _TEPlaceholder("transformer_engine", (), {})
            return builtins.__import__(mod, globals, locals, fromlist, level)

        def exec_module(module):
            module.__dict__["__builtins__"] = dict(vars(builtins), __import__=local_import)
            real(module)

        spec.loader.exec_module = exec_module
        return spec


def main(argv: list[str]) -> int:
    placeholder = "--te-placeholder" in argv
    mods = [a for a in argv if not a.startswith("--")]
    have_te = importlib.util.find_spec("transformer_engine") is not None
    if placeholder and not have_te:
        sys.meta_path.insert(0, _LocalTE())
    bad = 0
    for m in mods:
        before = len(USED)
        try:
            importlib.import_module(m)
            rec = {"module": m, "ok": True}
        except BaseException as exc:  # noqa: BLE001 - every failure is a finding
            bad += 1
            frames = traceback.extract_tb(exc.__traceback__)[-3:]
            rec = {"module": m, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:400],
                   "where": [f"{f.filename}:{f.lineno}" for f in frames]}
        rec["te_placeholder"] = sorted(set(USED[before:])) or None
        print(json.dumps(rec), flush=True)
    print(json.dumps({"summary": True, "modules": len(mods), "failed": bad, "transformer_engine": have_te}))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
