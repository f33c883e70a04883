"""carry.runner.stream: the one runner's streamed form, as the NeMo-RL harness runs its children with it
(integration/nemo_rl_gtp/harness/host/setup.py): lines as they come, with or without their ends, in a
folder, in a process group of its own; and a timeout that takes down the whole tree the command
started, real processes, and says so."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from carry.errors import CommandError
from carry.runner import stream


def _alive(pid: int) -> bool:
    """Whether PID runs (a zombie nobody reaped counts as dead: its parent here may not reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _gone(pids: list[int], within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def test_lines_come_without_their_ends_and_the_exit_code_is_returned():
    lines: list[str] = []
    rc = stream(["sh", "-c", 'printf "one\\ntwo\\n"; echo err >&2; printf three; exit 3'], lines.append)
    assert rc == 3 and lines == ["one", "two", "err", "three"]


def test_keepends_and_cwd(tmp_path):
    lines: list[str] = []
    rc = stream(["sh", "-c", 'pwd; printf "last, with no end"'], lines.append, cwd=tmp_path, keepends=True)
    assert rc == 0 and lines == [f"{Path(tmp_path).resolve()}\n", "last, with no end"]


def test_a_group_is_a_session_of_its_own_reading_nothing():
    probe = "import os, sys; print(os.getsid(0) == os.getpid(), repr(sys.stdin.read()))"
    lines: list[str] = []
    assert stream([sys.executable, "-c", probe], lines.append, group=True) == 0
    assert lines == ["True ''"]
    lines.clear()
    assert stream([sys.executable, "-c", "import os; print(os.getsid(0) == os.getpid())"], lines.append) == 0
    assert lines == ["False"]  # without group: the caller's session, as before


@pytest.mark.parametrize("ignores_term", [False, True], ids=["plain-tree", "a-child-ignoring-sigterm"])
def test_a_timeout_kills_the_whole_tree_and_says_so(ignores_term):
    """sh starts a grandchild and waits on it; at the timeout the group goes: sh, and its child too,
    even one that ignores SIGTERM and would hold the output open after sh is gone."""
    child = "(trap '' TERM; exec sleep 60)" if ignores_term else "sleep 60"
    script = f"{child} & echo $!; echo started; wait"
    lines: list[str] = []
    t0 = time.monotonic()
    with pytest.raises(CommandError) as err:
        stream(["sh", "-c", script], lines.append, timeout=1)
    took = time.monotonic() - t0
    assert err.value.returncode == 124
    assert "timed out after 1s: its process group was killed" in err.value.message
    assert lines[1:] == ["started"]  # what it said before the timeout was handed on
    grandchild = int(lines[0])
    assert _gone([grandchild]), f"the grandchild {grandchild} outlived the timeout"
    assert took < 20, took  # SIGTERM took the tree (or SIGKILL, what ignored it), not the 60 s sleep


def test_the_harness_stream_logs_the_command_and_the_kill(tmp_path, capsys):
    """setup.stream, the harness's: the command and every byte to its log (and stdout), the kill
    said there too, and exit 124 for the case's record, as before it used carry.runner."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration" / "nemo_rl_gtp"))
    try:
        from harness.host import setup
    finally:
        del sys.path[0]
    with open(tmp_path / "case.log", "w") as log:
        rc = setup.stream(["sh", "-c", "printf 'a\\nb'"], log, env=dict(os.environ), cwd=tmp_path)
        assert rc == 0
        rc = setup.stream(["sh", "-c", "echo going; sleep 60"], log, env=dict(os.environ), timeout=1, echo=False)
        assert rc == 124
    text = (tmp_path / "case.log").read_text()
    assert text == ("$ sh -c printf 'a\\nb'\na\nb"
                    "$ sh -c echo going; sleep 60\ngoing\n\n[run-on-gpu-host] killed after 1s\n")
    assert capsys.readouterr().out == "$ sh -c printf 'a\\nb'\na\nb"
