"""prove.py on the demo upstream: red/green, a proof that proves nothing,
a crashing proof, a skipped (GPU-only) proof; the TransformerEngine site on the proofs' path;
ranks started safely where CUDA may be initialised; a proof that cannot run here (its
environment) told from a red one; a swap an interrupted apply left finished first."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from fakeup import CRASH, GOOD, GPU, MISSING_DEPENDENCY, SITE_PROOF, VACUOUS, add_proofs, set_proof
from helpers import SERIES, apply_demo as apply, kill_at, process_alive, read_json, tool

@pytest.fixture
def proved(demo):
    add_proofs(demo["series"], {"good": GOOD, "vacuous": VACUOUS, "crash": CRASH, "gpu": GPU},
               {"clean": "good", "threeway": "vacuous", "upstreamed": "crash", "conflict": "gpu"},
               SERIES / "proofs" / "pytest.ini")
    apply(demo, check=0)
    return demo


def test_red_green_and_the_ways_a_proof_can_be_wrong(proved, tmp_path):
    out = tmp_path / "prove.json"
    res = tool("prove", "--series", proved["series"], "--workdir", proved["work"], "--json", out,
               "--logs", tmp_path / "logs", check=1)
    doc = read_json(out)
    by = {r["id"]: r for r in doc["proofs"]}
    assert (by["clean"]["pristine"], by["clean"]["patched"], by["clean"]["ok"]) == ("fail", "pass", True)
    assert "value_5" in by["clean"]["pristine_detail"] or "assert" in by["clean"]["pristine_detail"]
    assert (by["threeway"]["pristine"], by["threeway"]["ok"]) == ("pass", False)  # proves nothing
    # It died in its test body: a red run of that body (behaviour), not an environment error.
    assert by["upstreamed"]["pristine"] == "fail" and by["upstreamed"]["ok"] is False
    assert "exited 7" in by["upstreamed"]["pristine_detail"] and "test_crash" in by["upstreamed"]["pristine_detail"]
    assert (by["conflict"]["pristine"], by["conflict"]["patched"], by["conflict"]["ok"]) == ("skipped", "skipped", None)
    assert "needs a CUDA GPU" in by["conflict"]["patched_detail"]
    assert doc["ok"] is False
    assert "threeway" in res.stderr and "upstreamed" in res.stderr
    assert (tmp_path / "logs" / "clean.test_good.pristine.log").exists()
    # Only the good one: exit 0
    tool("prove", "--series", proved["series"], "--workdir", proved["work"], "--only", "clean", check=0)
    # The skipped one alone is never reported as passed, and a prove whose every proof skipped proved
    # nothing: it says so and exits 2.
    res = tool("prove", "--series", proved["series"], "--workdir", proved["work"], "--only", "conflict",
               "--json", tmp_path / "skipped.json", check=2)
    assert "not run here" in res.stdout and "pass" not in res.stdout.split("verdict")[1]
    assert "every selected proof skipped (1): this prove showed nothing" in res.stderr
    assert read_json(tmp_path / "skipped.json")["all_skipped"] is True and read_json(tmp_path / "skipped.json")["ok"] is False


def test_a_pristine_red_counts_only_for_the_reason_its_proof_declares(demo, tmp_path):
    """Red on pristine means a test body ran and failed with what the proof says it fails with: a
    collection error (a name only a patch would add) and a fixture's error are `error`, never red; a body
    red for another reason, or a proof that declares nothing, is not red/green."""
    from fakeup import FIXTURE_ERROR, NEW_NAME, UNDECLARED, WRONG_REASON
    add_proofs(demo["series"], {"good": GOOD, "wrong": WRONG_REASON, "undeclared": UNDECLARED, "newname": NEW_NAME},
               {"clean": "good", "threeway": "wrong", "upstreamed": "undeclared", "conflict": "newname"},
               SERIES / "proofs" / "pytest.ini")
    apply(demo, check=0)
    res, by = _prove(demo, tmp_path, check=1)
    assert (by["clean"]["pristine"], by["clean"]["ok"]) == ("fail", True), by["clean"]
    assert (by["threeway"]["pristine"], by["threeway"]["patched"], by["threeway"]["ok"]) == ("fail", "pass", False)
    assert "red on the pristine base for another reason: test_value_5_is_patched: KeyError: 'something else broke'" in \
        by["threeway"]["pristine_detail"], by["threeway"]
    assert by["upstreamed"]["ok"] is False and "declares no PRISTINE_FAILS" in by["upstreamed"]["pristine_detail"]
    assert (by["conflict"]["pristine"], by["conflict"]["ok"]) == ("error", None), by["conflict"]
    assert "no test body failed: a collect error" in by["conflict"]["pristine_detail"], by["conflict"]
    (demo["series"] / "proofs" / "megatron_lm" / "test_newname.py").write_text(FIXTURE_ERROR)
    res, by = _prove(demo, tmp_path, "--only", "conflict", check=2)
    assert (by["conflict"]["pristine"], by["conflict"]["patched"]) == ("error", "pass"), by["conflict"]
    assert "no test body failed: a setup error" in by["conflict"]["pristine_detail"], by["conflict"]


def test_several_runs_at_once_report_in_series_order(proved, tmp_path):
    """Runs go several at a time where the cores allow (forced here): the same verdicts, reported in
    the series' order whichever run finished first."""
    res, by = _prove(proved, tmp_path, env={"CARRY_PROOF_JOBS": "4", "GTP_CARRY_VERBOSE": "1"}, check=1)
    assert list(by) == ["clean", "threeway", "upstreamed", "conflict"], by
    assert (by["clean"]["pristine"], by["clean"]["patched"], by["clean"]["ok"]) == ("fail", "pass", True), by
    assert (by["threeway"]["pristine"], by["threeway"]["ok"]) == ("pass", False), by
    assert (by["upstreamed"]["pristine"], by["upstreamed"]["ok"]) == ("fail", False), by
    assert (by["conflict"]["pristine"], by["conflict"]["patched"]) == ("skipped", "skipped"), by
    assert "8 runs, 4 at a time" in res.stderr, res.stderr
    said = [line.split("] ", 1)[1].split(":")[0] for line in res.stderr.splitlines() if ": pristine " in line]
    assert said == ["clean", "threeway", "upstreamed", "conflict"], res.stderr
    res = tool("prove", "--series", proved["series"], "--workdir", proved["work"], env={"CARRY_PROOF_JOBS": "x"},
               check=2)
    assert "CARRY_PROOF_JOBS" in res.stderr


# A proof that outlives its timeout, with a rank that would outlive the proof's pytest.
HANGS_IN_A_RANK = '''
import os
import time

from _world import spawn


def _rank(rank, world_size, pids):
    with open(pids, "a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(600)


def test_hangs():
    spawn(_rank, 2, os.environ["CARRY_TEST_RANK_PIDS"])
'''



def test_a_timed_out_proof_leaves_no_rank_behind(demo, tmp_path):
    proofs = demo["series"] / "proofs"
    proofs.mkdir(parents=True, exist_ok=True)
    shutil.copy(SERIES / "proofs" / "_world.py", proofs / "_world.py")
    add_proofs(demo["series"], {"hangs": HANGS_IN_A_RANK}, {"clean": "hangs"}, SERIES / "proofs" / "pytest.ini")
    apply(demo, check=0)
    pids = tmp_path / "pids"
    _, by = _prove(demo, tmp_path, "--only", "clean", "--timeout", "10",
                     env={"CARRY_TEST_RANK_PIDS": str(pids), "CARRY_PROOF_JOBS": "2"},
                     check=1)
    assert by["clean"]["pristine"] == "fail" and "timed out" in by["clean"]["pristine_detail"], by
    ranks = [int(x) for x in pids.read_text().split()]
    assert len(ranks) == 4, ranks  # two ranks on each tree started, and none is left
    import time

    deadline = time.monotonic() + 10
    while any(map(process_alive, ranks)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [r for r in ranks if process_alive(r)], "a timed-out proof left its ranks running"


def test_prove_needs_a_workspace(demo, tmp_path):
    (demo["series"] / "proofs" / "megatron_lm").mkdir(parents=True)
    (demo["series"] / "proofs" / "megatron_lm" / "test_good.py").write_text(GOOD)
    set_proof(demo["series"], "clean", "proofs/megatron_lm/test_good.py")
    res = tool("prove", "--series", demo["series"], "--workdir", tmp_path / "nothing", check=2)
    assert "tools/apply.py" in res.stderr


def test_prove_and_export_wait_as_long_as_told(proved):
    """--lock-timeout is honoured by every command that takes the work directory's lock."""
    from carry.lock import DirLock

    with DirLock(proved["work"] / ".carry" / "lock"):
        for verb in ("prove", "export"):
            res = tool(verb, "--series", proved["series"], "--workdir", proved["work"], "--lock-timeout", "0.3",
                       check=1)
            assert "is locked by another run" in res.stderr, verb


def _prove(d, tmp_path, *extra, env=None, check=None):
    out = tmp_path / "prove.json"
    out.unlink(missing_ok=True)
    res = tool("prove", "--series", d["series"], "--workdir", d["work"], "--json", out, *extra, env=env, check=check)
    return res, {r["id"]: r for r in read_json(out)["proofs"]} if out.exists() else {}


# -- the TransformerEngine site ------------------------------------------------------------------


def test_the_te_site_is_on_the_proof_interpreters_path_after_the_tree(demo, tmp_path):
    site = tmp_path / "te-site"
    site.mkdir()
    add_proofs(demo["series"], {"site": SITE_PROOF.format(site=str(site.resolve()))}, {"clean": "site"},
               SERIES / "proofs" / "pytest.ini")
    apply(demo, check=0)
    # Unset: the proof's interpreter lacks the site, red on both trees.
    _, by = _prove(demo, tmp_path, env={"CARRY_TE_SITE": ""}, check=1)
    assert (by["clean"]["pristine"], by["clean"]["patched"]) == ("fail", "fail"), by
    # The variable, and the flag, each put it there, after the tree under test: red/green.
    _, by = _prove(demo, tmp_path, env={"CARRY_TE_SITE": str(site)}, check=0)
    assert (by["clean"]["pristine"], by["clean"]["patched"], by["clean"]["ok"]) == ("fail", "pass", True), by
    _, by = _prove(demo, tmp_path, "--te-site", site, env={"CARRY_TE_SITE": ""}, check=0)
    assert by["clean"]["ok"] is True, by
    # A site that is not a folder is a bad configuration, not a run of GPU proofs that all skip.
    res, _ = _prove(demo, tmp_path, env={"CARRY_TE_SITE": str(tmp_path / "no-such-site")}, check=2)
    assert "CARRY_TE_SITE" in res.stderr and "not a folder" in res.stderr


# -- how ranks start -----------------------------------------------------------------------------
# A GPU host, simulated on a CPU: torch sees a device, and the parent's CUDA state poisons every
# forked child, as torch's lazy CUDA initialisation does with its at-fork handler (a forked
# child's first CUDA call raises this very error). The rank launcher is the series' own.
RANKS_ON_A_GPU_HOST = '''
import os
import sys

import torch
from _world import spawn

import megatron.core.alpha as alpha

PRISTINE_FAILS = r"^AssertionError: assert .*'patched'"
torch.cuda.device_count = lambda: 1
POISONED = []
os.register_at_fork(after_in_child=lambda: POISONED.append(True))


def _rank(rank, world_size, parent):
    if POISONED:
        raise RuntimeError("Cannot re-initialize CUDA in forked subprocess. To use CUDA with "
                           "multiprocessing, you must use the 'spawn' start method")
    # (imported torch itself, forked from a process other than the proof's pytest)
    return rank, sys.carry_torch_imported_in == os.getpid(), os.getppid() != parent


def test_ranks_start():
    # Forked from a server that had imported torch: neither the proof's pytest nor the rank itself.
    assert spawn(_rank, 2, os.getpid()) == [(0, False, True), (1, False, True)]


def test_a_spawned_rank_imports_torch_itself():
    # The same observation goes the other way where the rank is a fresh interpreter.
    assert spawn(_rank, 1, os.getpid(), method="spawn") == [(0, True, False)]


def test_value_5_is_patched():
    assert alpha.value_5 == "patched"
'''


# Every interpreter of the proof notes which process imported torch first (a fork inherits the note).
WATCH_TORCH = '''
import os
import sys


class _Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and not hasattr(sys, "carry_torch_imported_in"):
            sys.carry_torch_imported_in = os.getpid()


sys.meta_path.insert(0, _Watch())
'''




def test_ranks_come_from_a_forkserver_where_cuda_may_be_initialised(with_world, tmp_path):
    """Where torch sees a device, ranks fork from a server that preloaded torch (not from the
    parent, whose CUDA state a fork would inherit), so they do not import torch again."""
    add_proofs(with_world["series"], {"ranks": RANKS_ON_A_GPU_HOST}, {"clean": "ranks"},
               SERIES / "proofs" / "pytest.ini")
    apply(with_world, check=0)
    assert "CARRY_PROOF_START_METHOD" not in os.environ, "the launcher's own choice is under test"
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(WATCH_TORCH)
    watched = {"PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])}
    _, by = _prove(with_world, tmp_path, env=watched, check=0)
    assert (by["clean"]["pristine"], by["clean"]["patched"], by["clean"]["ok"]) == ("fail", "pass", True), by
    assert "5 == 'patched'" in by["clean"]["pristine_detail"], by  # the ranks ran: only the value is red
    assert by["clean"]["patched_detail"] == "3 passed", by
    # Forced to fork, the ranks meet the poisoned CUDA state: an environment error, not a red proof.
    res, by = _prove(with_world, tmp_path, env={"CARRY_PROOF_START_METHOD": "fork"}, check=2)
    assert (by["clean"]["pristine"], by["clean"]["patched"], by["clean"]["ok"]) == ("error", "error", None), by
    assert "Cannot re-initialize CUDA in forked subprocess" in by["clean"]["patched_detail"]
    assert "ERROR" in res.stdout and "could not run here" in res.stderr


# -- what the environment lacks is not a red proof -----------------------------------------------
MISSING_IN_A_RANK = '''
from _world import spawn

import megatron.core.alpha as alpha


def _rank(rank, world_size):
    import carry_test_no_such_dependency_in_a_rank  # noqa: F401


def test_ranks():
    spawn(_rank, 2)
    assert alpha.value_5 == "patched"
'''
# The pristine tree lacks a module of the tree's own package: that is the tree's behaviour.
MISSING_TREE_MODULE = '''
import megatron.core.zeta  # noqa: F401


def test_zeta():
    pass
'''
DIES_AT_IMPORT = '''
import os

os._exit(3)


def test_never():
    pass
'''

NEEDS_A_TOOL = '''
import subprocess

import pytest


@pytest.fixture
def built():
    subprocess.run(["carry-test-no-such-tool", "--version"], check=True)


def test_with_the_tool(built):
    pass
'''


def test_a_proof_that_cannot_run_here_is_an_error_not_a_red_proof(with_world, tmp_path):
    add_proofs(with_world["series"], {"dep": MISSING_DEPENDENCY, "rank": MISSING_IN_A_RANK,
                                      "tree": MISSING_TREE_MODULE, "dies": DIES_AT_IMPORT},
               {"clean": "dep", "threeway": "rank", "upstreamed": "tree", "conflict": "dies"},
               SERIES / "proofs" / "pytest.ini")
    apply(with_world, check=0)
    res, by = _prove(with_world, tmp_path, "--only", "clean,threeway,conflict", check=2)
    for pid, module in (("clean", "carry_test_no_such_dependency"),
                        ("threeway", "carry_test_no_such_dependency_in_a_rank")):
        assert (by[pid]["pristine"], by[pid]["patched"], by[pid]["ok"]) == ("error", "error", None), by[pid]
        assert f"no module {module!r}" in by[pid]["pristine_detail"], by[pid]
    assert by["conflict"]["patched"] == "error" and "no test body ran" in by["conflict"]["patched_detail"]
    assert "ERROR" in res.stdout and "clean" in res.stderr and "next:" in res.stderr
    # A program the host lacks (a proof's compiler, say) is the host's too.
    (with_world["series"] / "proofs" / "megatron_lm" / "test_dies.py").write_text(NEEDS_A_TOOL)
    _, by = _prove(with_world, tmp_path, "--only", "conflict", check=2)
    assert by["conflict"]["pristine"] == "error" and "carry-test-no-such-tool" in by["conflict"]["pristine_detail"], by
    # A module of the tree's own package that is missing at collection (what a patch would add) never met the
    # bug: no test body ran, so it is no red (it was one before issue 40), and the host is not blamed either:
    # the detail says no body failed.
    _, by = _prove(with_world, tmp_path, "--only", "upstreamed", check=2)
    assert (by["upstreamed"]["pristine"], by["upstreamed"]["ok"]) == ("error", None), by
    assert "no test body failed: a collect error" in by["upstreamed"]["pristine_detail"], by


# -- the work directory's record is read under its lock -------------------------------------------
ON_V1 = '''
import megatron.core.alpha as alpha
import megatron.core.beta as beta

PRISTINE_FAILS = r"^AssertionError: assert .*'patched'"


def test_value_5_is_patched_on_v1():
    assert beta.value_8 == "upstream v1", "these are not the trees of the series' pin (v1)"
    assert alpha.value_5 == "patched"
'''


def test_prove_finishes_a_swap_an_interrupted_apply_left(demo, tmp_path):
    add_proofs(demo["series"], {"v1": ON_V1}, {"clean": "v1"}, SERIES / "proofs" / "pytest.ini")
    apply(demo, check=0)
    # The series moves to v1; apply is killed after its workspace moved in, before the record:
    # the record still names v0's commits. Read outside the lock, prove proved those (or failed
    # with git's "not a tree object" where the new workspace lacks them).
    demo["write_series"](demo["v1"], ids=("clean", "threeway"))
    add_proofs(demo["series"], {"v1": ON_V1}, {"clean": "v1"}, SERIES / "proofs" / "pytest.ini")
    kill_at("swapping", "--series", demo["series"], "--workdir", demo["work"], "--cache", demo["cache"],
            "--source", f"megatron-lm={demo['up']}")
    assert (demo["work"] / ".carry" / "journal.json").exists()
    res, by = _prove(demo, tmp_path, "--only", "clean", check=0)
    assert (by["clean"]["pristine"], by["clean"]["patched"], by["clean"]["ok"]) == ("fail", "pass", True), res.stderr
    assert not (demo["work"] / ".carry" / "journal.json").exists()
    from carry.workspace.workdir import WorkDir

    assert WorkDir(demo["work"]).load_state().record("megatron-lm").base_commit == demo["v1"]


def test_a_series_under_a_folder_named_like_a_variable_proves(tmp_path, monkeypatch):
    """A series whose path holds '$HOME' (a literal folder name): pytest expands variables in
    --rootdir, so prove names its proofs' root by their pytest.ini alone, and the proof runs there."""
    from fakeup import make_demo

    monkeypatch.setenv("HOME", str(tmp_path / "elsewhere"))
    where = tmp_path / "lit$HOME"
    where.mkdir()
    demo = make_demo(where)
    add_proofs(demo["series"], {"good": GOOD}, {"clean": "good"}, SERIES / "proofs" / "pytest.ini")
    apply(demo, check=0)
    out = tmp_path / "prove.json"
    tool("prove", "--series", demo["series"], "--workdir", demo["work"], "--only", "clean", "--json", out, check=0)
    row = next(r for r in read_json(out)["proofs"] if r["id"] == "clean")
    assert (row["pristine"], row["patched"], row["ok"]) == ("fail", "pass", True), row


PLUGIN_SEEN = """
import sys


def test_no_installed_plugin_reached_me():
    assert "carry_fake_plugin" not in sys.modules, "an installed pytest plugin was loaded into the proof"
"""


@pytest.mark.parametrize("mode", ["zygote", "fresh"])
def test_a_pytest_plugin_installed_beside_the_proof_is_not_loaded(demo, tmp_path, mode):
    """A pytest11 entry point on the path (as pip installs hypothesis's): plain pytest loads it (the
    control), a proof run does not, from the zygote and fresh alike."""
    site = tmp_path / "site"
    (site / "carry_fake_plugin-1.0.dist-info").mkdir(parents=True)
    (site / "carry_fake_plugin.py").write_text("def pytest_configure(config):\n    pass\n")
    (site / "carry_fake_plugin-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: carry-fake-plugin\nVersion: 1.0\n")
    (site / "carry_fake_plugin-1.0.dist-info" / "entry_points.txt").write_text(
        "[pytest11]\ncarry_fake = carry_fake_plugin\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    env.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
    control = tmp_path / "control"
    control.mkdir()
    (control / "test_seen.py").write_text(PLUGIN_SEEN)
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(control)],
                         capture_output=True, text=True, env=env, cwd=control, timeout=300)
    assert res.returncode == 1 and "an installed pytest plugin was loaded" in res.stdout, res.stdout[-2000:]
    add_proofs(demo["series"], {"seen": PLUGIN_SEEN}, {"clean": "seen"}, SERIES / "proofs" / "pytest.ini")
    apply(demo, check=0)
    out = tmp_path / "prove.json"
    tool("prove", "--series", demo["series"], "--workdir", demo["work"], "--only", "clean", "--json", out,
         *(["--fresh"] if mode == "fresh" else []), env=env, check=1)
    row = next(r for r in read_json(out)["proofs"] if r["id"] == "clean")
    # The proof body passes on both trees (it proves nothing of the patch: not red/green, exit 1), and
    # it ran: the plugin was kept out of both runs.
    assert (row["pristine"], row["patched"]) == ("pass", "pass"), row


def test_every_proof_of_the_series_declares_what_it_fails_with_on_pristine():
    """Each proof file of the three series names its pristine failure (PRISTINE_FAILS: a regex, or per test a
    regex or None), and every regex compiles: prove can then tell a red for the bug from a red for another reason."""
    import re

    from carry.evidence.pristine import declared_failure
    from carry.series.repo import load_series
    series = load_series("gtp")
    files = {series.root / proof.split("::")[0] for p in series.patches for proof in p.proofs}
    assert len(files) >= 19, files
    for f in sorted(files):
        declared = declared_failure(f)
        assert declared is not None, f"{f.name} declares no PRISTINE_FAILS"
        for regex in ([declared] if isinstance(declared, str) else declared.values()):
            if regex is not None:
                re.compile(regex)
        if isinstance(declared, dict):
            import ast
            tests = {n.name for n in ast.parse(f.read_text()).body if isinstance(n, ast.FunctionDef)}
            assert set(declared) <= tests and any(v is not None for v in declared.values()), (f.name, declared)


def test_a_proofs_pristine_run_has_the_patches_it_requires(gtp_work, tmp_path):
    """The refit planner's patch requires the two collection patches: its proof's pristine tree is the base with
    those applied (and not its own), else the proof met their bugs first (red for the inference collection)."""
    from carry.evidence.pristine import prerequisites, pristine_tree
    from carry.evidence.prove import extract
    from carry.git import Git
    from carry.series.repo import load_series
    from carry.workspace.workdir import WorkDir
    series = load_series("gtp")
    plan = series.patch("mlm-gtp-refit-plan")
    assert [p.id for p in prerequisites(series, plan)] == ["mlm-pg-collection", "mlm-inference-pg"]
    assert prerequisites(series, series.patch("mlm-pg-collection")) == []
    wd = WorkDir(gtp_work)
    rec = wd.require(series).record("megatron-lm")
    base = extract(wd.workspace("megatron-lm"), rec.base_commit, tmp_path / "base")
    assert pristine_tree(series, series.patch("mlm-pg-collection"), base, tmp_path / "none") == base
    tree = pristine_tree(series, plan, base, tmp_path / "with-requirements")
    for dep in ("mlm-pg-collection", "mlm-inference-pg"):   # applied: they reverse-apply
        Git(tree)("apply", "--check", "-R", str(series.patch_path(series.patch(dep)).resolve()))
    Git(tree)("apply", "--check", str(series.patch_path(plan).resolve()))   # its own is not


# -- one tree skipped or erred, parts of a run skipped: never green --------------------------------
# Skips on the pristine base, passes patched: it never showed the bug.
SKIPS_ON_PRISTINE = '''
import pytest
import megatron.core.alpha as alpha

PRISTINE_FAILS = r"^AssertionError"


def test_value_5_is_patched():
    if alpha.value_5 != "patched":
        pytest.skip("not patched here")
    assert alpha.value_5 == "patched"
'''
# Red on the pristine base, skipped patched: it never showed the fix.
SKIPS_PATCHED = '''
import pytest
import megatron.core.beta as beta

PRISTINE_FAILS = r"^AssertionError: assert .*'patched'"


def test_value_10_is_patched():
    if beta.value_10 == "patched":
        pytest.skip("patched here")
    assert beta.value_10 == "patched"
'''
# Red on the pristine base, a fixture error patched: the patched run says nothing (environment).
ERRS_PATCHED = '''
import pytest
import megatron.core.gamma as gamma

PRISTINE_FAILS = r"^AssertionError: assert .*'fixed'"


@pytest.fixture
def value():
    if gamma.value_20 == "fixed":
        raise RuntimeError("the fixture could not set up on the patched tree")
    return gamma.value_20


def test_value_20_is_fixed(value):
    assert value == "fixed"
'''
# One test passes and one skips on both trees: the run passed (it proves nothing), it did not skip.
PASSES_AND_SKIPS = '''
import pytest
import megatron.core.delta as delta


def test_value_1():
    assert delta.value_1 == 1


@pytest.mark.skip(reason="not here")
def test_elsewhere():
    assert False
'''


def test_a_proof_skipped_or_erred_on_one_tree_or_partly_skipped_is_never_green(demo, tmp_path):
    """Red/green needs a red body on pristine and a pass patched: a skip on either tree is neither, an error
    on the patched tree is no evidence (an error, exit 2 alone), and a run where one test passed and one
    skipped passed (a proof that proves nothing), not skipped."""
    add_proofs(demo["series"], {"skips_pristine": SKIPS_ON_PRISTINE, "skips_patched": SKIPS_PATCHED,
                                "errs_patched": ERRS_PATCHED, "passes_skips": PASSES_AND_SKIPS},
               {"clean": "skips_pristine", "threeway": "skips_patched", "upstreamed": "errs_patched",
                "conflict": "passes_skips"}, SERIES / "proofs" / "pytest.ini")
    apply(demo, check=0)
    out = tmp_path / "all.json"
    tool("prove", "--series", demo["series"], "--workdir", demo["work"], "--json", out, check=1)
    doc = read_json(out)
    by = {r["id"]: r for r in doc["proofs"]}
    got = {pid: (r["pristine"], r["patched"], r["ok"]) for pid, r in by.items()}
    assert got == {"clean": ("skipped", "pass", False), "threeway": ("fail", "skipped", False),
                   "upstreamed": ("fail", "error", None), "conflict": ("pass", "pass", False)}, got
    assert "1 passed, 1 skipped" in by["conflict"]["pristine_detail"], by["conflict"]
    assert doc["errors"] == ["upstreamed"] and doc["ok"] is False and doc["all_skipped"] is False, doc
    # The error alone: not red/green is not what went wrong (exit 2), and the report is not ok.
    out = tmp_path / "error.json"
    tool("prove", "--series", demo["series"], "--workdir", demo["work"], "--only", "upstreamed", "--json", out,
         check=2)
    doc = read_json(out)
    assert (doc["ok"], doc["errors"], doc["all_skipped"]) == (False, ["upstreamed"], False), doc
    # Skipped on the patched tree alone: red on pristine is no skip, the prove did not skip every proof.
    out = tmp_path / "skipped-patched.json"
    tool("prove", "--series", demo["series"], "--workdir", demo["work"], "--only", "threeway", "--json", out,
         check=1)
    assert (read_json(out)["ok"], read_json(out)["all_skipped"]) == (False, False), read_json(out)


def test_a_skipped_proof_beside_a_red_green_one_leaves_the_prove_ok(proved, tmp_path):
    """Not every proof skipped: the good one's red/green stands, the prove is ok and exits 0."""
    out = tmp_path / "prove.json"
    tool("prove", "--series", proved["series"], "--workdir", proved["work"], "--only", "clean,conflict",
         "--json", out, check=0)
    doc = read_json(out)
    assert [(r["id"], r["ok"]) for r in doc["proofs"]] == [("clean", True), ("conflict", None)], doc
    assert (doc["ok"], doc["all_skipped"], doc["errors"]) == (True, False, []), doc


# -- PRISTINE_FAILS per test ---------------------------------------------------------------------
# Names one failing test; another, which it does not name, fails on the pristine base too.
DICT_UNNAMED_FAILS = '''
import megatron.core.alpha as alpha

PRISTINE_FAILS = {"test_value_5_is_patched": r"^AssertionError: assert .*'patched'"}


def test_value_5_is_patched():
    assert alpha.value_5 == "patched"


def test_value_5_is_not_5():
    assert alpha.value_5 != 5
'''
# Only the test it counts for nothing (None) fails on the pristine base: nothing showed the bug.
DICT_ONLY_NONE_FAILS = '''
import megatron.core.beta as beta

PRISTINE_FAILS = {"test_what_the_patch_adds": None, "test_value_1": r"^AssertionError"}


def test_what_the_patch_adds():
    assert beta.value_10 == "patched"


def test_value_1():
    assert beta.value_1 == 1
'''
# Both fail on the pristine base: the named one as declared, the other counted for nothing: red/green.
DICT_NAMED_AND_NONE_FAIL = '''
import megatron.core.gamma as gamma

PRISTINE_FAILS = {"test_value_20_is_fixed": r"^AssertionError: assert .*'fixed'", "test_what_the_patch_adds": None}


def test_value_20_is_fixed():
    assert gamma.value_20 == "fixed"


def test_what_the_patch_adds():
    assert gamma.value_20 == "fixed", "not there yet"
'''
# Its body dies on the pristine base (no exception to compare with what it declares).
DIES_ON_PRISTINE = '''
import os
import megatron.core.delta as delta

PRISTINE_FAILS = r"^AssertionError"


def test_value_15_is_ours():
    if delta.value_15 != "ours":
        os._exit(3)
'''


def test_a_red_counts_only_for_the_tests_pristine_fails_names(demo, tmp_path):
    """A dict PRISTINE_FAILS: a failing test it does not name spoils the red; a red of only the tests it
    counts for nothing (None) is no red; a named test red as declared beside a None one is red/green.
    A body that died on pristine left no exception to compare with what the proof declares."""
    add_proofs(demo["series"], {"unnamed": DICT_UNNAMED_FAILS, "only_none": DICT_ONLY_NONE_FAILS,
                                "named_and_none": DICT_NAMED_AND_NONE_FAIL, "dies": DIES_ON_PRISTINE},
               {"clean": "unnamed", "threeway": "only_none", "upstreamed": "named_and_none", "conflict": "dies"},
               SERIES / "proofs" / "pytest.ini")
    apply(demo, check=0)
    _, by = _prove(demo, tmp_path, check=1)
    got = {pid: (r["pristine"], r["patched"], r["ok"]) for pid, r in by.items()}
    assert got == {"clean": ("fail", "pass", False), "threeway": ("fail", "pass", False),
                   "upstreamed": ("fail", "pass", True), "conflict": ("fail", "pass", False)}, got
    assert "in test_value_5_is_not_5, which its PRISTINE_FAILS does not name" in by["clean"]["pristine_detail"], by
    assert "only tests its PRISTINE_FAILS counts for nothing failed" in by["threeway"]["pristine_detail"], by
    assert "no test body failed with an exception to compare" in by["conflict"]["pristine_detail"], by


def test_a_proofs_pristine_tree_has_what_it_requires_of_its_own_upstream_through_every_step():
    """prerequisites: the requires of the requires too, and only those of the patch's own upstream (another
    upstream's patch is already in that upstream's patched tree, and would not apply to this one)."""
    from carry.evidence.pristine import prerequisites
    from carry.series.repo import load_series
    series = load_series("gtp")
    layout = series.patch("nrl-refit-layout")
    assert layout.requires == ("nrl-gtp-preflight",)   # which requires nrl-gtp-shim in turn
    assert [p.id for p in prerequisites(series, layout)] == ["nrl-gtp-shim", "nrl-gtp-preflight"]
    functional = series.patch("nrl-gtp-functional-test")
    assert {series.patch(d).upstream for d in functional.requires} > {"nemo-rl"}
    assert [p.id for p in prerequisites(series, functional)] == ["nrl-gtp-shim", "nrl-gtp-preflight",
                                                                 "nrl-refit-layout"]
