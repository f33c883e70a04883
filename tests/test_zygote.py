"""Proof runs fork from a zygote (carry.evidence.zygote): each sees its own tree's megatron and
nothing an earlier run left; `--fresh` gives the same verdicts; Ctrl-C and SIGKILL of prove leave
no proof process and no scratch tree behind, and the next prove removes what a killed one left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fakeup import CRASH, GOOD, GPU, VACUOUS, add_proofs
from helpers import SERIES, TOOLS, apply_demo as apply, process_alive, read_json, tool

# Each run records what it sees, checks that no earlier run left anything, then leaves all it can.
DIRTY = '''
import json
import os
import random
import sys

import megatron.core.{module} as mod
import torch

PRISTINE_FAILS = r"^AssertionError: assert .*'patched'"   # the last line: every other check holds on both trees
PRELOADED = "torch._inductor.compile_fx" in sys.modules  # before this file imported anything of torch's


def test_sees_only_its_own_tree_and_nothing_left_behind():
    tree = os.environ["CARRY_TREE_MEGATRON_LM"]
    files = {{n: getattr(m, "__file__", None) or "" for n, m in sys.modules.items() if n.split(".")[0] == "megatron"}}
    with open(os.environ["CARRY_TEST_RECORD"], "a") as f:
        f.write(json.dumps({{"tree": tree, "file": mod.__file__, "preloaded": PRELOADED, "files": files,
                            "random": random.random(), "seed": torch.initial_seed(), "cwd": os.getcwd(), "pid": os.getpid(),
                            "ppid": os.getppid()}}) + "\\n")
    assert all(p.startswith(tree + os.sep) for p in files.values() if p), files
    assert not hasattr(mod, "carry_left"), "a module attribute an earlier proof set"
    assert "carry_left_behind" not in sys.modules
    assert os.getcwd() == os.environ["CARRY_TEST_CWD"]
    assert "CARRY_LEFT" not in os.environ
    assert torch.get_default_dtype() == torch.float32
    assert torch.initial_seed() != 1234
    assert torch.get_num_threads() == int(os.environ["CARRY_TEST_THREADS"])
    mod.carry_left = 1
    sys.modules["carry_left_behind"] = mod
    os.environ["CARRY_LEFT"] = "1"
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(1234)
    torch.set_num_threads(1)
    os.chdir("/")
    assert mod.{name} == "patched"
'''


def _fresh_threads() -> int:
    """torch's thread count in a fresh interpreter (what every run must see)."""
    return int(subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                              capture_output=True, text=True, check=True).stdout)


def _prove(d, tmp_path, *extra, env=None, check=None):
    out = tmp_path / "prove.json"
    out.unlink(missing_ok=True)
    res = tool("prove", "--series", d["series"], "--workdir", d["work"], "--json", out, *extra, env=env, check=check)
    return res, {r["id"]: (r["pristine"], r["patched"], r["ok"]) for r in read_json(out)["proofs"]}


def test_each_run_sees_its_own_tree_and_nothing_an_earlier_one_left(demo, tmp_path):
    add_proofs(demo["series"], {"dirty_a": DIRTY.format(module="alpha", name="value_5"),
                                "dirty_b": DIRTY.format(module="beta", name="value_10")},
               {"clean": "dirty_a", "threeway": "dirty_b"}, SERIES / "proofs" / "pytest.ini")
    apply(demo, check=0)
    threads = _fresh_threads()
    record = tmp_path / "record.jsonl"
    env = {"CARRY_PROOF_JOBS": "1", "GTP_CARRY_VERBOSE": "1", "CARRY_TEST_RECORD": str(record),
           "CARRY_TEST_THREADS": str(threads), "CARRY_TEST_CWD": str(demo["series"].parents[1])}
    res, by = _prove(demo, tmp_path, "--only", "clean,threeway", env=env, check=0)
    assert by == {"clean": ("fail", "pass", True), "threeway": ("fail", "pass", True)}, res.stderr
    assert "fork from a zygote" in res.stderr, res.stderr
    runs = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(runs) == 4, runs  # one at a time: each run came after one that left all it could
    assert all(r["preloaded"] for r in runs), "the runs did not fork from the zygote"
    assert len({r["ppid"] for r in runs}) == 1, "not one zygote for the runs of one prove"
    for r in runs:
        assert r["file"].startswith(r["tree"] + os.sep), r  # the pristine and patched trees each their own
    assert len({r["tree"] for r in runs}) == 3, runs  # the base (shared) and the two patched trees
    # A fresh interpreter seeds Python's and torch's generators from the OS; so does each fork.
    assert len({r["random"] for r in runs}) == 4, "the runs share the zygote's random state"
    assert len({r["seed"] for r in runs}) == 4, "the runs share the zygote's torch seed"
    # The old way: the same verdicts, and there nothing is preloaded.
    record.unlink()
    res, fresh = _prove(demo, tmp_path, "--only", "clean,threeway", "--fresh", env=env, check=0)
    assert fresh == by, res.stderr
    assert not any(json.loads(line)["preloaded"] for line in record.read_text().splitlines())


def test_the_zygote_and_fresh_interpreters_give_the_same_verdicts(demo, tmp_path):
    """Red/green, vacuous, a crash in the body, a GPU skip: the same outcome either way."""
    add_proofs(demo["series"], {"good": GOOD, "vacuous": VACUOUS, "crash": CRASH, "gpu": GPU},
               {"clean": "good", "threeway": "vacuous", "upstreamed": "crash", "conflict": "gpu"},
               SERIES / "proofs" / "pytest.ini")
    apply(demo, check=0)
    _, zygote = _prove(demo, tmp_path, check=1)
    _, fresh = _prove(demo, tmp_path, "--fresh", check=1)
    assert zygote == fresh == {"clean": ("fail", "pass", True), "threeway": ("pass", "pass", False),
                               "upstreamed": ("fail", "fail", False), "conflict": ("skipped", "skipped", None)}


# -- Ctrl-C and SIGKILL of prove ------------------------------------------------------------------
# Each run notes its pytest's pid and its two ranks' pids, then sleeps far past the test's patience.
SLEEPS = '''
import os
import time

from _world import spawn


def _note(path):
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\\n")


def _rank(rank, world_size, pids):
    _note(pids)
    time.sleep(600)


def test_sleeps():
    _note(os.environ["CARRY_TEST_PIDS"])
    spawn(_rank, 2, os.environ["CARRY_TEST_PIDS"])
'''



def _default_sigint() -> None:
    # A suite started in the background hands its children SIGINT ignored (see test_transaction).
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def sleeping(with_world, tmp_path):
    add_proofs(with_world["series"], {"sleeps": SLEEPS},
               {"clean": "sleeps", "threeway": "sleeps", "upstreamed": "sleeps", "conflict": "sleeps"},
               SERIES / "proofs" / "pytest.ini")
    apply(with_world, check=0)
    tmpdir = tmp_path / "tmp"  # prove's scratch folders go here (TMPDIR), where the test can see them
    tmpdir.mkdir()
    pids = tmp_path / "pids"
    env = dict(os.environ, TMPDIR=str(tmpdir), CARRY_TEST_PIDS=str(pids), CARRY_PROOF_JOBS="2", GTP_CARRY_VERBOSE="1")
    return with_world, tmpdir, pids, env




def _start_prove(d, env, *extra) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(TOOLS / "prove.py"), "--series", str(d["series"]), "--workdir",
                             str(d["work"]), *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_default_sigint)


def _wait_for_pids(pids: Path, n: int, proc: subprocess.Popen, timeout: float = 400) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        seen = [int(x) for x in pids.read_text().split()] if pids.exists() else []
        if len(seen) >= n:
            return seen
        assert proc.poll() is None, f"prove ended before its proofs started: {proc.communicate()}"
        assert time.monotonic() < deadline, f"only {len(seen)} of {n} proof processes started"
        time.sleep(0.1)


def _all_dead(pids: list[int], timeout: float = 20) -> list[int]:
    deadline = time.monotonic() + timeout
    while any(map(process_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if process_alive(p)]


@pytest.mark.parametrize("mode", [[], ["--fresh"]], ids=["zygote", "fresh"])
def test_ctrl_c_stops_the_running_proofs_and_removes_their_trees(sleeping, mode):
    d, tmpdir, pids, env = sleeping
    proc = _start_prove(d, env, *mode)
    try:
        running = _wait_for_pids(pids, 6, proc)  # two runs at a time, each a pytest and two ranks
        assert list(tmpdir.glob("carry-prove-*")), "prove's scratch folder is not where the test looks"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)  # six more runs are queued: it does not wait for them
        assert proc.returncode == 130, err
        assert time.monotonic() - t0 < 30, f"Ctrl-C took {time.monotonic() - t0:.0f}s"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not _all_dead(running), "a proof process outlived the Ctrl-C of prove"
    assert len(pids.read_text().split()) == len(running), "a queued proof started after the Ctrl-C"
    assert not list(tmpdir.glob("carry-*")), f"left behind: {list(tmpdir.iterdir())}"  # (torch's caches may stay)


@pytest.mark.parametrize("mode", [[], ["--fresh"]], ids=["zygote", "fresh"])
def test_a_killed_prove_takes_its_proofs_along_and_the_next_prove_sweeps_its_trees(sleeping, mode):
    d, tmpdir, pids, env = sleeping
    proc = _start_prove(d, env, *mode)
    try:
        running = _wait_for_pids(pids, 6, proc)
    finally:
        proc.kill()
        proc.communicate()
    assert not _all_dead(running), "a proof process outlived the SIGKILL of prove"
    left = list(tmpdir.glob(f"carry-prove-{proc.pid}.*"))
    assert len(left) == 1, list(tmpdir.iterdir())  # nothing could remove it: its owner was killed
    # A live prove's folder (this test's own pid stands in for one) is not touched.
    from carry.evidence.scratch import PREFIX, _started

    live = tmpdir / f"{PREFIX}{os.getpid()}.{_started(os.getpid())}-live"
    live.mkdir()
    (d["series"] / "proofs" / "megatron_lm" / "test_sleeps.py").write_text(GOOD)  # the next prove: a quick one
    res = tool("prove", "--series", d["series"], "--workdir", d["work"], "--only", "clean", env=env, check=0)
    assert not left[0].exists(), "the next prove left the killed one's trees"
    assert "removed 1 scratch folder" in res.stderr and left[0].name in res.stderr, res.stderr
    assert live.exists()
    assert sorted(p.name for p in tmpdir.glob("carry-*")) == [live.name]


# The zygote dies as it starts (a sitecustomize that ends the interpreter whose script is the zygote's).
ZYGOTE_DIES = '''
import os
import sys

if sys.argv and sys.argv[0].endswith("carry_zygote.py"):
    os._exit(3)
'''


def test_a_zygote_that_does_not_start_leaves_the_runs_to_fresh_interpreters(demo, tmp_path):
    add_proofs(demo["series"], {"good": GOOD}, {"clean": "good"}, SERIES / "proofs" / "pytest.ini")
    apply(demo, check=0)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(ZYGOTE_DIES)
    env = {"PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "GTP_CARRY_VERBOSE": "1"}
    res, by = _prove(demo, tmp_path, env=env, check=0)
    assert by == {"clean": ("fail", "pass", True)}, res.stderr
    assert "did not start" in res.stderr and "fork from a zygote" not in res.stderr, res.stderr


def test_the_zygote_preloads_torch_only_for_proofs_that_reach_it(tmp_path):
    """carry.evidence.reach: a proof that imports torch, or a proofs-folder module that does, or a
    tree package whose files do, reaches torch; a proof of pure Python does not (its zygote holds
    pytest alone); a proof that does not parse is taken to reach it."""
    from carry.evidence.reach import reaches_torch

    proofs, tree = tmp_path / "proofs", tmp_path / "tree"
    (proofs / "sub").mkdir(parents=True)
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "__init__.py").write_text("VALUE = 1\n")
    (tree / "heavy").mkdir()
    (tree / "heavy" / "__init__.py").write_text("")
    (tree / "heavy" / "deep.py").write_text("def f():\n    from torch import nn\n    return nn\n")
    (proofs / "_helper.py").write_text("import torch.distributed as dist\n")
    (proofs / "_plain.py").write_text("import os\n")

    def proof(name: str, body: str) -> Path:
        path = proofs / "sub" / f"test_{name}.py"
        path.write_text(body)
        return path

    plain = proof("plain", "import os\nimport pkg\nfrom _plain import os as _\n\ndef test_x():\n    assert pkg.VALUE\n")
    assert reaches_torch([plain], proofs, [tree]) is False
    assert reaches_torch([proof("direct", "def test_x():\n    import torch\n")], proofs, [tree]) is True
    assert reaches_torch([proof("helper", "from _helper import dist\n")], proofs, [tree]) is True
    assert reaches_torch([proof("tree", "import heavy.deep\n")], proofs, [tree]) is True
    assert reaches_torch([proof("broken", "def test_x(:\n")], proofs, [tree]) is True
    assert reaches_torch([plain, proof("direct2", "import torch\n")], proofs, [tree]) is True


def test_a_prove_of_pure_python_proofs_starts_a_zygote_without_torch(demo, tmp_path):
    """The demo's proofs import no torch: their zygote holds pytest alone, and the verdicts stand."""
    add_proofs(demo["series"], {"good": GOOD}, {"clean": "good"}, SERIES / "proofs" / "pytest.ini")
    apply(demo, check=0)
    out = tmp_path / "p.json"
    res = tool("prove", "--series", demo["series"], "--workdir", demo["work"], "--only", "clean", "--json", out,
               env={"GTP_CARRY_VERBOSE": "1"}, check=0)
    assert "without torch: no proof of it imports torch" in res.stderr, res.stderr
    by = {r["id"]: r for r in read_json(out)["proofs"]}
    assert (by["clean"]["pristine"], by["clean"]["patched"]) == ("fail", "pass")
