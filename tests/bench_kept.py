#!/usr/bin/env python3
"""Benchmark (not a test): what keeping the old workspace costs a rebuild.

On the real megatron-lm pin (megatron-core 0.19.2 and the gtp series' patches for it), two
work directories start alike; each run rebuilds both with another selection of patches
(``--only``), which changes the workspace's digest, so apply builds a new tree and swaps it in:
  keep   the old tree is there: the swap moves it whole to DIR/.carry/kept (what apply does)
  plain  the old tree was removed first (not timed): the same rebuild with nothing to keep,
         the baseline
The order alternates between runs. Prints the medians, the median of the per-run ratios
keep/plain, the time deleting the old tree takes instead (what a rebuild that deleted it
would pay), and the disk the kept copy uses (du), with how much of it is hard links it
shares with the cache.

    python3 tests/bench_kept.py [--runs 7] [--cache DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SELECTIONS = ("megatron-lm", "mlm-pg-collection")  # every megatron-lm patch; one of them


def apply(workdir: Path, only: str, cache: Path, env: dict) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, str(ROOT / "tools/apply.py"), "--series", "gtp", "--workdir", str(workdir),
                    "--cache", str(cache), "--only", only], env=env, check=True, capture_output=True, text=True)
    return time.perf_counter() - t0


def du_k(path: Path) -> int:
    return int(subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


def shared_k(path: Path) -> int:
    """KiB of ``path`` in files with more than one link (objects a local clone shares with the cache)."""
    total = 0
    for top, _, files in os.walk(path):
        for f in files:
            st = os.lstat(os.path.join(top, f))
            if st.st_nlink > 1:
                total += st.st_blocks * 512
    return total // 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--cache", type=Path,
                    default=Path(os.environ.get("GTP_CARRY_TEST_CACHE", ROOT / ".cache" / "test-pins")))
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-kept-"))
    env = dict(os.environ, GTP_CARRY_QUIET="1")
    try:
        keep_dir, plain_dir = tmp / "keep", tmp / "plain"
        for w in (keep_dir, plain_dir):
            apply(w, SELECTIONS[0], a.cache, env)
        ws_k = du_k(keep_dir / "megatron-lm")
        keep_t, plain_t, delete_t, ratios = [], [], [], []
        kept_k = shared = None
        for i in range(a.runs):
            only = SELECTIONS[(i + 1) % 2]
            t0 = time.perf_counter()
            shutil.rmtree(plain_dir / "megatron-lm")
            delete_t.append(time.perf_counter() - t0)
            if i % 2:
                p = apply(plain_dir, only, a.cache, env)
                k = apply(keep_dir, only, a.cache, env)
            else:
                k = apply(keep_dir, only, a.cache, env)
                p = apply(plain_dir, only, a.cache, env)
            keep_t.append(k)
            plain_t.append(p)
            ratios.append(k / p)
            kept = sorted((keep_dir / ".carry" / "kept").iterdir())
            assert len(kept) == 1, kept  # each rebuild kept the tree it replaced
            if kept_k is None:
                kept_k, shared = du_k(kept[0]), shared_k(kept[0])
            shutil.rmtree(kept[0])  # not timed: the next run keeps its own
        med = statistics.median
        print(f"rebuilds of the megatron-lm workspace (megatron-core 0.19.2, --only {' / '.join(SELECTIONS)}), "
              f"runs: {a.runs}, {os.cpu_count()} CPUs")
        print(f"keep   median {med(keep_t):.3f}s  (min {min(keep_t):.3f}, max {max(keep_t):.3f})")
        print(f"plain  median {med(plain_t):.3f}s  (min {min(plain_t):.3f}, max {max(plain_t):.3f})")
        print(f"ratio keep/plain median {med(ratios):.3f}  (min {min(ratios):.3f}, max {max(ratios):.3f})")
        print(f"deleting the old tree instead: median {med(delete_t):.3f}s")
        print(f"disk: the kept copy {kept_k / 1024:.1f} MiB (du -sk), of which {shared / 1024:.1f} MiB hard links "
              f"shared with the cache; the workspace {ws_k / 1024:.1f} MiB")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
