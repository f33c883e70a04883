"""The committed gtp series itself: lint-clean, applies on the real pins,
and its patch files are exactly what export produces (no drift)."""

from __future__ import annotations

import os

import pytest

from helpers import read_json, tool

pytestmark = pytest.mark.network


def test_lint_is_clean():
    res = tool("lint", "--series", "gtp", check=0)
    assert "0 problem(s)" in res.stdout


def test_apply_then_export_check(tmp_path, pin_cache):
    """CI's 'patches are up to date' check on the PyPI-pinned upstreams (NeMo-RL needs --source)."""
    out = tmp_path / "apply.json"
    tool("apply", "--series", "gtp", "--workdir", tmp_path / "w", "--cache", pin_cache,
         "--only", "megatron-lm,megatron-bridge", "--json", out, check=0)
    doc = read_json(out)
    for u in doc["upstreams"]:
        for p in u["patches"]:
            if p["status"] != "not-attempted":
                assert p["status"] == "applied", p
    tool("export", "--series", "gtp", "--workdir", tmp_path / "w", "--check", check=0)
    tool("apply", "--series", "gtp", "--workdir", tmp_path / "w", "--cache", pin_cache,
         "--only", "megatron-lm,megatron-bridge", "--check", check=0)


# The zygote/fresh comparison of every proof takes most of the suite's time on two cores (a fresh
# interpreter per run is what it compares with): the suite runs a sample, the nightly's
# zygote-fresh cell runs them all (GTP_CARRY_TEST_ZYGOTE=all, integration/nightly.toml). The
# sample: from the zygote (the way every prove runs on a CPU host), a Megatron-LM proof and
# Bridge's, which runs in an environment of its own (its zygote preloads that environment's
# packages); fresh, the Megatron-LM one, compared run for run. Bridge's fresh runs are the
# nightly's (its proof costs about 20 s of two cores a prove: the README walkthrough's retire runs
# it fresh on the pristine base, tests/test_readme.py).
ZYGOTE_SAMPLE = {"zygote": "mlm-tied-weight-guard,bridge-ckpt-replica-groups", "fresh": "mlm-tied-weight-guard"}
ZYGOTE_WHOLE = os.environ.get("GTP_CARRY_TEST_ZYGOTE") == "all"


@pytest.mark.slow
def test_cpu_proofs_red_green_the_same_from_the_zygote_and_fresh(tmp_path, gtp_work, pin_cache):
    """The Megatron-LM and Megatron-Bridge proofs on the real pins (a sample in the suite, all in
    the nightly): CPU ones red on pristine and green patched, the GPU ones skipped here (never
    'pass' without a GPU); and the same outcome of every run from the zygote and with --fresh (a
    difference is a bug of the zygote). Each run says how it started (``via``): every run of the
    first prove forked from a zygote, every run of the second was a fresh interpreter. Both take
    the pinned-artifact cache (--cache): the Bridge proof's environment is built there once, not
    in every session's empty cache (building it is tests/test_proofenv.py's)."""
    import torch

    red_green = ("test_pg_collection.py", "test_inference_pg.py", "test_tied_weight_guard.py",
                 "test_gtp_ckpt_offsets.py", "test_swiglu_ckpt_layouts.py", "test_ckpt_replica_groups.py")
    gpu_only = ("test_te_bias_sizing.py", "test_te_gpt_end_to_end.py", "test_tied_prefetch.py")
    reports = {}
    for mode in ("zygote", "fresh"):
        only = "megatron-lm,megatron-bridge" if ZYGOTE_WHOLE else ZYGOTE_SAMPLE[mode]
        out = tmp_path / f"prove-{mode}.json"
        tool("prove", "--series", "gtp", "--workdir", gtp_work, "--only", only, "--json", out, "--cache", pin_cache,
             *(["--fresh"] if mode == "fresh" else []), timeout=3000, check=0)
        rows = read_json(out)["proofs"]
        reports[mode] = {(r["id"], r["proof"]): (r["pristine"], r["patched"], r["ok"]) for r in rows}
        if not torch.cuda.is_available():   # where torch sees a device, no run forks (README, "A zygote per prove")
            assert {v for r in rows for v in r["via"]} == {mode}, (mode, [(r["proof"], r["via"]) for r in rows])
        by_proof = {r["proof"].rsplit("/", 1)[1]: r for r in rows}
        if not ZYGOTE_WHOLE:
            sample = {"zygote": {"test_tied_weight_guard.py", "test_ckpt_replica_groups.py"},
                      "fresh": {"test_tied_weight_guard.py"}}[mode]
            assert set(by_proof) == sample, (mode, sorted(by_proof))
        for name in red_green:
            if name in by_proof or ZYGOTE_WHOLE:
                r = by_proof[name]
                assert (r["pristine"], r["patched"], r["ok"]) == ("fail", "pass", True), (mode, r)
        for name in gpu_only:
            if (name in by_proof or ZYGOTE_WHOLE) and not torch.cuda.is_available():
                r = by_proof[name]
                assert (r["pristine"], r["patched"], r["ok"]) == ("skipped", "skipped", None), (mode, r)
        if "test_ckpt_replica_groups.py" in by_proof:
            assert by_proof["test_ckpt_replica_groups.py"]["id"] == "bridge-ckpt-replica-groups"
    # run for run: every run both ways made (the whole set in the nightly) has the same outcome
    both = reports["zygote"].keys() & reports["fresh"].keys()
    assert both == reports["fresh"].keys(), (sorted(reports["zygote"]), sorted(reports["fresh"]))
    assert {k: reports["zygote"][k] for k in both} == {k: reports["fresh"][k] for k in both}, {
        k: (reports["zygote"][k], reports["fresh"][k]) for k in both if reports["zygote"][k] != reports["fresh"][k]}
    if ZYGOTE_WHOLE:
        assert reports["zygote"] == reports["fresh"]


@pytest.mark.parametrize("field, bad, message", [
    ("links", '"https://github.com/NVIDIA/Megatron-LM/pulls/6940"', "is not https://github.com/OWNER/REPO/pull/N"),
    ("links", '"NVIDIA/Megatron-LM#6940"', "is not https://github.com/OWNER/REPO/pull/N"),
    ("links", '"https://github.com/NVIDIA/Megatron-LM/commit/d262dbed3dXY"', "/commit/SHA"),
    ("merged_in", '"d262dbed3d"', "must be a full 40-hex upstream commit id"),
])
def test_lint_rejects_a_malformed_link(tmp_path, field, bad, message):
    """The real series with one upstream link (or merged_in) spoilt: lint fails (exit 1) and says which."""
    import shutil

    from helpers import SERIES

    sdir = tmp_path / "gtp"
    shutil.copytree(SERIES, sdir)
    toml = sdir / "series.toml"
    text = toml.read_text()
    if field == "links":
        good = '"https://github.com/NVIDIA/Megatron-LM/pull/6565",'
        assert good in text
        text = text.replace(good, bad + ",", 1)
    else:
        good = 'merged_in = "d262dbed3d48a0b6a22b1f0ddc58c2cede2b9149"'
        assert good in text
        text = text.replace(good, f"merged_in = {bad}", 1)
    toml.write_text(text)
    res = tool("lint", "--series", sdir, check=1)
    assert "patch mlm-gtp-tied-dummy-wgrad" in res.stderr and message in res.stderr, res.stderr
    assert "1 problem(s)" in res.stdout


def test_the_nightly_runs_the_whole_zygote_fresh_comparison():
    """The suite's sample above stands for the whole, which a nightly cell runs."""
    from carry.nightly.config import load

    from helpers import ROOT

    cfg = load(ROOT / "integration" / "nightly.toml")
    (cell,) = [c for c in cfg.tests if c.name == "zygote-fresh"]
    assert "GTP_CARRY_TEST_ZYGOTE" in dict(cell.env) and dict(cell.env)["GTP_CARRY_TEST_ZYGOTE"] == "all"
    assert any("test_cpu_proofs_red_green_the_same_from_the_zygote_and_fresh" in a for a in cell.argv), cell.argv
