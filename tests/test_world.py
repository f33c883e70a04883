"""The proofs' rank launcher (patches/gtp/proofs/_world.py): forked ranks stand between the calls
of one proof run's marked functions, and each call still sees what new ranks would give it; a
failure, megatron-core parallel state left behind, and prove --fresh each give the next call new
ranks, and an unmarked function always gets ranks of its own."""

from __future__ import annotations

import os
import random
import sys

import pytest

from helpers import SERIES, process_alive

sys.path.insert(0, str(SERIES / "proofs"))
import _world  # noqa: E402
from _world import RankFailed, spawn  # noqa: E402


@_world.leaves_ranks_clean
def _state(rank, world_size, tag):
    """What the rank sees on arrival; then it leaves everything it can behind."""
    import torch

    seen = {"pid": os.getpid(), "random": random.random(), "torch": float(torch.rand(1)),
            "left": os.environ.get("CARRY_TEST_LEFT"), "call": os.environ.get("CARRY_TEST_CALL"),
            "cwd": os.getcwd(), "rank_env": os.environ.get("RANK")}
    os.environ["CARRY_TEST_LEFT"] = tag
    random.random()
    torch.rand(5)
    os.chdir("/")
    return seen


@_world.leaves_ranks_clean
def _fails_on_rank_1(rank, world_size):
    if rank == 1:
        raise ValueError("rank 1 is red")
    return os.getpid()


@_world.leaves_ranks_clean
def _leaves_parallel_state(rank, world_size, tree):
    sys.path.insert(0, tree)
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel()
    return os.getpid()


@pytest.fixture
def launcher(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CARRY_PROOF_FRESH", raising=False)
    monkeypatch.delenv("CARRY_PROOF_START_METHOD", raising=False)
    if _world.start_method() != "fork":
        pytest.skip("ranks are forked only where torch sees no CUDA device; a GPU host starts them per call")
    yield tmp_path
    _world._close_standing()


def _pids(results) -> list[int]:
    return [r["pid"] if isinstance(r, dict) else r for r in results]


def test_ranks_stand_between_calls_and_each_call_starts_as_new_ranks_would(launcher, monkeypatch):
    monkeypatch.setenv("CARRY_TEST_CALL", "1")
    first = spawn(_state, 2, "one")
    monkeypatch.setenv("CARRY_TEST_CALL", "2")
    second = spawn(_state, 2, "two")
    assert _pids(first) == _pids(second), "the second call did not reuse the ranks"
    for a, b in zip(first, second):
        assert (a["random"], a["torch"]) == (b["random"], b["torch"]), "a call saw the generators an earlier one moved"
        assert b["left"] is None and b["call"] == "2", b  # the caller's environment of this call, nothing left
        assert b["cwd"] == str(launcher) and b["rank_env"] in ("0", "1"), b
    # A red call ends the world (a peer may hang on a collective): the next one has new ranks.
    with pytest.raises(RankFailed, match="rank 1 failed"):
        spawn(_fails_on_rank_1, 2)
    for pid in _pids(first):
        assert not process_alive(pid), "a failed world's rank is still running"
    third = spawn(_state, 2, "three")
    assert not set(_pids(third)) & set(_pids(first))
    _world._close_standing()
    for pid in _pids(third):
        assert not process_alive(pid), "closing the standing world left a rank running"


def _unmarked(rank, world_size):
    return os.getpid()


def test_only_marked_functions_share_ranks(launcher):
    """An unmarked function (it may set globals a new rank lacks) gets ranks of its own each call,
    and leaves the standing world of the marked ones as it was."""
    marked = _pids(spawn(_state, 2, "one"))
    first, second = spawn(_unmarked, 2), spawn(_unmarked, 2)
    assert not set(first) & set(second) and not set(first) & set(marked)
    assert _pids(spawn(_state, 2, "two")) == marked


def test_prove_fresh_starts_new_ranks_for_every_call(launcher, monkeypatch):
    monkeypatch.setenv("CARRY_PROOF_FRESH", "1")
    first, second = spawn(_state, 2, "one"), spawn(_state, 2, "two")
    assert not set(_pids(first)) & set(_pids(second))
    assert not _world._standing
    for pid in _pids(first) + _pids(second):
        assert not process_alive(pid)


@_world.leaves_ranks_clean
def _destroys_the_group(rank, world_size):
    import torch.distributed as dist

    dist.destroy_process_group()
    return os.getpid()


@pytest.fixture
def closed(monkeypatch):
    """The worlds closed during the test (their rank processes, to read their exit codes)."""
    seen = []
    close = _world._World.close

    def spy(world):
        seen.append(world)
        close(world)

    monkeypatch.setattr(_world._World, "close", spy)
    return seen


@pytest.mark.parametrize("leaves", ["parallel-state", "no-group"])
def test_a_call_that_leaves_state_behind_ends_the_world_and_its_ranks_exit(launcher, mcore_tree, closed, leaves):
    if leaves == "parallel-state":
        first = spawn(_leaves_parallel_state, 2, str(mcore_tree))
    else:
        first = spawn(_destroys_the_group, 2)
    assert not _world._standing, f"ranks left with {leaves} were kept"
    # They were told to stop and exited by themselves (killed after a wait they would read -9).
    assert [p.exitcode for p in closed[-1].procs] == [0, 0]
    second = spawn(_state, 2, "after")
    assert not set(first) & set(_pids(second))


@_world.leaves_ranks_clean
def _dies_on_rank_1(rank, world_size):
    if rank == 1:
        os._exit(3)
    return os.getpid()


def test_a_rank_that_dies_without_a_word_fails_the_call_at_once(launcher):
    """A rank that exits without answering (a crash, os._exit) is named with its exit code within a
    second or two, not after the rank timeout (600 s); the next call starts new ranks; and a
    standing rank killed between calls is replaced, not waited for."""
    import time

    t0 = time.monotonic()
    with pytest.raises(RankFailed, match="rank 1 exited with code 3 without an answer"):
        spawn(_dies_on_rank_1, 2)
    assert time.monotonic() - t0 < 30
    first = _pids(spawn(_state, 2, "one"))
    os.kill(first[1], 9)
    deadline = time.monotonic() + 10
    while _world._standing[(2, "fork")].procs[1].is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    second = _pids(spawn(_state, 2, "two"))
    assert not set(first) & set(second)
