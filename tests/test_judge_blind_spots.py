"""The judge's blind spots as classes (issue 40, item 4): each case here passed (or was skipped) before; each
must now fail, or not count as the marker it is not, naming why. The classes, each read wherever the judge
reads a run's output (the result line, a metrics file, the log):

1. a JSON object with a key twice: which value counts is the reader's choice, so the output is ambiguous;
2. a crash in another form than the plain traceback: an exception group, a chained exception, the fatal-error
   dump of a crashed interpreter;
3. the run's own word on its outcome (a ``FAIL:`` line, a result whose ``status`` is not ``passed``) ignored
   because the exit status was 0;
4. a value its own definition rules out (a ``token_mult_prob_error`` below 1, a negative or fractional count);
5. a marker or step marker that matches a line it does not mean (``rank 1`` in ``rank 10``; a line that a
   carriage return, U+2028 or NEL splits or joins);
6. gated series whose steps are not 1..N with no gap, in a cell that declares no ``steps``.
"""

from __future__ import annotations

import json

import pytest

from carry.nightly import artifacts
from carry.nightly.judge import judge, parse_gate, parse_step_marker
from carry.nightly.runlog import markers_found, read_result_line, tracebacks

MARK = "[gtp] enabling GTP weight rematerialization"
GOOD_LOG = f"{MARK} (gtp_remat_size=2)\n"
TMPE = 'max(data["token_mult_prob_error"]) < 1.05'
REFIT0 = r"\[refit-check\] step (?P<step>\d+): (?P<n>\d+) of (?P=n) tensors equal on rank 1"


def mini(text: str, *, rc: int = 0, gates=(TMPE,), markers=(MARK,), **kw):
    """A result-line cell (the mini test's form): the metrics are the log's last JSON line."""
    at, doc, problem = read_result_line(text)
    return judge(rc=rc, timed_out=False, text=text, metrics=doc, gates=[parse_gate(g) for g in gates],
                 markers=markers, metrics_source="result-line", metrics_problem=problem, **kw)


RESULT = '{"token_mult_prob_error": 1.001, "status": "passed"}'


def test_a_plain_good_run_passes():
    assert mini(GOOD_LOG + RESULT + "\n").status == "passed"


# -- 1. duplicate keys ---------------------------------------------------------------------------
@pytest.mark.parametrize("line", [
    '{"token_mult_prob_error": 9.0, "token_mult_prob_error": 1.001, "status": "passed"}',
    '{"token_mult_prob_error": 1.001, "status": "failed", "status": "passed"}',
    '{"token_mult_prob_error": 1.001, "status": "passed", "per_rank": {"0": 1, "0": 2}}',
    '{"token_mult_prob_error": 1.001, "status": "passed", "a": [{"k": 1, "k": 1}]}',
    '{"token_mult_prob_error": 1.001, "status": "passed", "\\u0074oken_mult_prob_error": 2.0}',
])
def test_a_result_line_with_a_key_twice_fails_as_ambiguous(line):
    v = mini(GOOD_LOG + line + "\n")
    assert v.status == "failed" and "ambiguous" in v.reason and "twice" in v.reason, v.reason


@pytest.mark.parametrize("text", [
    '{"train/token_mult_prob_error": {"1": 9.0}, "train/token_mult_prob_error": {"1": 1.0}}',
    '{"train/token_mult_prob_error": {"1": 9.0, "1": 1.0}}',
    '{"a": {"b": {"c": 1, "c": 2}}, "train/token_mult_prob_error": {"1": 1.0}}',
])
def test_a_metrics_file_with_a_key_twice_is_not_read(tmp_path, text):
    (tmp_path / "metrics.json").write_text(text)
    doc, problem = artifacts.read_metrics(tmp_path / "metrics.json")
    assert doc is None and "metrics.json is ambiguous" in problem and "twice" in problem


# -- 2. crash forms -----------------------------------------------------------------------------
GROUP = """  + Exception Group Traceback (most recent call last):
  |   File "run.py", line 3, in <module>
  |     raise ExceptionGroup("ranks", [ValueError("rank 1")])
  | ExceptionGroup: ranks (1 sub-exception)
  +-+---------------- 1 ----------------
    | ValueError: rank 1
    +------------------------------------
"""
GROUP_TOP = GROUP.replace("  + Exception Group", "Exception Group", 1)
CHAINED_CAUSE = """ValueError: inner
The above exception was the direct cause of the following exception:
RuntimeError: outer
"""
CHAINED_DURING = """KeyError: 'x'
During handling of the above exception, another exception occurred:
RuntimeError: while handling
"""
FATAL = """Fatal Python error: Segmentation fault

Current thread 0x00007f0b2c9fe740 (most recent call first):
  File "run.py", line 12 in step
"""
FATAL_THREAD = """Thread 0x00007f0b2c9fe740 (most recent call first):
  File "run.py", line 12 in step
"""
FATAL_ABORT = "Fatal Python error: Aborted\n"


@pytest.mark.parametrize("crash", [GROUP, GROUP_TOP, CHAINED_CAUSE, CHAINED_DURING, FATAL, FATAL_THREAD, FATAL_ABORT,
                                   "\x1b[31m" + FATAL_ABORT, "(MegatronPolicyWorker pid=5) " + FATAL_ABORT])
@pytest.mark.parametrize("where", ["before", "after"])
def test_every_form_of_a_python_crash_fails_a_result_line_run(crash, where):
    text = GOOD_LOG + (crash + RESULT + "\n" if where == "before" else RESULT + "\n" + crash)
    v = mini(text)
    assert v.status == "failed" and "a Python traceback" in v.reason, v.reason
    assert f"{where} the result line" in v.reason, v.reason


def test_the_exception_line_of_a_group_is_named():
    got = tracebacks(GROUP)
    assert len(got) == 1 and "ExceptionGroup: ranks (1 sub-exception)" in got[0], got


def test_a_crash_quoted_inside_a_result_string_is_not_one():
    line = json.dumps({"token_mult_prob_error": 1.001, "status": "passed", "note": "Fatal Python error: x\n"})
    assert mini(GOOD_LOG + line + "\n").status == "passed"


# -- 3. the run's own word ----------------------------------------------------------------------
@pytest.mark.parametrize("line, named", [
    ('{"token_mult_prob_error": 1.001, "status": "failed"}', "status 'failed'"),
    ('{"token_mult_prob_error": 1.001, "status": "error"}', "status 'error'"),
    ('{"token_mult_prob_error": 1.001, "status": "FAILED"}', "status 'FAILED'"),
    ('{"token_mult_prob_error": 1.001, "status": false}', "status 'False'"),
    ('{"token_mult_prob_error": 1.001, "status": null}', "status 'None'"),
])
def test_a_result_whose_own_status_is_not_passed_fails_with_exit_0(line, named):
    v = mini(GOOD_LOG + line + "\n")
    assert v.status == "failed" and named in v.reason, v.reason


@pytest.mark.parametrize("fail", ["FAIL: CheckFailed: the gradient norm is inf",
                                  "(MegatronPolicyWorker pid=9) FAIL: rank 1 saw 169 of 170",
                                  "\x1b[31mFAIL: refit differs\x1b[0m",
                                  "progress 10%\rFAIL: refit differs",
                                  "ok\u2028FAIL: refit differs"])
def test_a_fail_line_fails_a_run_that_exited_0(fail):
    v = mini(GOOD_LOG + fail + "\n" + RESULT + "\n")
    assert v.status == "failed" and "the run printed FAIL:" in v.reason, v.reason


def test_a_fail_in_the_middle_of_a_line_is_not_the_runs_word():
    assert mini(GOOD_LOG + "no FAIL: here, a quote\n" + RESULT + "\n").status == "passed"


# -- 4. values ruled out by their definition ---------------------------------------------------
@pytest.mark.parametrize("key, value, gate", [
    ("token_mult_prob_error", 0.98, TMPE),
    ("token_mult_prob_error", -1.0, TMPE),
    ("unverified_tensors", -3, 'max(data["unverified_tensors"]) == 0'),
    ("unverified_tensors", -0.5, 'max(data["unverified_tensors"]) <= 0'),
    ("unverified_tensors", 0.5, 'max(data["unverified_tensors"]) < 1'),
    ("gtp_sharded_params", -1, 'min(data["gtp_sharded_params"]) != 0'),
    ("ckpt_tensors_checked", 2.5, 'min(data["ckpt_tensors_checked"]) > 0'),
    ("pct_mixed", 150.0, 'min(data["pct_mixed"]) > 0'),
    ("changed_fraction", 1.5, 'last(data["changed_fraction"]) > 1e-3'),
    ("accuracy_gain_end_accuracy", 1.2, 'last(data["accuracy_gain_end_accuracy"]) > 0.5'),
    ("grad_norm", -1e-3, 'max(data["grad_norm"]) < 1e30'),
    ("ratio_step_seconds", -2.0, 'max(data["ratio_step_seconds"]) < 10'),
])
def test_a_value_its_definition_rules_out_fails_the_gate(key, value, gate):
    line = json.dumps({"token_mult_prob_error": 1.001, key: value, "status": "passed"})
    v = mini(GOOD_LOG + line + "\n", gates=(TMPE, gate))
    assert v.status == "failed" and "its definition rules out" in v.reason and key in v.reason, v.reason


def test_values_on_the_edges_of_their_definitions_pass():
    line = json.dumps({"token_mult_prob_error": 1.0, "unverified_tensors": 0, "pct_mixed": 100.0,
                       "changed_fraction": 1.0, "status": "passed"})
    gates = (TMPE, 'max(data["unverified_tensors"]) == 0', 'min(data["pct_mixed"]) > 0',
             'last(data["changed_fraction"]) > 1e-3')
    assert mini(GOOD_LOG + line + "\n", gates=gates).status == "passed"


# -- 5. markers matching lines they do not mean -------------------------------------------------
def _refit(lines: str, marker: str = REFIT0):
    text = GOOD_LOG + lines + '{"token_mult_prob_error": {"1": 1.001}, "status": "passed"}\n'
    at, doc, problem = read_result_line(text)
    return judge(rc=0, timed_out=False, text=text, metrics=doc, gates=[parse_gate(TMPE)], markers=(MARK,),
                 step_markers=[parse_step_marker(marker)], metrics_problem=problem)


@pytest.mark.parametrize("line", [
    "[refit-check] step 1: 170 of 170 tensors equal on rank 10\n",
    "[refit-check] step 1: 170 of 170 tensors equal on rank 12 of 16\n",
    "[refit-check] step 10: 170 of 170 tensors equal on rank 1\n",
])
def test_a_step_marker_does_not_match_a_longer_number(line):
    v = _refit(line)
    assert v.status == "failed" and "no log line matches step marker" in v.reason, v.reason


@pytest.mark.parametrize("line", [
    "[refit-check] step 1: 170 of 170 tensors equal on rank 1\n",
    "[refit-check] step 1: 170 of 170 tensors equal on rank 1 (every shard)\n",
    "[refit-check] step 1: 170 of 170 tensors equal on rank 1\r\n",
])
def test_a_step_marker_still_matches_its_own_line(line):
    assert _refit(line).status == "passed"


@pytest.mark.parametrize("line", [
    f"ERROR: never saw\r{MARK} (gtp_remat_size=2)",        # a carriage return: the terminal shows the marker
    f"ERROR: never saw\u2028{MARK} (gtp_remat_size=2)",    # U+2028 LINE SEPARATOR
    f"ERROR: never saw\x85{MARK} (gtp_remat_size=2)",      # NEL
    f"ERROR: never saw\u2029{MARK} (gtp_remat_size=2)",    # U+2029 PARAGRAPH SEPARATOR
    f"ERROR: never saw\x0c{MARK}",                          # form feed
    f"{MARK} (gtp_remat_size=2)\u2028 is what it would have said",
    f"{MARK}\rERROR: overwritten",
])
def test_a_line_that_separators_split_or_join_is_no_marker(line):
    assert markers_found(line + "\n", [MARK]) == {MARK: False}
    v = mini(line + "\n" + RESULT + "\n")
    assert v.status == "vacuous", v


@pytest.mark.parametrize("line", [
    "[refit-check] step 1: 170 of 170 tensors equal on rank 1\u2028FAIL? no: quoted",
    "x\r[refit-check] step 1: 170 of 170 tensors equal on rank 1",
    "[refit-check] step 1: 170 of 170 tensors equal on rank 1\x85",
])
def test_a_step_marker_line_that_separators_split_or_join_does_not_count(line):
    v = _refit(line + "\n")
    assert v.status == "failed" and "no log line matches step marker" in v.reason, v.reason


def test_a_marker_that_ends_in_a_digit_is_no_prefix_of_a_longer_number():
    marker = "[gtp] enabling GTP weight rematerialization (gtp_remat_size=2"
    assert markers_found(f"{marker}0 expert_gtp_remat_size=1)\n", [marker]) == {marker: False}
    assert markers_found(f"{marker} expert_gtp_remat_size=1)\n", [marker]) == {marker: True}


def test_a_result_line_holding_a_line_separator_in_a_string_is_read_whole():
    line = json.dumps({"token_mult_prob_error": 1.001, "status": "passed", "note": "a\u2028b"}, ensure_ascii=False)
    assert mini(GOOD_LOG + line + "\n").status == "passed"


# -- 6. steps that are not 1..N without a gap ----------------------------------------------------
@pytest.mark.parametrize("steps, named", [
    (["1", "2", "4"], "lack step 3 of steps 1..4"),
    (["2", "3"], "lack step 1 of steps 1..3"),
    (["0", "1", "2"], "have step 0, which no run makes"),
    (["1", "x"], "have step x, which no run makes"),
    (["5"], "lack steps 1, 2, 3, 4 of steps 1..5"),
])
def test_gated_steps_must_run_1_to_n_without_a_gap_when_no_steps_are_declared(steps, named):
    series = {s: 1.001 for s in steps}
    line = json.dumps({"token_mult_prob_error": series, "status": "passed"})
    v = mini(GOOD_LOG + line + "\n")
    assert v.status == "failed" and named in v.reason, v.reason


def test_a_resumed_run_starts_at_the_step_after_its_checkpoint():
    line = json.dumps({"token_mult_prob_error": {"2": 1.001, "3": 1.002}, "status": "passed"})
    assert mini(GOOD_LOG + line + "\n", first_step=2).status == "passed"
    line = json.dumps({"token_mult_prob_error": {"2": 1.001, "4": 1.002}, "status": "passed"})
    assert "lack step 3" in mini(GOOD_LOG + line + "\n", first_step=2).reason
