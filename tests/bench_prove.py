#!/usr/bin/env python3
"""Benchmark (not a test): tools/prove.py over the CPU proofs, against its floor in the same run.

Applies the series once (megatron-lm and megatron-bridge from the real pins), then times
`tools/prove.py --only megatron-lm,megatron-bridge`:
  cold  the first prove in a fresh work directory with an empty proof-environment cache
        (every proof environment is built, as on a new machine; pip's own download cache is kept)
  warm  the same command again on that work directory and cache
Every interpreter that prove starts (pytest's, each spawned rank's, a proof environment's) is
counted by a `sitecustomize` this benchmark puts on PYTHONPATH; it records whether the
interpreter imported torch. The floor is one bare interpreter that imports torch and
megatron.core (median of --runs), times the number of torch-importing interpreters a warm prove
started: what the proofs would cost if each interpreter did nothing but its imports.

Prints the medians, min and max of cold and warm, the floor and the ratios warm/floor and
cold/floor, and the machine's load average around each run (the machine may be shared: rely on
the ratio, whose floor is measured in the same run). Checks every proof's verdict in each run
and fails if one is not red/green. CARRY_PROOF_JOBS in the environment reaches prove.

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

COUNTER = """\
import atexit, os, sys
_log = os.environ.get("CARRY_BENCH_INTERPRETERS")
if _log:
    def _record():
        with open(_log, "a") as f:
            f.write(f"{os.getpid()} {int('torch' in sys.modules)} {int('megatron.core' in sys.modules)}\\n")
    atexit.register(_record)
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
        site = tmp / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(COUNTER)
        base_env = dict(os.environ, GTP_CARRY_QUIET="1")
        base_env["PYTHONPATH"] = os.pathsep.join([str(site)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
        upstreams = ",".join(u for u in a.only.split(",") if u in ("megatron-lm", "megatron-bridge", "nemo-rl")) or a.only

        def apply(workdir: Path) -> None:
            sh([sys.executable, str(ROOT / "tools/apply.py"), "--series", "gtp", "--workdir", str(workdir),
                "--cache", str(a.cache), "--only", upstreams], env=base_env)

        def prove(workdir: Path, env_cache: Path, tag: str) -> tuple[float, int, list[dict]]:
            log = tmp / f"interpreters-{tag}.txt"
            env = dict(base_env, CARRY_BENCH_INTERPRETERS=str(log))
            rep = tmp / f"prove-{tag}.json"
            loads.append(f"{tag}: {os.getloadavg()[0]:.1f}")
            t0 = time.perf_counter()
            res = subprocess.run([sys.executable, str(ROOT / "tools/prove.py"), "--series", "gtp", "--workdir",
                                  str(workdir), "--only", a.only, "--cache", str(env_cache), "--json", str(rep)],
                                 check=False, env=env, capture_output=True, text=True)
            secs = time.perf_counter() - t0
            loads[-1] += f"->{os.getloadavg()[0]:.1f}"
            if res.returncode != 0:
                sys.stderr.write(res.stdout + res.stderr)
                raise SystemExit(f"prove exited {res.returncode} in run {tag}: a proof is not red/green")
            lines = log.read_text().splitlines() if log.exists() else []
            torch_interps = sum(1 for ln in lines if ln.split()[1] == "1")
            return secs, torch_interps, json.loads(rep.read_text())["proofs"]

        def floor_once() -> float:
            mcore = tmp / "w-warm" / "megatron-lm"
            env = dict(os.environ, PYTHONPATH=str(mcore), PYTHONDONTWRITEBYTECODE="1")
            t0 = time.perf_counter()
            sh([sys.executable, "-c", "import torch, megatron.core"], env=env)
            return time.perf_counter() - t0

        apply(tmp / "w-warm")
        cold, warm, counts, floors = [], [], [], []
        loads: list[str] = []
        verdicts: list[dict] = []
        warm_cache = tmp / "envs-warm"
        prove(tmp / "w-warm", warm_cache, "prime")  # builds the warm cache's proof environments
        for i in range(a.runs):
            wd = tmp / f"w-cold-{i}"
            apply(wd)
            secs, _, verdicts = prove(wd, tmp / f"envs-cold-{i}", f"cold-{i}")
            cold.append(secs)
            shutil.rmtree(wd)
            shutil.rmtree(tmp / f"envs-cold-{i}", ignore_errors=True)
            secs, n, verdicts = prove(tmp / "w-warm", warm_cache, f"warm-{i}")
            warm.append(secs)
            counts.append(n)
            floors.append(floor_once())
        med = statistics.median
        n = int(med(counts))
        one = med(floors)
        floor = one * n
        ran = [p for p in verdicts if p["ok"] is not None]
        print(f"proofs: {len(verdicts)} selected by --only {a.only}, {len(ran)} decided here "
              f"(red/green: {sum(1 for p in ran if p['ok'])}), runs: {a.runs}, cores: {os.cpu_count()}, "
              f"CARRY_PROOF_JOBS: {os.environ.get('CARRY_PROOF_JOBS', 'unset')}")
        print(f"load (1 min, before->after each prove) {', '.join(loads)}")
        print(f"cold prove     median {med(cold):.1f}s  (min {min(cold):.1f}, max {max(cold):.1f})")
        print(f"warm prove     median {med(warm):.1f}s  (min {min(warm):.1f}, max {max(warm):.1f})")
        print(f"interpreters   {n} importing torch per warm prove (min {min(counts)}, max {max(counts)})")
        print(f"one import     median {one:.2f}s  (python -c 'import torch, megatron.core'; min {min(floors):.2f}, "
              f"max {max(floors):.2f})")
        print(f"floor          {floor:.1f}s  = {n} x {one:.2f}s")
        print(f"ratio warm/floor {med(warm) / floor:.2f}   cold/floor {med(cold) / floor:.2f}   target: warm <= 60 s")
        for p in verdicts:
            print(f"  {p['id']:<28} pristine {p['pristine']:<8} patched {p['patched']:<8} {p.get('seconds', '')}s")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
