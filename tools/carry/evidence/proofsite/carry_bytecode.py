"""Bytecode for the trees under test, kept by content outside the trees.

A proof imports megatron-core (and Bridge) from a tree prove has just extracted, with
``PYTHONDONTWRITEBYTECODE=1`` (no bytecode is ever left in a tree): so every run compiled every
module it imported from source, and every rank compiled again what it imported lazily. Measured
on 2 cores over the 32 CPU runs (py-spy): 27 of 138 CPU seconds went to ``source_to_code``. The
pristine base and each patched tree differ in a few files only, and proves repeat.

``install(folder)`` puts a path hook in front of the interpreter's own: a source file outside the
interpreter's installation (``sys.prefix``, ``sys.base_prefix``: those have their own
``__pycache__``) gets its code object from ``folder/<sha256>``, the key being a hash of the source
bytes, this interpreter's bytecode magic and its optimisation level. A miss compiles as Python
does (``source_to_code``) and stores the result whole or not at all (a temporary file, then a
rename); a file that does not load (torn, another format) is compiled again. The code object
takes the path of the file it is imported from (``_imp._fix_co_filename``, what importlib does
with a ``.pyc`` moved along with its source), so tracebacks and ``__file__`` are those of the
tree under test, and the module's behaviour is that of its own source: the same bytes compile
to the same code. Nothing is written into the trees.

carry_proof_plugin installs it where ``$CARRY_PROOF_CACHE`` names the prove's cache (every proof
run, from the zygote or fresh); ranks and children forked from the run inherit it. Only the
standard library.
"""

from __future__ import annotations

import _imp
import hashlib
import importlib.machinery as machinery
import importlib.util
import marshal
import os
import sys

_KEY = importlib.util.MAGIC_NUMBER + bytes([sys.flags.optimize])


def _installed_roots() -> tuple[str, ...]:
    roots = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix) if p}
    return tuple(r.rstrip(os.sep) + os.sep for r in roots)


class CachedSourceLoader(machinery.SourceFileLoader):
    folder = ""
    installed: tuple[str, ...] = ()

    def get_code(self, fullname):
        path = self.get_filename(fullname)
        if not self.folder or os.path.realpath(path).startswith(self.installed):
            return super().get_code(fullname)
        source = self.get_data(path)
        key = hashlib.sha256(_KEY + source).hexdigest()
        kept = os.path.join(self.folder, key[:2], key)
        try:
            with open(kept, "rb") as f:
                code = marshal.loads(f.read())
            _imp._fix_co_filename(code, path)
            return code
        except (OSError, EOFError, ValueError, TypeError):
            pass
        code = self.source_to_code(source, path)
        try:
            os.makedirs(os.path.dirname(kept), exist_ok=True)
            staged = f"{kept}.{os.getpid()}.tmp"
            with open(staged, "wb") as f:
                f.write(marshal.dumps(code))
            os.replace(staged, kept)
        except OSError:
            pass  # a cache that cannot be written costs time, never a result
        return code


def install(folder: str) -> None:
    """Serve sources outside the installation from ``folder`` (made if missing); idempotent."""
    CachedSourceLoader.folder = folder
    CachedSourceLoader.installed = _installed_roots()
    if any(getattr(h, "carry_bytecode", False) for h in sys.path_hooks):
        return
    hook = machinery.FileFinder.path_hook(
        (machinery.ExtensionFileLoader, machinery.EXTENSION_SUFFIXES),
        (CachedSourceLoader, machinery.SOURCE_SUFFIXES),
        (machinery.SourcelessFileLoader, machinery.BYTECODE_SUFFIXES),
    )
    hook.carry_bytecode = True
    sys.path_hooks.insert(0, hook)
    # Finders already made for the path's folders would keep the plain loader.
    sys.path_importer_cache.clear()
