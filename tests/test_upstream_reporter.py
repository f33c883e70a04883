"""The upstream tests' reporter (tools/carry/evidence/upstream/site/carry_upstream_report.py) when its
rank is sent SIGTERM, run for real: pytest with the plugin in a real interpreter, a real signal.

torchrun sends SIGTERM to every other rank when one dies. A rank that waits in C code for the dead
peer (an NCCL collective, a CUDA synchronisation) never comes back to Python, so a Python handler
alone never ran: torchrun's SIGKILL came 30 s later and the rank left no record (2026-12-05, one
H100: 12 launches of 28 ended so, h100/2026-12-05-shards). Here a test waits in
``pthread_mutex_lock`` on a mutex it holds, a C call that no signal ends, with the GIL released as
ctypes does, as torch does around a collective.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from carry.evidence.upstream.launch import SITE

WAITS_IN_C = textwrap.dedent("""
    import asyncio
    import ctypes
    import os
    import signal
    import time

    def _wait_in_c():
        libc = ctypes.CDLL(None)
        mutex = ctypes.create_string_buffer(64)   # zeroed: PTHREAD_MUTEX_INITIALIZER, a normal mutex
        libc.pthread_mutex_lock(mutex)
        libc.pthread_mutex_lock(mutex)   # never returns, whatever signal comes

    def test_an_asyncio_loop_with_a_signal_handler():
        # the loop takes the process's wake-up fd for its handler and sets none back when it closes
        loop = asyncio.new_event_loop()
        loop.add_signal_handler(signal.SIGUSR1, lambda: None)
        loop.run_until_complete(asyncio.sleep(0))
        loop.remove_signal_handler(signal.SIGUSR1)
        loop.close()

    def test_forks_a_child_and_stops_it():
        pid = os.fork()
        if pid == 0:   # the child: Python code, so the inherited handler runs in it
            time.sleep(60)
            os._exit(0)
        time.sleep(0.5)
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, status
        time.sleep(0.5)   # the rank's watcher would have read a byte the child wrote by now

    def test_waits_in_c():
        _wait_in_c()

    def test_handles_its_own_sigterm():
        got = []
        old = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1.0)   # the rank's watcher has read the byte by now
        finally:
            signal.signal(signal.SIGTERM, old)
        assert got == [signal.SIGTERM]
""")


def _rank(tmp_path: Path, tests: list[str]) -> tuple[subprocess.Popen, Path]:
    (tmp_path / "test_waits.py").write_text(WAITS_IN_C)
    out = tmp_path / "out"
    env = dict(os.environ, CARRY_UT_OUT=str(out), PYTHONPATH=str(SITE), RANK="0")
    env.pop("CARRY_UT_TEST_TIMEOUT", None)
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "carry_upstream_report", "-q", "-p", "no:cacheprovider",
                             *[f"test_waits.py::{t}" for t in tests]],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return proc, out / "rank-0.jsonl"


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _when_in(path: Path, test: str, proc: subprocess.Popen, limit: float = 60) -> None:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if any(r["ev"] == "start" and r["id"].endswith(test) for r in _records(path)):
            time.sleep(1.0)   # inside the C call by now
            return
        assert proc.poll() is None, proc.communicate()[0].decode()[-3000:]
        time.sleep(0.1)
    raise AssertionError(f"{test} never began: {_records(path)}")


def _stopped(tmp_path: Path, tests: list[str]) -> tuple[int | None, float, list[dict], str]:
    proc, path = _rank(tmp_path, tests)
    try:
        _when_in(path, tests[-1], proc)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass
        took = time.monotonic() - t0
        rc = proc.poll()
    finally:
        if proc.poll() is None:
            proc.kill()
        console = proc.communicate()[0].decode(errors="replace")
    return rc, took, _records(path), console


def test_a_rank_waiting_in_c_writes_that_it_was_stopped_and_dies_of_the_signal_at_once(tmp_path):
    rc, took, records, console = _stopped(tmp_path, ["test_waits_in_c"])
    assert rc == -signal.SIGTERM, (rc, took, console[-2000:])
    assert took < 10, took
    said = [r for r in records if r["ev"] == "terminated"]
    assert [(r["id"].split("::")[-1], r["signal"]) for r in said] == [("test_waits_in_c", 15)], records


def test_an_asyncio_loop_that_took_the_wake_up_fd_does_not_keep_it(tmp_path):
    rc, took, records, console = _stopped(tmp_path, ["test_an_asyncio_loop_with_a_signal_handler", "test_waits_in_c"])
    assert rc == -signal.SIGTERM and took < 10, (rc, took, console[-2000:])
    ends = {r["id"].split("::")[-1]: r["outcome"] for r in records if r["ev"] == "end"}
    assert ends == {"test_an_asyncio_loop_with_a_signal_handler": "passed"}, records
    assert [r["id"].split("::")[-1] for r in records if r["ev"] == "terminated"] == ["test_waits_in_c"], records


def test_a_test_that_handles_sigterm_itself_gets_it_and_the_rank_lives_on(tmp_path):
    """A test's own SIGTERM handler (a training loop's, say) gets the signal as it would without the
    reporter: the watcher acts only while the reporter's handler is the one installed."""
    proc, path = _rank(tmp_path, ["test_handles_its_own_sigterm"])
    console = proc.communicate(timeout=60)[0].decode(errors="replace")
    assert proc.returncode == 0, console[-3000:]
    records = _records(path)
    assert [(r["ev"], r.get("outcome")) for r in records if r["ev"] in ("terminated", "end", "finish")] == [
        ("end", "passed"), ("finish", None)], records


def test_a_process_a_test_forks_is_not_the_rank_when_it_is_stopped(tmp_path):
    """The fork inherits the handler and the wake-up fd: its SIGTERM neither writes the rank's record
    nor reaches the rank's watcher (which would end the rank)."""
    proc, path = _rank(tmp_path, ["test_forks_a_child_and_stops_it"])
    console = proc.communicate(timeout=60)[0].decode(errors="replace")
    assert proc.returncode == 0, console[-3000:]
    records = _records(path)
    assert [r["ev"] for r in records if r["ev"] in ("terminated", "end", "finish")] == ["end", "finish"], records
    assert [r["outcome"] for r in records if r["ev"] == "end"] == ["passed"], records


GLOO = textwrap.dedent("""
    import os
    import time

    import torch
    import torch.distributed as dist


    def test_one_rank_dies_while_the_other_waits_in_a_collective():
        dist.init_process_group("gloo")
        if dist.get_rank() == 1:
            time.sleep(2)
            os._exit(9)
        # rank 0 waits in C++ for a key no rank sets, as a rank waits in NCCL for a peer that is gone (gloo's
        # own collectives see the peer's socket close and raise)
        dist.distributed_c10d._get_default_store().wait(["never-set"])


    def test_after():
        pass
""")


def test_torchrun_stops_a_rank_waiting_in_a_collective_at_once_and_its_test_is_run_again(tmp_path):
    """The case for real: torchrun, two ranks, rank 1 dies, rank 0 waits in the store's C++. The
    launch ends in seconds, not after torchrun's 30 s before its SIGKILL, and the death is charged to
    rank 1 alone: rank 0 wrote that torchrun stopped it."""
    from carry.evidence.upstream.launch import Side, run_side
    from carry.series.testspin import TestsPin
    (tmp_path / "side" / "tests").mkdir(parents=True)
    (tmp_path / "side" / "tests" / "test_gloo.py").write_text(GLOO)
    pin = TestsPin(upstream="demo", root="tests", launch="torchrun", source="tree", nproc=2)
    side = Side(name="patched", pin=pin, folder=tmp_path / "side", files=["tests/test_gloo.py"], pythonpath=[],
                out=tmp_path / "out", deadline=time.monotonic() + 240, test_timeout=200)
    res = run_side(side)
    first = res.launches[0]   # from its first test on: the interpreters' start is the host's load (startup_s)
    assert first["seconds"] - first["startup_s"] < 25, res.launches
    died = res.outcomes["tests/test_gloo.py::test_one_rank_dies_while_the_other_waits_in_a_collective"]
    assert (died.outcome, died.ranks) == ("crashed", {"1": "died"}), died
    assert res.outcomes["tests/test_gloo.py::test_after"].outcome == "passed", res.outcomes
    said = _records(side.out / "launch-01-n2" / "rank-0.jsonl")
    assert [r["id"].split("::")[-1] for r in said if r["ev"] == "terminated"] == [
        "test_one_rank_dies_while_the_other_waits_in_a_collective"], said


OUT_OF_STEP = textwrap.dedent("""
    import datetime

    import torch.distributed as dist


    def _group():
        if not dist.is_initialized():
            dist.init_process_group("gloo")


    def test_fails_on_one_rank_before_the_collective():
        _group()
        if dist.get_rank() == 1:
            raise AssertionError("rank 1 fails before the collective")
        # rank 0 waits in C++ for its peer, as a rank waits in NCCL for one that left the test
        dist.distributed_c10d._get_default_store().wait(["never-set"])


    def test_needs_every_rank():
        # each rank says it is here and waits 2 s for the other: it fails where a rank is missing, as a
        # communicator's set-up does
        _group()
        store = dist.distributed_c10d._get_default_store()
        store.set(f"here-{dist.get_rank()}", "1")
        store.wait([f"here-{1 - dist.get_rank()}"], datetime.timedelta(seconds=2))


    def test_then_waits_for_every_rank():
        _group()
        dist.barrier()
""")


def test_a_rank_left_behind_stops_the_launch_and_what_ranks_ran_out_of_step_is_run_again(tmp_path):
    """Upstream's way for real (resharding/test_model_swap.py on the H100): torchrun, two ranks; rank 1
    fails a test and goes on, rank 0 stays in the test's collective. Rank 1's next test fails only because
    rank 0 is not there, and its one after waits for rank 0 too. The launcher sees rank 0 left behind and
    stops the launch at once, not at the per-test timeout (100 s here, 120 s on the device); the failed
    test keeps its failure; the two tests rank 1 ran out of step run again in step, and pass."""
    from carry.evidence.upstream.launch import Side, run_side
    from carry.series.testspin import TestsPin
    (tmp_path / "side" / "tests").mkdir(parents=True)
    (tmp_path / "side" / "tests" / "test_step.py").write_text(OUT_OF_STEP)
    pin = TestsPin(upstream="demo", root="tests", launch="torchrun", source="tree", nproc=2)
    side = Side(name="patched", pin=pin, folder=tmp_path / "side", files=["tests/test_step.py"], pythonpath=[],
                out=tmp_path / "out", deadline=time.monotonic() + 400, test_timeout=100, step_grace=3)
    res = run_side(side)
    first = res.launches[0]
    assert first["seconds"] - first["startup_s"] < 40 and first["stopped"]["rank"] == "0" and first["stopped"]["peer"] == "1", res.launches
    assert first["stopped"]["test"] == "tests/test_step.py::test_fails_on_one_rank_before_the_collective"
    # the launch says which result it did not count: rank 1's failure of the test rank 0 never began
    assert list(first["out_of_step"]) == ["tests/test_step.py::test_needs_every_rank"], first
    assert "rank 0 never began it" in first["out_of_step"]["tests/test_step.py::test_needs_every_rank"]
    assert "out_of_step" not in res.launches[1], res.launches
    # what the launch cost besides its tests: before the first test began, after the last record; the tests
    # themselves took at least the grace the launcher waited
    assert 0 < first["startup_s"] and -1 < first["wind_down_s"], first
    assert first["startup_s"] + first["wind_down_s"] <= first["seconds"] - 3, first
    got = {k.split("::")[1]: (o.outcome, o.ranks) for k, o in res.outcomes.items()}
    assert got == {"test_fails_on_one_rank_before_the_collective": ("failed", {"1": "failed"}),
                   "test_needs_every_rank": ("passed", {"0": "passed", "1": "passed"}),
                   "test_then_waits_for_every_rank": ("passed", {"0": "passed", "1": "passed"})}, (got, res.launches)
    assert len(res.launches) == 2 and not res.not_run, res.launches
    # rank 1's first try of test_needs_every_rank failed for want of rank 0: its record is there, and no verdict
    said = _records(side.out / "launch-01-n2" / "rank-1.jsonl")
    assert [(r["id"].split("::")[1], r["outcome"]) for r in said if r["ev"] == "end"] == [
        ("test_fails_on_one_rank_before_the_collective", "failed"), ("test_needs_every_rank", "failed")], said


def test_a_test_told_to_ask_for_another_size_launches_at_it_only_from_its_own_sides_files(tmp_path):
    """--compared runs tell of tests asking for another size (Compared.asks, the side's ``worlds``), for every file
    of the selection. A shard's side runs some of them: its tests launch at their size at once, without a first-size
    refusal, and another shard's tests told of the same way are neither launched nor counted as not reached here.
    For real: torchrun, two ranks first, then one."""
    from carry.evidence.upstream.launch import Side, run_side
    from carry.series.testspin import TestsPin
    tests = tmp_path / "side" / "tests"
    tests.mkdir(parents=True)
    (tests / "test_mine.py").write_text(textwrap.dedent("""
        import os


        def test_plain():
            pass


        def test_asks_for_one():
            assert os.environ["WORLD_SIZE"] == "1", "launched at the size it asks for"
    """))
    (tests / "test_other_shards.py").write_text("def test_asks_for_one():\n    pass\n")
    pin = TestsPin(upstream="demo", root="tests", launch="torchrun", source="tree", nproc=2)
    told = {"tests/test_mine.py::test_asks_for_one": 1, "tests/test_other_shards.py::test_asks_for_one": 1}
    side = Side(name="patched", pin=pin, folder=tmp_path / "side", files=["tests/test_mine.py"], pythonpath=[],
                out=tmp_path / "out", deadline=time.monotonic() + 240, test_timeout=200, worlds=told)
    res = run_side(side)
    assert [x["world"] for x in res.launches] == [2, 1], res.launches
    assert {i: (o.outcome, o.world) for i, o in res.outcomes.items()} == {
        "tests/test_mine.py::test_plain": ("passed", 2), "tests/test_mine.py::test_asks_for_one": ("passed", 1)}, \
        res.outcomes
    assert res.not_run == {}, res.not_run
    first = {r["id"] for r in _records(side.out / "launch-01-n2" / "rank-0.jsonl") if r["ev"] == "start"}
    assert "tests/test_mine.py::test_asks_for_one" not in first, "never refused again at the first size first"
