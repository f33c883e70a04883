#!/usr/bin/env python3
"""Benchmark (not a test): tools/prove.py over the CPU proofs, against its floor in the same run.

Applies the series once (megatron-lm and megatron-bridge from the real pins), then times
`tools/prove.py --only megatron-lm,megatron-bridge`:
  cold   the first prove in a fresh work directory with an empty proof-environment cache
         (every proof environment is built, as on a new machine; pip's own download cache is kept)
  warm   the same command again on that work directory and cache (runs fork from the zygote)
  fresh  warm, with --fresh (every run a fresh interpreter: the old way)
and, on its own, the zygote's start (this Python's zygote, carry.evidence.zygote, until it has
imported its preloads) and one bare child's megatron import (a run forked from that zygote whose
proof file only imports megatron.core and its GPT model from the patched tree: pytest's start,
the tree's imports, the fork). The floor is what the runs would cost if each did nothing but
that: (zygote start + runs x a child's import) / cores. Each figure is printed with its ratio
to that floor.

Prints the medians, min and max, and the machine's load average around each run (the machine
may be shared: rely on the ratios, whose floor is measured in the same run). Checks every
proof's verdict in each run, and that warm and fresh agree, and fails if one is not red/green.
CARRY_PROOF_JOBS in the environment reaches prove.

    python3 tests/bench_prove.py [--runs 3] [--cache DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

IMPORTS = """
import megatron.core
import megatron.core.models.gpt.gpt_model  # noqa: F401


def test_imports():
    pass
"""


def sh(argv, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="cold and warm runs each (default 3)")
    ap.add_argument("--cache", type=Path, default=ROOT / ".cache" / "test-pins",
                    help="download cache holding the pinned artifacts (default .cache/test-pins)")
    ap.add_argument("--only", default="megatron-lm,megatron-bridge", help="what prove runs (default the CPU upstreams)")
    a = ap.parse_args()
    if a.runs < 1:
        ap.error("--runs must be at least 1")
    tmp = Path(tempfile.mkdtemp(prefix="bench-prove-"))
    try:
        base_env = dict(os.environ, GTP_CARRY_QUIET="1")
        upstreams = ",".join(u for u in a.only.split(",") if u in ("megatron-lm", "megatron-bridge", "nemo-rl")) or a.only
        loads: list[str] = []

        def apply(workdir: Path) -> None:
            sh([sys.executable, str(ROOT / "tools/apply.py"), "--series", "gtp", "--workdir", str(workdir),
                "--cache", str(a.cache), "--only", upstreams], env=base_env)

        def prove(workdir: Path, env_cache: Path, tag: str, *extra: str) -> tuple[float, list[dict]]:
            rep = tmp / f"prove-{tag}.json"
            loads.append(f"{tag}: {os.getloadavg()[0]:.1f}")
            t0 = time.perf_counter()
            res = subprocess.run([sys.executable, str(ROOT / "tools/prove.py"), "--series", "gtp", "--workdir",
                                  str(workdir), "--only", a.only, "--cache", str(env_cache), "--json", str(rep),
                                  *extra], check=False, env=base_env, capture_output=True, text=True)
            secs = time.perf_counter() - t0
            loads[-1] += f"->{os.getloadavg()[0]:.1f}"
            if res.returncode != 0:
                sys.stderr.write(res.stdout + res.stderr)
                raise SystemExit(f"prove exited {res.returncode} in run {tag}: a proof is not red/green")
            return secs, json.loads(rep.read_text())["proofs"]

        def zygote_once() -> tuple[float, float]:
            """(the zygote's start, one bare child's megatron import), one each."""
            sys.path.insert(0, str(ROOT / "tools"))
            from carry.evidence import zygote
            from carry.evidence.prove import PROOF_ENV

            scratch = Path(tempfile.mkdtemp(dir=tmp))
            proof = scratch / "test_imports.py"
            proof.write_text(IMPORTS)
            tree = tmp / "w-warm" / "megatron-lm"
            t0 = time.perf_counter()
            z = zygote.Zygote(sys.executable, scratch, {"megatron"}, env_extra=False)
            try:
                assert z.wait_ready(), z.problem
                start = time.perf_counter() - t0
                env = dict(os.environ, PYTHONPATH=str(tree), CARRY_PROOF_TREES=str(tree), **PROOF_ENV)  # as prove runs it
                t0 = time.perf_counter()
                rc, out, err = z.run(["-q", "-p", "no:cacheprovider", str(proof)], env, scratch, 600, scratch)
                child = time.perf_counter() - t0
                assert rc == 0, out + err
            finally:
                z.close()
            return start, child

        apply(tmp / "w-warm")
        cold, warm, fresh, starts, children = [], [], [], [], []
        verdicts: list[dict] = []
        warm_cache = tmp / "envs-warm"
        prove(tmp / "w-warm", warm_cache, "prime")  # builds the warm cache's proof environments
        for i in range(a.runs):
            wd = tmp / f"w-cold-{i}"
            apply(wd)
            secs, verdicts = prove(wd, tmp / f"envs-cold-{i}", f"cold-{i}")
            cold.append(secs)
            shutil.rmtree(wd)
            shutil.rmtree(tmp / f"envs-cold-{i}", ignore_errors=True)
            secs, verdicts = prove(tmp / "w-warm", warm_cache, f"warm-{i}")
            warm.append(secs)
            secs, old = prove(tmp / "w-warm", warm_cache, f"fresh-{i}", "--fresh")
            fresh.append(secs)
            same = [(p["pristine"], p["patched"]) for p in verdicts] == [(p["pristine"], p["patched"]) for p in old]
            if not same:
                raise SystemExit(f"the zygote and --fresh disagree: {verdicts} against {old}")
            start, child = zygote_once()
            starts.append(start)
            children.append(child)
        med = statistics.median
        runs = 2 * len(verdicts)
        cores = usable_cores()
        floor = (med(starts) + runs * med(children)) / cores
        ran = [p for p in verdicts if p["ok"] is not None]
        print(f"proofs: {len(verdicts)} selected by --only {a.only}, {len(ran)} decided here "
              f"(red/green: {sum(1 for p in ran if p['ok'])}), runs per prove: {runs}, bench runs: {a.runs}, "
              f"cores: {cores}, CARRY_PROOF_JOBS: {os.environ.get('CARRY_PROOF_JOBS', 'unset')}")
        print(f"load (1 min, before->after each prove) {', '.join(loads)}")

        def row(name: str, xs: list[float], note: str = "") -> None:
            print(f"{name:<14} median {med(xs):6.1f}s  (min {min(xs):.1f}, max {max(xs):.1f})  "
                  f"ratio to floor {med(xs) / floor:5.2f}{note}")

        row("cold prove", cold)
        row("warm prove", warm, "   target: <= 60 s")
        row("--fresh prove", fresh)
        row("zygote start", starts)
        row("child import", children, "   (one run forked from the zygote: pytest and megatron.core's GPT model)")
        print(f"floor          {floor:.1f}s  = ({med(starts):.2f}s + {runs} x {med(children):.2f}s) / {cores} cores")
        for p in verdicts:
            print(f"  {p['id']:<28} pristine {p['pristine']:<8} patched {p['patched']:<8} {p.get('seconds', '')}s")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


if __name__ == "__main__":
    sys.exit(main())
