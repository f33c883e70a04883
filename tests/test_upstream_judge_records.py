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
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

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
            "--cache", str(up["cache"]), "--out", str(up["tmp"] / "out"), "--one-side-at-a-time", "--no-bisect",
            "--test-timeout", "8", *up["ranks"], *extra]
    proc = subprocess.Popen(argv, env={**os.environ, "GTP_CARRY_STOP_AT": at,
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
    # what both sides' records hold is judged: each test the patched side's one launch ended (on the ranks that
    # ran it: a rank torchrun stopped before its first test leaves the other's records standing), and the
    # pristine side ran, has its verdict (the fix among them, where that launch reached it)
    from carry.evidence.upstream.results import merge, read_launch
    got = read_launch(out / "megatron-lm" / "patched" / "launch-01-n2", 2)
    died, cut_short = got.died_in()
    ended = {k: merge(v, 2).outcome for k, v in got.tests.items() if k not in cut_short and k not in died.values()}
    pristine = result["sides"]["pristine"]["outcomes"]
    both = [k for k in ended if k in pristine]
    assert both, (ended, pristine)
    for k in both:
        row = rows[k.split("::")[-1]]
        assert (row["pristine"], row["patched"]) == (pristine[k]["outcome"], ended[k]) and row["category"] != "not-compared", row
    if "tests/unit_tests/test_alpha.py::test_fixed_by_the_series" in both:
        assert rows["test_fixed_by_the_series"]["category"] == "fixed", rows
    # the test the patched side's last launch died in, if it died, and those the launcher cut short in it: the
    # cut, not a crash of the patched trees, and no later launch ran them again
    side = result["sides"]["patched"]
    cut = [k for k, why in side["not_run"].items() if why.startswith(CUT_WHILE)]
    assert sorted(cut) == sorted(set(died.values()) | cut_short), (cut, side["not_run"])
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
    assert not out.exists()   # refused before anything was written there
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


def test_a_side_is_replayed_from_its_launch_folders_as_a_packed_run_keeps_them(tmp_path):
    """Written records, as a run packed on a GPU host keeps them (console.tail.txt, no console.log): a test
    a launch the side's budget killed was in is not run for the budget, never a crash; one that refused
    the world size it ran at with no launch at its size after is not run; one the last launch was in when
    the run was cut is not run for the cut; one no launch reached is not run; the rest keep their outcomes."""
    from types import SimpleNamespace

    from carry.evidence.upstream.launch import replayed as replay
    from carry.evidence.upstream.taken import BUDGET_WHILE, KILLED_FOR_BUDGET

    def launch(name: str, ranks: dict[str, list[dict]], tail: str = "") -> None:
        folder = tmp_path / "patched" / name
        folder.mkdir(parents=True)
        for rank, events in ranks.items():
            (folder / f"rank-{rank}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
        (folder / "skip.txt").write_text("")
        (folder / "console.tail.txt").write_text(f"the launch's last words\n{tail}\n")

    ids = [f"test_a.py::t{i}" for i in range(1, 8)]
    start = lambda t: {"ev": "start", "id": t, "t": 1.0}  # noqa: E731
    end = lambda t, o="passed", why="": {"ev": "end", "id": t, "outcome": o, "reason": why, "t": 2.0}  # noqa: E731
    asks = "Test requires world_size=4, but got 2"
    first = [{"ev": "collected", "ids": ids, "t": 0.5}, start(ids[0]), end(ids[0]), start(ids[1]),
             end(ids[1], "skipped", asks), start(ids[2])]
    launch("launch-01-n2", {"0": first, "1": first}, tail=KILLED_FOR_BUDGET)
    # rank 0 is in t5 at the cut; rank 1 ended t5, then torchrun stopped it in t7 (terminated): neither is a verdict
    second = [{"ev": "collected", "ids": ids[3:], "t": 3.0}, start(ids[3]), end(ids[3], "failed", "boom"), start(ids[4])]
    launch("launch-02-n2", {"0": second, "1": [*second, end(ids[4]), start(ids[6]),
                                                {"ev": "terminated", "id": ids[6], "signal": 15, "t": 4.0}]})
    pin = SimpleNamespace(launch="torchrun", nproc=4, cwd=".", upstream="demo", markers="", args=())
    side = SimpleNamespace(name="patched", pin=pin, nproc=2, files=["test_a.py"], out=tmp_path / "patched",
                           compared=frozenset())
    res = replay(side)
    assert {k: v.outcome for k, v in res.outcomes.items()} == {ids[0]: "passed", ids[3]: "failed"}, res.outcomes
    assert res.not_run[ids[2]] == BUDGET_WHILE, res.not_run
    assert res.not_run[ids[1]].startswith("it asks for 4 ranks (Test requires world_size=4"), res.not_run
    assert res.not_run[ids[4]].startswith(CUT_WHILE) and res.not_run[ids[5]].startswith(CUT_BEFORE), res.not_run
    assert res.not_run[ids[6]].startswith(CUT_WHILE), res.not_run
    assert [x["launch"] for x in res.launches] == ["launch-01-n2", "launch-02-n2"] and res.launches[0]["timed_out"]
    side.files = ["test_b.py"]   # judged by another selection: refused
    with pytest.raises(Exception, match="ran other test files than this selection"):
        replay(side)


CUT_JUDGED = demo.EVIDENCE / "h100" / "2026-12-06-cut-judged"
AFTER_THE_CUT = demo.EVIDENCE / "h100" / "2026-12-06-after-the-cut"
SECOND_RUNS = demo.EVIDENCE / "h100" / "2026-12-06-second-runs"
FIRST_OF_KIND = demo.EVIDENCE / "h100" / "2026-12-06-first-of-kind"
BUILDER_BISECTED = demo.EVIDENCE / "h100" / "2026-12-07-builder-bisected"
GET_BATCH = demo.EVIDENCE / "h100" / "2026-12-07-get-batch"
EIGHT_RANKS = demo.EVIDENCE / "h100" / "2026-12-07-eight-ranks"
SMALL_FILES = demo.EVIDENCE / "h100" / "2026-12-07-small-files"
EIGHT_RANK_SHARD = demo.EVIDENCE / "h100" / "2026-12-07-eight-rank-shard"
MOE_AND_OPTIMIZER = demo.EVIDENCE / "h100" / "2026-12-07-moe-and-optimizer-files"


def _replayed_rows(shard):
    """A committed judged shard (its folder of result.json and the sides' launch folders) replayed from its
    records by launch.replayed, as --judge-records read them: its result and the rows of today's replay."""
    from types import SimpleNamespace

    from carry.evidence.upstream.launch import replayed as replay
    from carry.evidence.upstream.verdict import compare
    result = demo._result_json(shard)
    pin = SimpleNamespace(launch="torchrun", nproc=demo._ci_ranks("megatron-lm"), cwd=".", upstream="megatron-lm",
                          markers="", args=())
    files = [s["path"] for s in result["selection"]]
    sides = {name: replay(SimpleNamespace(name=name, pin=pin, nproc=result["nproc"], files=list(files),
                                          out=shard / name, compared=frozenset(result["tests_compared_before"])))
             for name in ("pristine", "patched")}
    return result, compare(sides["pristine"], sides["patched"])


from carry.evidence.upstream.results import launch_folders, read_launch   # noqa: E402


def _markers_and_ranks(results: list[dict]) -> tuple[str, int]:
    """The marker expression and the ranks a node of CI (nproc) of the Megatron-LM tests pin RESULTS ran."""
    pin = demo._mlm_pin(results[0]["tests"])
    return pin.markers, pin.nproc


def _as_recorded(o: str) -> str:
    # the consoles are not committed: a death faulthandler ended (timeout) reads as a crash from the records alone
    return "crashed" if o == "timeout" else o


def test_the_cut_run_judged_from_its_records_is_what_they_hold(tmp_path):
    """integration/h100/2026-12-06-cut-judged: a run whose machine was given back before it wrote its result, judged by
    --judge-records. Replayed again from the committed records, each shard's rows are its result's, test by test, but
    for shard 1's 35 whose records on a side came after their rank's CUDA context broke, and shard 2's 5 skips that
    asked for eight ranks (not compared today); the README's tables are its counts; shard 2's one regression (a crash on
    the patched trees, unconfirmed) stands, and shard 1 has none. Write a failure into a passed test's patched record: a
    regression more."""
    tables = demo._readme_tables((CUT_JUDGED / "README.md").read_text())
    run = demo._unzipped(CUT_JUDGED, tmp_path / "good")
    for i, sub in enumerate(("megatron-lm", "megatron-lm-2")):
        result, rows = _replayed_rows(run / "run" / sub / "megatron-lm")
        assert result["judged_from_records"] is True and result["bisect"] == "not finished", result["reason"]
        assert result["counts"]["*"] == tables[i], (sub, result["counts"]["*"], tables[i])
        # a skip that asked for the ranks CI has (its device's judge took it for a verdict) is not compared today
        judged = [demo._as_judged_today(result, r) for r in result["rows"]]
        assert sum(r != j for r, j in zip(result["rows"], judged, strict=True)) == (0, 5)[i]
        recorded = {r["id"]: (_as_recorded(r["pristine"]), _as_recorded(r["patched"]), r["category"]) for r in judged}
        today = {r.id: (_as_recorded(r.pristine), _as_recorded(r.patched), r.category) for r in rows}
        # what a rank said after its CUDA context broke is no verdict today (results._set_poisoned): those tests
        # alone differ, not compared now, their records on a side set apart for a broken CUDA context
        poisoned = {i for i, v in today.items() if v != recorded[i]}
        assert all(today[i][2] == "not-compared" and "not-run" in today[i][:2] for i in poisoned), poisoned
        broken = {i for side in ("pristine", "patched") for launch, world in launch_folders(run / "run" / sub / "megatron-lm" / side)
                  for i, why in read_launch(launch, world).astray.items() if "CUDA context" in why}
        assert poisoned <= broken, sorted(poisoned - broken)
        assert len(poisoned) == (35, 0)[i] and today.keys() == recorded.keys(), (sub, len(poisoned))
        regressions = [r.id for r in rows if r.category == "regression"]
        assert regressions == ([] if i == 0 else [
            "tests/unit_tests/training/test_param_norm.py::test_moe_gradient_stats_and_clipping_count_each_logical_"
            "gradient_once[expert-parallel-optimizer]"]), regressions
        assert sum(n for k, n in tables[i].items() if k != "not-compared") == (21, 145)[i]
    broken = demo._unzipped(CUT_JUDGED, tmp_path / "broken")
    victim = demo._failure_written_in(broken / "run" / "megatron-lm" / "megatron-lm")
    _, rows = _replayed_rows(broken / "run" / "megatron-lm" / "megatron-lm")
    assert [r.id for r in rows if r.category == "regression"] == [victim]


def test_the_run_after_the_cut_has_no_regression_and_the_dataset_tests_fixed(tmp_path):
    """integration/h100/2026-12-06-after-the-cut, judged again from the ranks' records: two shards incomplete with no
    regression among 16 and 44 compared, the tests earlier runs compared passed over (619 and 435), the README's tables
    these counts; 28 of its 29 fixed tests the dataset tests whose pristine compile_helpers() fails. With every
    committed run, 142 of the 208 files compared whole (145 before a known failure where a side met the machine's limit was no verdict; 149 by the judge of its day, before it read a skip that names
    the devices it needs as asking for them; 142 before the standing read regressions as h100/2026-12-07-small-files does); the cut run's unconfirmed regression keeps its file open (no other run
    compared that test yet). Write a failure into a passed test's patched record in shard 1: a regression."""
    run = demo._unzipped(AFTER_THE_CUT, tmp_path / "good")
    demo._shards_judged_again(run, AFTER_THE_CUT / "README.md", [(16, 619), (44, 435)], least=5)
    fixed = [r for sub in ("megatron-lm", "megatron-lm-2")
             for r in demo._result_json(run / "run" / sub / "megatron-lm")["rows"] if r["category"] == "fixed"]
    data = [r for r in fixed if r["id"].startswith("tests/unit_tests/data/")]
    assert (len(fixed), len(data)) == (29, 28) and all(r["pristine_reason"].startswith("SystemExit: 1") for r in data)
    pin = demo._result_json(AFTER_THE_CUT / "run" / "megatron-lm" / "megatron-lm")["tests"]
    results = demo._committed_through("megatron-lm", AFTER_THE_CUT.name)
    # 31 tests fewer compared than the device's judge had them: their records came after their rank's CUDA
    # context broke (results._set_poisoned, h100/2026-12-06-first-of-kind); no run up to this one keeps a launch's
    # command, so none tells the markers it ran under: what they found deselected counts for nothing
    assert demo._standing(pin, results) == {
        "files": 208, "compared_whole": 142, "deselected_whole": 0, "left": 66, "left_with_tests_not_compared": 52,
        "tests_not_compared": 1713, "left_with_no_test_known": 14, "tests_compared_in_those_left": 1206}
    from carry.evidence.upstream.verdict import Compared
    assert "tests/unit_tests/training/test_param_norm.py" not in Compared.of(results, *_markers_and_ranks(results)).whole
    demo._a_written_failure_is_red(AFTER_THE_CUT, tmp_path, [(16, 619), (44, 435)], 5, "megatron-lm")


CUT_CRASH = ("tests/unit_tests/training/test_param_norm.py::test_moe_gradient_stats_and_clipping_count_each_logical_"
             "gradient_once[expert-parallel-optimizer]")


def test_the_second_runs_find_the_cut_runs_crash_flaky_and_confirm_the_dataset_tests_fixed(tmp_path):
    """integration/h100/2026-12-06-second-runs, judged again from the ranks' records: two shards incomplete with no
    regression among 139 and 85 compared, the tests earlier runs compared passed over (472 and 630), the README's tables
    these counts. The cut run's unconfirmed regression failed on the patched trees, then passed on the same trees
    (flaky, its pristine runs passed), and keeps test_param_norm.py open; the 29 dataset tests fixed by the series
    passed twice on the patched trees (the bisection reached no prefix that tells a patch: not bisected). With every
    committed run, 143 of the 208 files compared whole (148 before a known failure where a side met the machine's limit was no verdict; 152 by the judge of its day, 145 before the standing read
    regressions as h100/2026-12-07-small-files does). Write a failure into a passed test's patched record in shard 2: a
    regression."""
    from carry.evidence.upstream.verdict import Compared
    shards = [(139, 472), (85, 630)]
    run = demo._unzipped(SECOND_RUNS, tmp_path / "good")
    demo._shards_judged_again(run, SECOND_RUNS / "README.md", shards, least=5)
    first, second = (demo._result_json(run / "run" / sub / "megatron-lm") for sub in ("megatron-lm", "megatron-lm-2"))
    crash = next(r for r in first["rows"] if r["id"] == CUT_CRASH)
    assert (crash["category"], crash["pristine"], crash["patched"]) == ("flaky", "passed", "failed"), crash
    assert crash["note"] == "flaky: failed on the patched trees, then passed on the same trees"
    data = [r for r in second["rows"] if r["category"] == "fixed" and r["id"].startswith("tests/unit_tests/data/")]
    assert len(data) == 29 and all(r["pristine_reason"].startswith("SystemExit: 1") and r["patched"] == "passed"
                                   for r in data), data
    bisected = {e["id"]: e for e in second["bisect"]}
    assert all(bisected[r["id"]]["note"].startswith("not bisected: ") for r in data)   # confirmed, then cut
    results = demo._committed_through("megatron-lm", SECOND_RUNS.name)
    # 31 tests fewer compared than the device's judge had them: their records came after their rank's CUDA
    # context broke (results._set_poisoned, h100/2026-12-06-first-of-kind)
    assert demo._standing(first["tests"], results) == {
        "files": 208, "compared_whole": 143, "deselected_whole": 7, "left": 58, "left_with_tests_not_compared": 51,
        "tests_not_compared": 1578, "left_with_no_test_known": 7, "tests_compared_in_those_left": 1340}
    assert "tests/unit_tests/training/test_param_norm.py" not in Compared.of(results, *_markers_and_ranks(results)).whole
    demo._a_written_failure_is_red(SECOND_RUNS, tmp_path, shards, 5, "megatron-lm-2")


def test_the_first_of_kind_run_sets_apart_a_broken_cuda_context_and_bisects_each_kind_first(tmp_path):
    """integration/h100/2026-12-06-first-of-kind, judged again from the ranks' records: two shards incomplete with no
    regression among 87 and 96 compared, the tests earlier runs compared passed over (394 and 685), the README's tables
    these counts. Shard 2's device judge counted 131: 35 tests a rank ran after a device-side assert broke its CUDA
    context, set apart today (not compared). The run of data/test_builder.py again (no --compared) compared 13, 9 of
    them fixed; its bisection asked for the first test of each kind alone (test_builder and test_fast_builder, failing
    alike on the pristine base) and its budget ran out before a patch was named. With every committed run, 143 of the
    208 files compared whole (148 before a known failure where a side met the machine's limit was no verdict; 152 by the judge of its day, 145 before the standing read regressions as
    h100/2026-12-07-small-files does). Write a failure into a passed test's patched record in shard 1: a regression."""
    shards = [(87, 394), (96, 685)]
    run = demo._unzipped(FIRST_OF_KIND, tmp_path / "good")
    demo._shards_judged_again(run, FIRST_OF_KIND / "README.md", shards, least=5)
    second, _, _ = demo._judged_again(run, "megatron-lm", 5, "run/megatron-lm-2")
    assert {side: len(ids) for side, ids in second["astray_today"].items()} == {"pristine": 35, "patched": 35}
    assert all("CUDA context" in why for ids in second["astray_today"].values() for why in ids.values())
    again, rows, total = demo._judged_again(run, "megatron-lm", 5, "run/megatron-lm-again")
    assert total == demo._readme_tables((FIRST_OF_KIND / "README.md").read_text())[2] == again["counts"]["*"]
    assert (total["fixed"], sum(total.values()) - total["not-compared"], again["tests_compared_before"]) == (9, 13, [])
    bisect = run / "run" / "megatron-lm-again" / "megatron-lm" / "bisect"
    asked = {d.name: sorted({x.split("::")[1].split("[")[0] for f in d.glob("launch-*/only.txt") for x in f.read_text().split()})
             for d in bisect.iterdir() if d.is_dir()}
    assert asked == {k: ["test_builder", "test_fast_builder"] for k in ("k000-fixed", "k005-fixed", "k010-fixed")}, asked
    assert all(len((d / "only.txt").read_text().split()) <= 2 for d in bisect.glob("*/launch-*"))   # the firsts alone
    notes = {e["id"].split("::")[1].split("[")[0]: e["note"] for e in json.loads((bisect / "bisect.json").read_text())
             if e["note"].startswith("not bisected")}
    assert notes == {"test_builder": notes["test_builder"], "test_fast_builder": notes["test_fast_builder"]}
    assert "the first 7 patch(es)" in notes["test_builder"] and "the first 5 patch(es)" in notes["test_fast_builder"]
    pin = again["tests"]
    assert demo._standing(pin, demo._committed_through("megatron-lm", FIRST_OF_KIND.name)) == {
        "files": 208, "compared_whole": 143, "deselected_whole": 7, "left": 58, "left_with_tests_not_compared": 51,
        "tests_not_compared": 1450, "left_with_no_test_known": 7, "tests_compared_in_those_left": 1468}
    demo._a_written_failure_is_red(FIRST_OF_KIND, tmp_path, shards, 5, "megatron-lm")


BUILDER_FIRST = "tests/unit_tests/data/test_builder.py::test_fast_builder[0-131072-True-False-True-True-False]"


def _probed(bisect: Path, test: str) -> dict[int, str]:
    """Each probe of a bisection folder (kNNN-fixed: the first NNN patches) that holds records of TEST: its
    outcome there, merged again from the ranks' own records."""
    out = {}
    for probe in sorted(bisect.glob("k[0-9][0-9][0-9]-fixed")):
        for launch, world in launch_folders(probe):
            records = read_launch(launch, world).tests.get(test)
            if records:
                out[int(probe.name[1:4])] = demo.merge(records, world).outcome
    return out


def test_the_builder_run_bisects_the_dataset_kind_to_its_patch_and_records_it(tmp_path):
    """integration/h100/2026-12-07-builder-bisected, judged again from the ranks' records: two shards incomplete with no
    regression among 64 and 71 compared, the tests earlier runs compared passed over (769 and 412), the README's tables
    these counts. Shard 1's bisection of the first dataset test of its kind: its probes' own records fail it with the
    first 0, 5, 7 and 8 patches and pass it with the first 9, so it names mlm-dataset-helpers-wheel, the patch
    series.toml records it beside; the 24 others of its kind are not bisected, and not recorded. The --bisect-again run
    beside them named no patch. With every committed run, 1,379 tests left by today's judge (1,349 before a known failure where a side met the machine's limit was no verdict; 1,346 by the judge of its
    day; 1,420 before it; 1,405 before the standing read regressions as h100/2026-12-07-small-files does). Write a
    failure into a passed test's patched record in shard 2: a regression."""
    from carry.series.repo import load_series
    shards = [(64, 769), (71, 412)]
    run = demo._unzipped(BUILDER_BISECTED, tmp_path / "good")
    demo._shards_judged_again(run, BUILDER_BISECTED / "README.md", shards, least=5)
    first = demo._result_json(run / "run" / "megatron-lm" / "megatron-lm")
    named = {e["id"]: e for e in first["bisect"] if e.get("first_patch")}
    assert list(named) == [BUILDER_FIRST], list(named)
    entry = named[BUILDER_FIRST]
    assert (entry["first_patch"], entry["first_index"], entry["changed"]) == ("mlm-dataset-helpers-wheel", 9, True)
    probed = _probed(run / "run" / "megatron-lm" / "megatron-lm" / "bisect", BUILDER_FIRST)
    assert {k: probed[k] for k in (0, 5, 7, 8, 9)} == {0: "failed", 5: "failed", 7: "failed", 8: "failed", 9: "passed"}, probed
    assert [(p["k"], p["status"]) for p in entry["probes"]] == [(k, probed[k]) for k in (0, 5, 7, 8, 9)]
    kind = [r for r in first["rows"] if r["category"] == "fixed"]
    assert len(kind) == 25 and all(r["pristine_reason"] == "SystemExit: 1" and r["patched"] == "passed" for r in kind)
    others = [e for e in first["bisect"] if e["id"] != BUILDER_FIRST]
    assert len(others) == 24 and all(e["note"].startswith("not bisected: ") and "turns at patch 9 of 10, "
                                     "mlm-dataset-helpers-wheel" in e["note"] for e in others), others[:1]
    patch = next(p for p in load_series("gtp").patches if p.id == "mlm-dataset-helpers-wheel")
    assert f"megatron-lm:{BUILDER_FIRST}" in patch.upstream_tests, patch.upstream_tests   # and h100/2026-12-07-small-files' two
    again = demo._result_json(run / "run" / "megatron-lm-bisect" / "megatron-lm")
    assert again["bisected_again"] == 9 and not [e for e in again["bisect"] if e.get("first_patch")]
    assert again["counts"]["*"] == demo._readme_tables((BUILDER_BISECTED / "README.md").read_text())[2]
    pin = first["tests"]
    assert demo._standing(pin, demo._committed_through("megatron-lm", BUILDER_BISECTED.name)) == {
        "files": 208, "compared_whole": 146, "deselected_whole": 7, "left": 55, "left_with_tests_not_compared": 48,
        "tests_not_compared": 1379, "left_with_no_test_known": 7, "tests_compared_in_those_left": 1491}
    demo._a_written_failure_is_red(BUILDER_BISECTED, tmp_path, shards, 5, "megatron-lm-2")


@pytest.mark.slow
def test_a_nightly_cell_its_timeout_cut_is_judged_from_its_records_and_never_green(up, tmp_path):
    """The upstream-tests cell of a night, cut by its timeout (90 s, a margin on a slow host) while its patched side
    waits after its first launch (GTP_CARRY_STOP_AT): the nightly judges what the launches left (--judge-records, no
    test run again), and the cell is failed where those records hold a regression, an error otherwise, never passed;
    its counts are the judged result's, and summary.md says the cell was cut."""
    config = tmp_path / "nightly.toml"
    config.write_text(f'[nightly]\nseries = ["{up["series"]}"]\n\n[images.host]\nlauncher = "local"\n\n'
                      '[[tests]]\nname = "upstream-tests"\nkind = "upstream-tests"\nimages = ["host"]\ntimeout_s = 90\n')
    out = tmp_path / "night"
    tool("nightly", "--config", config, "--out", out, "--workdir", tmp_path / "nwork", "--cache", up["cache"],
         "--source", f"megatron-lm={up['tmp'] / 'upstream'}", check=1, timeout=600,
         env={"GTP_CARRY_STOP_AT": "upstream-patched-launch-1-taken"})
    (run,) = read_json(out / "nightly.json")["runs"]
    assert run["timed_out"] is True and run["status"] != "passed", run
    assert run["reason"].startswith("megatron-lm's tests timed out after 90s; judged from the records its launches "
                                    "left: judged from the records of a run that was cut: "), run["reason"]
    result = read_json(Path(run["log"]))
    assert result["judged_from_records"] is True and result["bisect"] == "not finished", result["reason"]
    u = run["upstream_tests"]
    assert u["judged_from_records"] is True and u["counts"] == result["counts"] and u["bisect"] == [], u
    launches = result["sides"]["patched"]["launches"]
    assert len(launches) == 1 and launches[0]["replayed"], launches   # the one launch the cut run had taken
    regressed = "regression" in result["counts"]["*"]
    assert run["status"] == ("failed" if regressed else "error"), (run["status"], result["counts"])
    assert "upstream-tests[megatron-lm]: cut at its timeout, judged from the records its launches left" in (
        out / "summary.md").read_text()


def test_the_get_batch_run_compares_the_largest_files_left_and_its_skips_that_ask_for_eight_ranks_are_no_verdict(tmp_path):
    """integration/h100/2026-12-07-get-batch, judged again from the ranks' records: two shards incomplete with no
    regression among the device's 389 and 111 compared, the tests earlier runs compared passed over (16 and 223), the
    README's tables the device's counts. 83 of shard 1's skips name the devices their test needs ("(8 > 4)", "requires 8
    GPUs"): today's judge has them not compared, each asking for eight ranks; shard 2's 16 skips check a fixed 8 (CI
    skips them too) and stand. Shard 1's six moved tests are flaky by its bisection's own records; the --bisect-again
    beside them named no patch. With every committed run up to it, 998 tests left (967 before a known failure where a side met the machine's limit was no verdict; 1,023 before the standing read
    regressions as h100/2026-12-07-small-files does). Write a failure into a passed test's patched record in shard 1: a
    regression."""
    shards = [(389, 16), (111, 223)]
    run = demo._unzipped(GET_BATCH, tmp_path / "good")
    assert demo._shards_judged_again(run, GET_BATCH / "README.md", shards, least=5) == [83, 0]
    first, rows, _ = demo._judged_again(run, "megatron-lm", 5, "run/megatron-lm")
    asked = [r for r in rows if r.note == "it asks for 8 ranks"]
    device = {d["id"]: d for d in first["rows"]}
    assert len(asked) == 83 and all(device[r.id]["category"] == "skipped" for r in asked)
    assert {device[r.id]["patched_reason"].split(" (")[0] for r in asked} == {
        "Skipping test because tp_size * pp_size * cp_size > torch.cuda.device_count()",
        "Skipping test because tp_size * cp_size > torch.cuda.device_count()", "requires 8 GPUs"}
    assert all(why.endswith("(8 > 4)") for why in (device[r.id]["patched_reason"] for r in asked) if "device_count" in why)
    flaky = [r for r in rows if r.category == "flaky"]
    assert len(flaky) == 6 and not [e for e in first["bisect"] if e.get("first_patch")]
    second = demo._result_json(run / "run" / "megatron-lm-2" / "megatron-lm")
    kept = {d["patched_reason"] for d in second["rows"] if d["category"] == "skipped"}
    assert kept == {"TP*PP*EP > 8 is larger than world size"}, kept
    again = demo._result_json(run / "run" / "megatron-lm-bisect" / "megatron-lm")
    assert again["bisected_again"] == 9 and not [e for e in again["bisect"] if e.get("first_patch")]
    assert again["counts"]["*"] == demo._readme_tables((GET_BATCH / "README.md").read_text())[2]
    assert demo._standing(first["tests"], demo._committed_through("megatron-lm", GET_BATCH.name)) == {
        "files": 208, "compared_whole": 147, "deselected_whole": 7, "left": 54, "left_with_tests_not_compared": 47,
        "tests_not_compared": 998, "left_with_no_test_known": 7, "tests_compared_in_those_left": 1801}
    demo._a_written_failure_is_red(GET_BATCH, tmp_path, shards, 5, "megatron-lm")


GET_BATCH_FIXED = "tests/unit_tests/data/test_get_batch.py::test_pretrain_batch[1-True-1024-4-2-1]"


def test_the_eight_ranks_run_compares_thirteen_files_and_its_shared_gpu_failures_are_flaky_not_regressions(tmp_path):
    """integration/h100/2026-12-07-eight-ranks, judged again from the ranks' records: two shards incomplete with no
    regression among the device's 80 and 212 compared, the tests earlier runs compared passed over (338 and 384), the
    README's tables the device's counts, and today's judge refusing none of them. Its five flaky tests failed on the
    patched trees for the shared GPU (out of memory, cuBLAS's allocation) and passed there when the bisection ran them
    again: flaky by the bisection's own records, none a patch's. Its one fixed test crashed the pristine side's launch
    (EAGAIN on two ranks) and is not bisected, and no patch records it. Shard 2's skips are the ones upstream's CI takes
    too. With every committed run up to it, 715 tests left (683 before a known failure where a side met the machine's limit was no verdict; 739 before the standing read regressions as
    h100/2026-12-07-small-files does). Write a failure into a passed test's patched record in shard 2: a regression."""
    from carry.series.repo import load_series
    shards = [(80, 338), (212, 384)]
    run = demo._unzipped(EIGHT_RANKS, tmp_path / "good")
    assert demo._shards_judged_again(run, EIGHT_RANKS / "README.md", shards, least=5) == [0, 0]
    first, second = (demo._result_json(run / "run" / sub / "megatron-lm") for sub in ("megatron-lm", "megatron-lm-2"))
    flaky = [r for res in (first, second) for r in res["rows"] if r["category"] == "flaky"]
    assert len(flaky) == 5 and all((r["pristine"], r["patched"]) == ("passed", "failed") for r in flaky), flaky
    assert {r["patched_reason"].split(":")[0] for r in flaky} == {"torch.OutOfMemoryError", "RuntimeError"}
    assert all("out of memory" in r["patched_reason"] or "CUBLAS_STATUS_ALLOC_FAILED" in r["patched_reason"] for r in flaky)
    bisected = {e["id"]: e for res in (first, second) for e in res["bisect"]}
    assert all(bisected[r["id"]]["category"] == "flaky" for r in flaky) and not [
        e for e in bisected.values() if e.get("first_patch")]
    (fixed,) = [r for r in first["rows"] if r["category"] == "fixed"]
    assert (fixed["id"], fixed["pristine"], fixed["patched"]) == (GET_BATCH_FIXED, "crashed", "passed"), fixed
    assert bisected[GET_BATCH_FIXED]["note"].startswith("not bisected: the probe of the first 0 patch(es) did not reach it")
    launch = run / "run" / "megatron-lm" / "megatron-lm" / "pristine" / "launch-06-n8"
    eagain = sorted(int(rank) for rank, rec in read_launch(launch, 8).tests[GET_BATCH_FIXED].items()
                    if (rec["outcome"], rec["reason"]) == ("failed", "RuntimeError: Resource temporarily unavailable"))
    assert eagain == [0, 3], eagain
    assert not [p.id for p in load_series("gtp").patches if f"megatron-lm:{GET_BATCH_FIXED}" in p.upstream_tests]
    kept = {d["patched_reason"] for d in second["rows"] if d["category"] == "skipped"}
    assert kept == {"TP*PP*EP > 8 is larger than world size", "EP > 1 needs to be used with MoE"}, kept
    at_eight = [r["id"] for res in (first, second) for r in res["rows"] if r["category"] != "not-compared"
                and res["sides"]["patched"]["outcomes"][r["id"]]["world"] == 8]
    assert len(at_eight) == 71, len(at_eight)   # the README's figure: launched at the size they asked for
    assert demo._standing(first["tests"], demo._committed_through("megatron-lm", EIGHT_RANKS.name)) == {
        "files": 208, "compared_whole": 149, "deselected_whole": 7, "left": 52, "left_with_tests_not_compared": 45,
        "tests_not_compared": 715, "left_with_no_test_known": 7, "tests_compared_in_those_left": 2000}
    demo._a_written_failure_is_red(EIGHT_RANKS, tmp_path, shards, 5, "megatron-lm-2")


SMALL_FILES_NAMED = ("tests/unit_tests/data/test_builder.py::test_builder",
                     "tests/unit_tests/data/test_builder.py::test_fast_builder[0.005-131072-True-False-True-False-False]")


def test_the_small_files_run_has_no_regression_and_bisects_the_last_dataset_kind_to_its_patch(tmp_path):
    """integration/h100/2026-12-07-small-files, judged again from the ranks' records: two shards incomplete with no
    regression among the device's 97 and 49 compared, the tests earlier runs compared passed over (390 and 666), the
    README's tables the device's counts, and today's judge refusing none of them. Its six flaky tests are a patch's
    in none: four failed on the patched trees and passed there when the bisection ran them again, two failed on the
    pristine side and the probe of the pristine base passed them. The bisection again of get-batch's cut bisection
    (beside the shards): its probes' own records fail test_builder and the first test of the 0.005 kind with the
    first 0, 5, 7 and 8 patches and pass them with the first 9, so it names mlm-dataset-helpers-wheel, which records
    both (--record-fixed); the kind's 7 others are counted, not recorded. With every committed run, 158 of the 208
    files compared whole and 629 tests left (165 and 596 before a known failure where a side met the machine's limit was no verdict). Write a failure into a passed test's patched record in shard 1: a
    regression."""
    from carry.series.repo import load_series
    shards = [(97, 390), (49, 666)]
    run = demo._unzipped(SMALL_FILES, tmp_path / "good")
    assert demo._shards_judged_again(run, SMALL_FILES / "README.md", shards, least=5) == [0, 0]
    first, second = (demo._result_json(run / "run" / sub / "megatron-lm") for sub in ("megatron-lm", "megatron-lm-2"))
    bisected = {e["id"]: e for res in (first, second) for e in res["bisect"]}
    assert not [e for e in bisected.values() if e.get("first_patch")], bisected
    again = [r for r in first["rows"] if r["category"] == "flaky"]
    assert len(again) == 4 and all(r["pristine"] == "passed" and r["patched"] in ("failed", "timeout") for r in again)
    assert all(bisected[r["id"]]["note"].endswith("on the patched trees, then passed on the same trees") for r in again)
    base = [r for r in second["rows"] if r["category"] == "flaky"]
    assert [(r["pristine"], r["patched"]) for r in base] == [("error", "passed")] * 2, base
    assert all("out of memory" in r["pristine_reason"] for r in base)
    assert all(bisected[r["id"]]["note"] == "the pristine base gives the same result: no patch changes it" for r in base)
    # the bisection again: named by its probes' own records, recorded beside the patch
    res = demo._result_json(run / "run" / "megatron-lm-bisect" / "megatron-lm")
    assert res["counts"]["*"] == demo._readme_tables((SMALL_FILES / "README.md").read_text())[2]
    named = {e["id"]: e for e in res["bisect"] if e.get("first_patch")}
    assert tuple(sorted(named)) == SMALL_FILES_NAMED, sorted(named)
    for test, entry in named.items():
        assert (entry["first_patch"], entry["first_index"], entry["changed"]) == ("mlm-dataset-helpers-wheel", 9, True)
        probed = _probed(run / "run" / "megatron-lm-bisect" / "megatron-lm" / "bisect", test)
        assert {k: probed[k] for k in (0, 5, 7, 8, 9)} == {0: "failed", 5: "failed", 7: "failed", 8: "failed", 9: "passed"}
        assert [(p["k"], p["status"]) for p in entry["probes"]] == [(k, probed[k]) for k in (0, 5, 7, 8, 9)]
    kind = [r for r in res["rows"] if r["category"] == "fixed"]
    assert len(kind) == 9 and all(r["patched"] == "passed" for r in kind)
    patch = next(p for p in load_series("gtp").patches if p.id == "mlm-dataset-helpers-wheel")
    assert sorted(patch.upstream_tests) == sorted(f"megatron-lm:{t}" for t in (BUILDER_FIRST, *SMALL_FILES_NAMED))
    assert demo._standing(first["tests"], demo._committed_through("megatron-lm", SMALL_FILES.name)) == {
        "files": 208, "compared_whole": 158, "deselected_whole": 7, "left": 43, "left_with_tests_not_compared": 36,
        "tests_not_compared": 629, "left_with_no_test_known": 7, "tests_compared_in_those_left": 1824}
    demo._a_written_failure_is_red(SMALL_FILES, tmp_path, shards, 5, "megatron-lm")


def test_the_eight_rank_shard_compares_thirty_eight_rank_tests_with_no_regression(tmp_path):
    """integration/h100/2026-12-07-eight-rank-shard, judged again from the ranks' records: one shard of fourteen files
    whose tests left ask for eight ranks, incomplete with no regression among the device's 30 compared, the tests
    earlier runs compared passed over (706), the README's table the device's counts, and today's judge refusing none.
    Every compared test ran at eight ranks on both sides (the earlier runs told them so: no four-rank refusal first),
    and the one four-rank outcome, a test no run had told of, refused that size and is no verdict. With every
    committed run, 163 of the 208 files compared whole and 599 tests left (170 and 566 before a known failure where a side met the machine's limit was no verdict). Write a failure into a passed test's
    patched record: a regression."""
    shards = [(30, 706)]
    run = demo._unzipped(EIGHT_RANK_SHARD, tmp_path / "good")
    assert demo._shards_judged_again(run, EIGHT_RANK_SHARD / "README.md", shards, least=5) == [0]
    res = demo._result_json(run / "run" / "megatron-lm" / "megatron-lm")
    compared = [r["id"] for r in res["rows"] if r["category"] != "not-compared"]
    assert len(compared) == 30 and {r["category"] for r in res["rows"] if r["id"] in compared} == {"passed"}
    worlds = {s: {res["sides"][s]["outcomes"][i]["world"] for i in compared} for s in ("pristine", "patched")}
    assert worlds == {"pristine": {8}, "patched": {8}}, worlds
    refused = ("tests/unit_tests/transformer/moe/test_moe_layer_discrepancy.py::"
               "TestMoELayerDispatcherDiscrepancy::test_moe_layer_dispatcher_discrepancy[1-8-False-8]")
    for side in ("pristine", "patched"):
        at_four = read_launch(run / "run" / "megatron-lm" / "megatron-lm" / side / "launch-01-n4", 4).tests
        assert set(at_four) == {refused}, at_four
        assert res["sides"][side]["not_run"][refused].startswith("it asks for 8 ranks (RuntimeError: world_size (4)")
    assert next(r for r in res["rows"] if r["id"] == refused)["category"] == "not-compared"
    assert demo._standing(res["tests"], demo._committed_through("megatron-lm", EIGHT_RANK_SHARD.name)) == {
        "files": 208, "compared_whole": 163, "deselected_whole": 7, "left": 38, "left_with_tests_not_compared": 31,
        "tests_not_compared": 599, "left_with_no_test_known": 7, "tests_compared_in_those_left": 1734}
    demo._a_written_failure_is_red(EIGHT_RANK_SHARD, tmp_path, shards, 5, "megatron-lm")


def test_the_moe_and_optimizer_run_compares_fifty_eight_eight_rank_tests_with_no_regression(tmp_path):
    """integration/h100/2026-12-07-moe-and-optimizer-files, judged again from the ranks' records: one shard of nine
    files whose tests left ask for eight ranks, incomplete with no regression among the device's 58 compared, the
    tests earlier runs compared passed over (708), the README's table the device's counts. Every test compared ran
    at eight ranks on both sides; the one the pristine launch died in passed on the patched trees and on the
    pristine base when the bisection ran it again: flaky, no patch's. Its 7 of test_serialization.py leave one of
    that file (a test both sides ran past the per-test timeout on, no verdict). Two of its both-failed are no verdict
    by today's judge (the pristine side out of the GPU's memory, the patched past the timeout). With every committed
    run, 163 of the 208 files compared whole and 544 tests left. Write a failure into a passed test's patched record:
    a regression."""
    shards = [(58, 708)]
    run = demo._unzipped(MOE_AND_OPTIMIZER, tmp_path / "good")
    assert demo._shards_judged_again(run, MOE_AND_OPTIMIZER / "README.md", shards, least=5) == [0]
    res = demo._result_json(run / "run" / "megatron-lm" / "megatron-lm")
    compared = [r for r in res["rows"] if r["category"] != "not-compared"]
    worlds = {s: {res["sides"][s]["outcomes"][r["id"]]["world"] for r in compared} for s in ("pristine", "patched")}
    assert worlds == {"pristine": {8}, "patched": {8}}, worlds
    flaky = [r for r in res["rows"] if r["category"] == "flaky"]
    assert [(r["pristine"], r["patched"]) for r in flaky] == [("crashed", "passed")], flaky
    probe = next(e for e in res["bisect"] if e["id"] == flaky[0]["id"])
    assert [(p["k"], p["status"]) for p in probe["probes"]] == [(0, "passed")] and probe["first_patch"] is None, probe
    serialization = "tests/unit_tests/dist_checkpointing/test_serialization.py"
    assert sum(r["id"].startswith(serialization) for r in compared) == 7
    before = demo._committed_through("megatron-lm", EIGHT_RANK_SHARD.name)
    after = demo._committed_through("megatron-lm", MOE_AND_OPTIMIZER.name)
    from carry.evidence.upstream.check import _compared_before
    pin = demo._mlm_pin(res["tests"])
    earlier, now = (_compared_before("megatron-lm", pin, "55a9fda873e9", r)[0] for r in (before, after))
    # its tests left all compared now, but for test_empty_load, past the per-test timeout on both sides
    # (h100/2026-12-07-get-batch): no verdict (verdict.no_verdict), the file not whole
    empty_load = serialization + "::TestSerialization::test_empty_load"
    assert {t for t in now.known[serialization] if t not in now.by} == {empty_load}
    assert len([t for t in earlier.known[serialization] if t not in earlier.by]) == 8
    assert serialization not in now.whole
    assert demo._standing(res["tests"], after) == {
        "files": 208, "compared_whole": 163, "deselected_whole": 7, "left": 38, "left_with_tests_not_compared": 31,
        "tests_not_compared": 544, "left_with_no_test_known": 7, "tests_compared_in_those_left": 1789}
    demo._a_written_failure_is_red(MOE_AND_OPTIMIZER, tmp_path, shards, 5, "megatron-lm")
