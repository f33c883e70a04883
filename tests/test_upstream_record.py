"""tools/upstream_tests.py --record-fixed: the upstream tests a run found the series fixes, each bisected to its
patch, recorded beside that patch (its upstream_tests in series.toml), on the demo upstream of
test_upstream_tests.py: its test_fixed_by_the_series fails on the pristine base and passes once the series'
"fix" patch is applied.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
import subprocess
import tomllib

import pytest

from fakeup import add_proofs
from helpers import ROOT, SERIES, read_json, tool
import test_upstream_tests as demo

up = demo.up     # the demo upstream's fixture, and its runner
_run = demo._run

FIXED = "megatron-lm:tests/unit_tests/test_alpha.py::test_fixed_by_the_series"


def _recorded(up) -> dict[str, list[str]]:
    doc = tomllib.loads((up["series"] / "series.toml").read_text())
    return {p["id"]: p["upstream_tests"] for p in doc["patches"] if "upstream_tests" in p}


def _record(up, *results, check=0):
    return tool("upstream_tests", "--series", up["series"], *[x for r in results for x in ("--record-fixed", r)],
                check=check)


@pytest.mark.slow
def test_a_fixed_test_bisected_to_its_patch_is_recorded_beside_it_once(up, tmp_path):
    """The run bisects the fixed test to "fix"; --record-fixed writes it into that patch's upstream_tests (and no
    other's), lint holds it, and recording again changes nothing. A fixed test whose bisection named no patch
    (here: the same result with its bisection entry not confirmed) is counted, not recorded; a result of
    another series, or a file that is no result, is refused with series.toml untouched."""
    # exit 1, incomplete: test_alpha.py's test_hangs runs past the per-test timeout on both sides, no verdict
    ran, _ = _run(up, "--files", "tests/unit_tests/test_alpha.py", "--test-timeout", "8", check=1)
    assert "test_alpha.py::test_hangs: no verdict: the pristine side ran past the per-test timeout" in ran.stdout
    result = up["tmp"] / "out" / "megatron-lm" / "result.json"
    (hint,) = [ln for ln in ran.stdout.splitlines() if ln.startswith("next: record the fixed tests")]
    doc = read_json(result)
    (entry,) = [b for b in doc["bisect"] if b["category"] == "fixed"]
    assert (entry["first_patch"], entry["target"], entry["changed"]) == ("fix", "passing", True), entry
    manifest = up["series"] / "series.toml"
    before = manifest.read_text()
    # refused: a file that is no result, a result of another series (its digest), before anything is written
    junk = tmp_path / "junk.json"
    junk.write_text("[]")
    assert "not a result.json" in _record(up, junk, check=2).stderr
    other = tmp_path / "other.json.gz"
    other.write_bytes(gzip.compress(json.dumps({**doc, "series_digest": "0" * 12}).encode()))
    assert "a result of another series" in _record(up, result, other, check=2).stderr
    assert manifest.read_text() == before
    # unbisected: counted, nothing written
    cut = tmp_path / "cut.json"
    cut.write_text(json.dumps({**doc, "bisect": [{"id": entry["id"], "category": "fixed",
                                                   "note": "not confirmed: the second run on the patched trees did not reach it"}]}))
    said = _record(up, cut).stdout
    assert "1 fixed test(s) named no patch (not recorded)" in said and "nothing new to record" in said, said
    assert manifest.read_text() == before
    # recorded beside "fix", once: by the command the run printed, pasted where it ran
    pasted = subprocess.run(hint.split("named: ", 1)[1], shell=True, cwd=ROOT, capture_output=True, text=True)
    assert pasted.returncode == 0, pasted.stderr
    said = pasted.stdout
    assert f"fix: 1 upstream test(s) it fixes, 1 new in its upstream_tests\n  {FIXED}" in said, said
    assert _recorded(up) == {"fix": [FIXED]}
    assert manifest.read_text().replace(f'upstream_tests = [\n  "{FIXED}",\n]\n', "") == before
    lint = tool("lint", "--series", up["series"], check=None)
    assert "upstream_tests" not in lint.stdout + lint.stderr, lint.stdout
    written = manifest.read_text()
    assert "nothing new to record" in _record(up, result).stdout and manifest.read_text() == written


def test_lint_refuses_an_upstream_test_that_is_not_one(tmp_path):
    """upstream_tests entries are UPSTREAM:NODE_ID of an upstream that pins tests, under its tests root, each once."""
    from carry.series.lint import upstream_test_problems
    from carry.series.repo import load_series
    series = load_series("gtp")
    p = series.patch("mlm-dataset-helpers-wheel")
    ok = "megatron-lm:tests/unit_tests/data/test_builder.py::test_builder"
    with_tests = lambda *tests: upstream_test_problems(series, replace(p, upstream_tests=tests))  # noqa: E731
    assert with_tests(ok) == []
    assert with_tests("tests/unit_tests/data/test_builder.py::test_builder")   # no upstream named
    assert with_tests("megatron-lm:tests/functional_tests/x.py::test_y")      # not under the tests root
    assert with_tests("megatron-lm:tests/unit_tests/data/test_builder.py")    # a file, not a test
    assert with_tests("no-such:tests/unit_tests/x.py::test_y")
    assert with_tests(ok, ok) == [f"upstream_tests lists {ok} more than once"]


def test_a_run_needs_its_folders_and_record_fixed_runs_alone(tmp_path):
    """Without --record-fixed, --workdir and --out are needed (exit 2, before anything); --record-fixed with an
    option of a run is refused, the option named."""
    res = tool("upstream_tests", "--series", "gtp", check=2)
    assert "--workdir and --out are needed" in res.stderr, res.stderr
    res = tool("upstream_tests", "--series", "gtp", "--record-fixed", tmp_path / "r.json", "--select-only", check=2)
    assert "--record-fixed runs nothing: --select-only would not be used" in res.stderr, res.stderr


@pytest.mark.slow
def test_retire_runs_the_upstream_tests_a_patch_fixed_on_the_new_base(up, tmp_path):
    """retire --upstream-tests: the demo's "fix" (no proof) recorded to fix test_fixed_by_the_series. Upstream
    fixes it in its own words (the patch no longer applies): without the flag the verdict is "conflicts" (no
    behaviour evidence); with it the test passes on the new base without the patch: landed, fixed differently.
    On the old base the test fails there: needed."""
    from carry.git import Git
    from carry.series.edit import set_upstream_tests
    from fakeup import edit
    manifest = up["series"] / "series.toml"
    manifest.write_text(set_upstream_tests(manifest.read_text(), "fix", [FIXED]))
    repo = up["tmp"] / "upstream"
    g = Git(repo)
    old = g.head()
    edit(repo, "megatron/core/alpha.py", 5, "value_5 = 'patched'  # upstream's own words\n")
    new = g.commit_all("upstream fixes value_5 its own way")

    def verdict(target: str, *extra: str) -> dict:
        out = tmp_path / f"r{len(list(tmp_path.glob('r*.json')))}.json"
        tool("retire", "--series", up["series"], "--against", f"megatron-lm={target}", "--source", f"megatron-lm={repo}",
             "--cache", up["cache"], "--json", out, *extra, check=0, timeout=600)
        return {p["id"]: p for p in read_json(out)["patches"]}["fix"]

    v = verdict(new)
    assert (v["verdict"], v["text"], v["behaviour"]) == ("conflicts", "conflicts", "no-proof"), v
    assert any("not run: --upstream-tests runs them" in e for e in v["evidence"]), v["evidence"]
    run = ("--upstream-tests", "--tests-source", f"megatron-lm={up['tests_repo']}")
    v = verdict(new, *run)
    assert (v["verdict"], v["text"], v["behaviour"]) == ("landed", "conflicts", "pass"), v
    assert "upstream's own tests it fixed, on the new base without it: 1 passed, 0 failed" in v["evidence"], v["evidence"]
    assert any("upstream fixed it differently" in d for d in v["disagreements"]), v
    v = verdict(old, *run)
    assert (v["verdict"], v["behaviour"]) == ("needed", "fail"), v
    assert any(e.startswith("upstream's own tests it fixed, on the new base without it: 0 passed, 1 failed (first "
                            f"failed: {FIXED}: failed)") for e in v["evidence"]), v["evidence"]
    # a proof that reads the patch's own words fails on upstream's: the proof decides, the disagreement is printed
    add_proofs(up["series"], {"own_words": OWN_WORDS}, {"fix": "own_words"}, SERIES / "proofs" / "pytest.ini")
    v = verdict(new, *run)
    assert (v["verdict"], v["behaviour"]) == ("conflicts", "fail"), v
    assert "its proof fails on the new base, but upstream's own tests it fixed pass there" in v["disagreements"], v


OWN_WORDS = '''
from pathlib import Path

import megatron.core.alpha as alpha

PRISTINE_FAILS = r"^AssertionError"

def test_line_5_is_the_patchs():
    assert Path(alpha.__file__).read_text().splitlines()[4] == "value_5 = 'patched'"
'''


def test_retire_runs_the_upstream_tests_on_the_new_base_as_its_wheel_installs_it(tmp_path):
    """The new base is a wheel whose compiled member the git layout leaves out (megatron-core's dataset helpers,
    here ext.so): the folder the recorded tests run in holds it, as an install does, so a test that reads it
    passes there, while the test the patch fixed still fails (upstream did not fix it): needed."""
    from carry.series.edit import set_upstream_tests
    w = demo._wheel_installed_upstream(tmp_path)
    manifest = w["series"] / "series.toml"
    tests = ["megatron-lm:tests/unit_tests/test_installed.py::test_reads_what_the_install_holds",
             "megatron-lm:tests/unit_tests/test_installed.py::test_value_5_is_patched"]
    manifest.write_text(set_upstream_tests(manifest.read_text(), "fix", tests))
    out = tmp_path / "r.json"
    tool("retire", "--series", w["series"], "--against", "megatron-lm=1.0", "--source", f"megatron-lm={w['wheel']}",
         "--cache", w["cache"], "--upstream-tests", "--json", out, check=0, timeout=600)
    (v,) = read_json(out)["patches"]
    assert (v["verdict"], v["behaviour"]) == ("needed", "fail"), v
    assert ("upstream's own tests it fixed, on the new base without it: 1 passed, 1 failed (first failed: "
            f"{tests[1]}: failed)") in v["evidence"], v["evidence"]
