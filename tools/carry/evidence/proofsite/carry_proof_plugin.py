"""A pytest plugin carry.evidence.prove loads into every proof (``-p carry_proof_plugin``).

It appends one JSON line per event to the file ``$CARRY_PROOF_EVENTS``:

- ``{"event": "body", "nodeid"}`` as a test body starts: a proof whose interpreter dies or hangs
  after that failed in its body (behaviour); one that dies before any body started never ran;
- ``{"event": "error", "kind", "phase", "nodeid", "reason"}`` for every exception pytest
  reports (collection, setup, body, teardown), with ``kind`` ``environment`` when the proof could
  not run here, else ``behaviour``.

Environment errors: an import of a module that no tree under test provides (the top-level
package is in none of ``$CARRY_PROOF_TREES``; e.g. ``omegaconf``, ``torch``), and torch's
"Cannot re-initialize CUDA in forked subprocess" (a rank started by fork on a GPU host), also
when raised inside a rank (``_world.RankFailed.cause``), and a program that is not on PATH (the
``FileNotFoundError`` subprocess raises for a bare command name such as ``g++``). A missing module that a tree does
provide a package for (``megatron.core.new_module`` on the pristine base) is the tree's
behaviour: the pristine base lacks what the patch adds.

It also ties the proof to prove (``carry_lifeline``): the proof's interpreter dies with its
parent (``$CARRY_PROOF_PARENT``, prove or the zygote it forked from), and so does every process it
forks (its ranks), so a SIGKILL of prove leaves none of them running. ``launcher`` there ties it to
whatever started it (the nightly's run on this machine, slurmstepd for a Slurm job step, a shell),
whose pid the command line cannot know.

Where ``$CARRY_PROOF_CACHE`` names the prove's cache, the trees' modules compile once per
content into it (``carry_bytecode``), not once per run and rank; and once the proof is collected,
what the run has built so far (the trees' modules) is frozen out of the garbage collector's scans
(``gc.freeze``): pytest ends each session with five full collections, which walked every object
megatron-core made at import (0.37 s a run on 2 cores), while garbage the tests make is still
collected, and its finalizers still run, as before.

Only the standard library and pytest: it runs in every proof environment.
"""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path

import carry_bytecode
import carry_lifeline
import pytest

if os.environ.get("CARRY_PROOF_CACHE"):
    carry_bytecode.install(os.path.join(os.environ["CARRY_PROOF_CACHE"], "bytecode"))
carry_lifeline.tie_forks()
if os.environ.get("CARRY_PROOF_PARENT", "").isdigit():
    carry_lifeline.tie(int(os.environ["CARRY_PROOF_PARENT"]))
elif os.environ.get("CARRY_PROOF_PARENT") == "launcher":
    carry_lifeline.tie()

CUDA_FORK = "Cannot re-initialize CUDA in forked subprocess"


def _write(doc: dict) -> None:
    path = os.environ.get("CARRY_PROOF_EVENTS")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(doc) + "\n")


def _from_trees(module: str) -> bool:
    top = module.split(".")[0]
    for root in filter(None, os.environ.get("CARRY_PROOF_TREES", "").split(os.pathsep)):
        if (Path(root) / top).is_dir() or (Path(root) / f"{top}.py").is_file():
            return True
    return False


def _innermost(exc: BaseException) -> BaseException:
    """What was really raised: pytest reports a module's import error as a CollectError raised
    from it, so the chain is followed to the first ImportError (else the exception itself)."""
    seen, cur = set(), exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, ImportError):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return exc


def classify(exc: BaseException) -> tuple[str, str]:
    """(kind, reason) for an exception a proof raised."""
    exc = _innermost(exc)
    cause = getattr(exc, "cause", None)  # _world.RankFailed: what the failing rank raised
    if isinstance(cause, dict) and cause.get("type"):
        kind_, module, message = cause["type"], cause.get("module"), cause.get("message", "")
    else:
        kind_ = type(exc).__name__
        module = exc.name if isinstance(exc, ImportError) else None
        message = str(exc)
    if CUDA_FORK in message:
        return "environment", (f"{kind_}: {CUDA_FORK}: a rank was forked after CUDA was "
                               "initialised (start its ranks with spawn)")
    if module and not _from_trees(module):
        return "environment", f"{kind_}: the proof's interpreter has no module {module!r} (no tree under test provides it)"
    tool = exc.filename if isinstance(exc, FileNotFoundError) else None
    if isinstance(tool, str) and tool and os.sep not in tool:
        # What subprocess raises for a program that is not on PATH (a path would be the proof's own file).
        return "environment", f"{kind_}: this host has no program {tool!r} on PATH"
    return "behaviour", f"{kind_}: {message.splitlines()[0] if message else ''}"[:300]


@pytest.hookimpl(tryfirst=True)  # before the body runs: a body that kills the interpreter is still seen
def pytest_runtest_call(item) -> None:
    _write({"event": "body", "nodeid": item.nodeid})


def pytest_exception_interact(node, call, report) -> None:
    if call.excinfo is None:
        return
    kind, reason = classify(call.excinfo.value)
    _write({"event": "error", "kind": kind, "phase": getattr(report, "when", None) or "collect",
            "nodeid": node.nodeid, "reason": reason})


def pytest_collection_finish(session) -> None:
    gc.freeze()
