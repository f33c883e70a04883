"""prove.py on the demo upstream: red/green, a proof that proves nothing,
a crashing proof, a skipped (GPU-only) proof."""

from __future__ import annotations

import pytest

from fakeup import CRASH, GOOD, GPU, VACUOUS, add_proofs, set_proof
from helpers import SERIES, apply_demo as apply, read_json, tool

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
    assert by["upstreamed"]["pristine"] == "error" and by["upstreamed"]["ok"] is False
    assert (by["conflict"]["pristine"], by["conflict"]["patched"], by["conflict"]["ok"]) == ("skipped", "skipped", None)
    assert "needs a CUDA GPU" in by["conflict"]["patched_detail"]
    assert doc["ok"] is False
    assert "threeway" in res.stderr and "upstreamed" in res.stderr
    assert (tmp_path / "logs" / "clean.test_good.pristine.log").exists()
    # Only the good one: exit 0
    tool("prove", "--series", proved["series"], "--workdir", proved["work"], "--only", "clean", check=0)
    # The skipped one alone is not a failure, and is never reported as passed.
    res = tool("prove", "--series", proved["series"], "--workdir", proved["work"], "--only", "conflict", check=0)
    assert "not run here" in res.stdout and "pass" not in res.stdout.split("verdict")[1]


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
