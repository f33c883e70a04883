#!/usr/bin/env python3
"""Benchmark (not a test): tools/apply.py against raw `git am` on the same cached base.

Builds a series of N real patches against megatron-core 0.19.2 (each edits a
different real module), then times, pair by pair:
  tool  python3 tools/apply.py --only megatron-lm into a fresh workdir
  raw   git clone --local <cached base> && git am --3way <the same patches>
and the no-op re-apply (second tool run on an up-to-date workdir). Prints
medians and the median of the per-pair ratios tool/raw.

    python3 tests/bench_apply.py [--runs 7] [--patches 12] [--cache DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from carry.git import Git, git_env  # noqa: E402
from carry.workspace.export import format_patch  # noqa: E402


def sh(argv, **kw):
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--patches", type=int, default=12)
    ap.add_argument("--cache", type=Path, default=ROOT / ".cache" / "test-pins")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-apply-"))
    env = dict(os.environ, GTP_CARRY_QUIET="1")
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # time the tool as installed: with its bytecode cache
    try:
        sdir = tmp / "patches" / "bench"
        sdir.mkdir(parents=True)
        pins = (ROOT / "patches/gtp/series.toml").read_text().split("\n[[patches]]")[0]
        (sdir / "series.toml").write_text(pins.replace('name = "gtp"', 'name = "bench"'))
        author = tmp / "author"
        sh([sys.executable, str(ROOT / "tools/apply.py"), "--series", str(sdir), "--workdir", str(author),
            "--cache", str(a.cache), "--only", "megatron-lm"], env=env)
        ws = author / "megatron-lm"
        files = sorted(p for p in (ws / "megatron/core").rglob("*.py") if p.stat().st_size > 4000)
        entries = []
        (sdir / "megatron-lm").mkdir()
        for i, f in enumerate(files[: a.patches]):
            lines = f.read_text().splitlines(keepends=True)
            lines.insert(len(lines) // 2, "# carried change for the benchmark\n")
            f.write_text("".join(lines))
            commit = Git(ws).commit_all(f"bench: edit {f.name}")
            name = f"megatron-lm/{i + 1:04d}-bench.patch"
            (sdir / name).write_bytes(format_patch(ws, commit))
            entries.append(f'[[patches]]\nid = "bench-{i + 1}"\nupstream = "megatron-lm"\ntitle = "bench"\n'
                           f'file = "{name}"\nstatus = "inappropriate"\nowner = "bench"\nwhy = "bench"\n'
                           f'retire_when = "never"\n')
        (sdir / "series.toml").write_text((sdir / "series.toml").read_text() + "\n" + "\n".join(entries))
        base_repo = next((a.cache / "bases" / "megatron-lm").glob("pypi-*.git"))
        patches = sorted(str(p) for p in (sdir / "megatron-lm").glob("*.patch"))

        cpu: dict[str, list[float]] = {"tool": [], "raw": []}

        def children_cpu() -> float:
            r = resource.getrusage(resource.RUSAGE_CHILDREN)
            return r.ru_utime + r.ru_stime

        def tool_run(workdir: Path) -> float:
            t0, c0 = time.perf_counter(), children_cpu()
            sh([sys.executable, str(ROOT / "tools/apply.py"), "--series", str(sdir), "--workdir", str(workdir),
                "--cache", str(a.cache), "--only", "megatron-lm"], env=env)
            cpu["tool"].append(children_cpu() - c0)
            return time.perf_counter() - t0

        def raw_run(dest: Path) -> float:
            genv = git_env()
            t0, c0 = time.perf_counter(), children_cpu()
            sh(["git", "clone", "-q", "--local", "--branch", "main", str(base_repo), str(dest)], env=genv)
            sh(["git", "-C", str(dest), "am", "-q", "--3way", *patches], env=genv)
            cpu["raw"].append(children_cpu() - c0)
            return time.perf_counter() - t0

        tool_t, raw_t, noop_t, ratios = [], [], [], []
        tool_run(tmp / "warm-tool")
        raw_run(tmp / "warm-raw")
        for i in range(a.runs):
            t = tool_run(tmp / f"tool-{i}")
            r = raw_run(tmp / f"raw-{i}")
            tool_t.append(t)
            raw_t.append(r)
            ratios.append(t / r)
            noop_t.append(tool_run(tmp / f"tool-{i}"))
            shutil.rmtree(tmp / f"tool-{i}")
            shutil.rmtree(tmp / f"raw-{i}")
        med = statistics.median
        print(f"patches: {len(patches)} on megatron-core 0.19.2, runs: {a.runs}")
        print(f"tool apply    median {med(tool_t):.3f}s  (min {min(tool_t):.3f}, max {max(tool_t):.3f})")
        print(f"raw git am    median {med(raw_t):.3f}s  (min {min(raw_t):.3f}, max {max(raw_t):.3f})")
        print(f"ratio tool/raw median {med(ratios):.2f}  (min {min(ratios):.2f}, max {max(ratios):.2f})  target <= 1.3")
        # CPU seconds (user + sys of the processes each run started) depend less on the machine's load
        # than wall time; the no-op runs are left out of the tool's list (every other call)
        tool_cpu, raw_cpu = cpu["tool"][1::2], cpu["raw"][1:]
        print(f"cpu: tool median {med(tool_cpu):.3f}s, raw median {med(raw_cpu):.3f}s, "
              f"ratio {med(tool_cpu) / med(raw_cpu):.2f}")
        print(f"no-op re-apply median {med(noop_t):.3f}s  (min {min(noop_t):.3f}, max {max(noop_t):.3f})  target <= 0.5 s")
        # The floor a tool in Python cannot go under: its interpreter's start, plus raw's own git work
        # (clone and am, which the tool runs as well), and where the tool's own seconds go beyond it.
        start, imports = [], []
        for _ in range(max(5, a.runs)):
            t0 = time.perf_counter()
            sh([sys.executable, "-c", "pass"], env=env)
            start.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            sh([sys.executable, "-c", "import carry.cli, carry.commands.apply"], env=env, cwd=ROOT / "tools")
            imports.append(time.perf_counter() - t0)
        floor = med(start) + med(raw_t)
        print(f"python start  median {med(start):.3f}s; with the tool's imports {med(imports):.3f}s")
        print(f"floor: python start + raw = {floor:.3f}s, ratio {floor / med(raw_t):.2f}; the tool beyond it "
              f"{med(tool_t) - floor:+.3f}s (its imports {med(imports) - med(start):.3f}s, its own checks and git "
              f"processes the rest)")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
