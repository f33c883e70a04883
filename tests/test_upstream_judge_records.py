"""tools/upstream_tests.py --judge-records: a run cut before it wrote its result (its machine taken back,
the job killed) is judged from the records its launches left, on the demo upstream of
test_upstream_tests.py, really cut (SIGKILL) between two launches of its patched side.

What the records hold is judged as the live run judged it; what they do not hold is never a verdict: the
test the last launch was in when the run was cut is not run (the cut is no crash), the tests no launch
reached are not run, and a test that refused its launch's world size stays not run. Judging by another
selection than the run's, or judging over a run's written result, is refused.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys

import pytest

from helpers import TOOLS, read_json, stopped_at, tool
import test_upstream_tests as demo

up = demo.up     # the demo upstream's fixture, and its runner
_run = demo._run

CUT_WHILE = "the run was cut while it ran"
CUT_BEFORE = "the run was cut before it"


def _cut_run(up, *extra: str, at: str) -> None:
    """Run the demo's tests, one side at a time, until checkpoint AT (a launch taken), then SIGKILL the run:
    no launch is running then, as when a machine is taken back between two launches."""
    argv = [sys.executable, str(TOOLS / "upstream_tests.py"), "--series", str(up["series"]), "--workdir", str(up["work"]),
            "--cache", str(up["cache"]), "--out", str(up["tmp"] / "out"), "--one-side-at-a-time", "--no-bisect", "--test-timeout", "8", *extra]
    proc = subprocess.Popen(argv, env={**__import__("os").environ, "GTP_CARRY_STOP_AT": at,
                                       "FLAKY_MARKER": str(up["tmp"] / "flaky-marker")},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        stopped_at(proc, at, timeout=300)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stderr.close()


def _rows(out) -> dict[str, dict]:
    return {r["id"].split("::")[-1]: r for r in read_json(out / "megatron-lm" / "result.json")["rows"]}


@pytest.mark.slow
def test_a_run_cut_between_launches_is_judged_from_its_records_and_never_green(up):
    files = ("--files", "tests/unit_tests/test_alpha.py", "--files", "tests/unit_tests/sub/test_beta.py")
    _cut_run(up, *files, at="upstream-patched-launch-1-taken")
    out = up["tmp"] / "out"
    assert not (out / "megatron-lm" / "result.json").exists()   # the cut run wrote no result
    proc, _ = _run(up, *files, "--judge-records", check=1)
    report = read_json(up["tmp"] / "report.json")["upstreams"][0]
    assert report["judged_from_records"] is True and report["ok"] is False, report
    assert report["reason"].startswith("judged from the records of a run that was cut: "), report["reason"]
    rows = _rows(out)
    result = read_json(out / "megatron-lm" / "result.json")
    # what both sides' records hold is judged: each test the patched side's one launch ended on every rank,
    # and the pristine side ran, has its verdict (the fix among them, where that launch reached it)
    from carry.evidence.upstream.results import merge, read_launch
    got = read_launch(out / "megatron-lm" / "patched" / "launch-01-n2", 2)
    ended = {k: merge(v, 2).outcome for k, v in got.tests.items() if len(v) == 2 and k not in got.died_in()[1]}
    pristine = result["sides"]["pristine"]["outcomes"]
    both = [k for k in ended if k in pristine]
    assert both, (ended, pristine)
    for k in both:
        row = rows[k.split("::")[-1]]
        assert (row["pristine"], row["patched"]) == (pristine[k]["outcome"], ended[k]) and row["category"] != "not-compared", row
    if "tests/unit_tests/test_alpha.py::test_fixed_by_the_series" in both:
        assert rows["test_fixed_by_the_series"]["category"] == "fixed", rows
    # the test the patched side's last launch died in, if it died: the cut, not a crash of the patched trees
    side = result["sides"]["patched"]
    cut = [k for k, why in side["not_run"].items() if why.startswith(CUT_WHILE)]
    assert sorted(cut) == sorted(set(got.died_in()[0].values())), (cut, side["not_run"])
    assert all(rows[k.split("::")[-1]]["category"] == "not-compared" for k in cut), rows
    # what no patched launch reached: not run, and the run is incomplete, never green
    before = [k for k, why in side["not_run"].items() if why.startswith(CUT_BEFORE)]
    assert before and all(rows[k.split("::")[-1]]["category"] == "not-compared" for k in before), side["not_run"]
    assert report["status"] in ("incomplete", "failed") and report["not_compared"] >= len(cut) + len(before), report
    assert all(x["replayed"] for x in side["launches"]) and len(side["launches"]) == 1, side["launches"]
    # judged again: the same verdict (the judge's own result is no run's comparison to protect)
    first = read_json(out / "megatron-lm" / "result.json")["rows"]
    _run(up, *files, "--judge-records", check=1)
    assert read_json(out / "megatron-lm" / "result.json")["rows"] == first


@pytest.mark.slow
def test_a_finished_runs_records_judge_as_its_run_did(up, tmp_path):
    """Every way a launch of the demo ends (a crash, a hang, a rank left behind, a world size refused and
    launched again, a module that does not collect), read back from the records alone: the rows of the
    run's own result, outcome for outcome."""
    proc, out = _run(up, "--test-timeout", "8", "--no-bisect", check=1, env={"FLAKY_MARKER": str(up["tmp"] / "m")})
    live = read_json(out / "megatron-lm" / "result.json")
    (out / "megatron-lm" / "result.json").unlink()
    _run(up, "--judge-records", check=1)
    judged = read_json(out / "megatron-lm" / "result.json")
    pairs = lambda doc: {r["id"]: (r["pristine"], r["patched"], r["category"]) for r in doc["rows"]}  # noqa: E731
    assert pairs(judged) == pairs(live)
    # the same reasons, but the exit status of a launch that died, which no record keeps
    reasons = lambda doc: {r["id"]: re.sub(r" \(exit [^)]*\)", "", r["patched_reason"] + r["pristine_reason"])  # noqa: E731
                           for r in doc["rows"]}
    assert reasons(judged) == reasons(live)
    assert judged["counts"] == live["counts"] and live["status"] == judged["status"] == "failed"


def test_judging_refuses_another_selection_a_written_result_and_a_run_with_no_records(up):
    out = up["tmp"] / "out"
    proc, _ = _run(up, "--judge-records", check=2)
    assert "no launch left records" in proc.stderr, proc.stderr
    _cut_run(up, "--files", "tests/unit_tests/test_delta.py", at="upstream-pristine-launch-1-taken")
    proc, _ = _run(up, "--judge-records", "--files", "tests/unit_tests/test_alpha.py", check=2)
    assert "ran other test files than this selection (it ran" in proc.stderr, proc.stderr
    assert not (out / "megatron-lm" / "result.json").exists()
    _run(up, "--judge-records", "--files", "tests/unit_tests/test_delta.py", check=1)   # its own selection: judged
    # a run that wrote its comparison: judging its records would overwrite that verdict
    result = out / "megatron-lm" / "result.json"
    doc = read_json(result)
    doc.pop("judged_from_records")
    result.write_text(json.dumps(doc))
    proc, _ = _run(up, "--judge-records", "--files", "tests/unit_tests/test_delta.py", check=2)
    assert "holds that run's comparison already" in proc.stderr, proc.stderr
    proc = tool("upstream_tests", "--series", up["series"], "--workdir", up["work"], "--out", out, "--judge-records",
                "--select-only", check=2)
    assert "give one" in proc.stderr
    shutil.rmtree(out)


def test_a_side_is_replayed_from_its_launch_folders_as_a_packed_run_keeps_them(tmp_path):
    """Written records, as a run packed on a GPU host keeps them (console.tail.txt, no console.log): a test
    a launch the side's budget killed was in is not run for the budget, never a crash; one that refused
    the world size it ran at with no launch at its size after is not run; one the last launch was in when
    the run was cut is not run for the cut; one no launch reached is not run; the rest keep their outcomes."""
    from types import SimpleNamespace

    from carry.evidence.upstream.taken import BUDGET_WHILE, KILLED_FOR_BUDGET, replay

    def launch(name: str, ranks: dict[str, list[dict]], tail: str = "") -> None:
        folder = tmp_path / "patched" / name
        folder.mkdir(parents=True)
        for rank, events in ranks.items():
            (folder / f"rank-{rank}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
        (folder / "skip.txt").write_text("")
        (folder / "console.tail.txt").write_text(f"the launch's last words\n{tail}\n")

    ids = [f"test_a.py::t{i}" for i in range(1, 7)]
    start = lambda t: {"ev": "start", "id": t, "t": 1.0}  # noqa: E731
    end = lambda t, o="passed", why="": {"ev": "end", "id": t, "outcome": o, "reason": why, "t": 2.0}  # noqa: E731
    asks = "Test requires world_size=4, but got 2"
    first = [{"ev": "collected", "ids": ids, "t": 0.5}, start(ids[0]), end(ids[0]), start(ids[1]),
             end(ids[1], "skipped", asks), start(ids[2])]
    launch("launch-01-n2", {"0": first, "1": first}, tail=KILLED_FOR_BUDGET)
    second = [{"ev": "collected", "ids": ids[3:], "t": 3.0}, start(ids[3]), end(ids[3], "failed", "boom"), start(ids[4])]
    launch("launch-02-n2", {"0": second, "1": second})
    pin = SimpleNamespace(launch="torchrun", nproc=2, cwd=".", upstream="demo", markers="", args=())
    side = SimpleNamespace(name="patched", pin=pin, nproc=None, files=["test_a.py"], out=tmp_path / "patched",
                           compared=frozenset())
    res = replay(side)
    assert {k: v.outcome for k, v in res.outcomes.items()} == {ids[0]: "passed", ids[3]: "failed"}, res.outcomes
    assert res.not_run[ids[2]] == BUDGET_WHILE, res.not_run
    assert res.not_run[ids[1]].startswith("it asks for 4 ranks (Test requires world_size=4"), res.not_run
    assert res.not_run[ids[4]].startswith(CUT_WHILE) and res.not_run[ids[5]].startswith(CUT_BEFORE), res.not_run
    assert [x["launch"] for x in res.launches] == ["launch-01-n2", "launch-02-n2"] and res.launches[0]["timed_out"]
    side.files = ["test_b.py"]   # judged by another selection: refused
    with pytest.raises(Exception, match="ran other test files than this selection"):
        replay(side)
