"""The nightly's canary (carry.evidence.canary) end to end: a demo series pinned at v0 of a real git
upstream whose main (v1) has one patch's fix, moved context near another, and clashes with a
third; real proofs (one that fails on main, one that needs a GPU). The verdicts come from
carry.evidence.retire; the canary states them for main and never fails the night."""

from __future__ import annotations


from fakeup import GOOD, GPU, add_proofs
from helpers import SERIES, proofs_matrix, read_json, tool


def test_canary_verdicts_beside_the_release_cells(demo, tmp_path):
    sdir = demo["series"]
    add_proofs(sdir, {"good": GOOD, "gpu": GPU}, {"clean": "good", "threeway": "gpu"}, SERIES / "proofs" / "pytest.ini")
    config = tmp_path / "nightly.toml"
    config.write_text(proofs_matrix(str(sdir), patches=["clean"], proof_timeout_s=120))
    out = tmp_path / "n"
    res = tool("nightly", "--config", config, "--out", out, "--workdir", tmp_path / "nwork", "--cache", demo["cache"],
               "--source", f"megatron-lm={demo['up']}", "--history", tmp_path / "h.jsonl",
               "--canary", f"megatron-lm={demo['up']}", check=0, timeout=600)
    doc = read_json(out / "nightly.json")
    assert doc["ok"] is True and [r["status"] for r in doc["runs"]] == ["passed"]  # the release cell
    (c,) = doc["canary"]
    assert c["head"] == demo["v1"] and c["error"] is None
    rows = {r["id"]: r for r in c["rows"]}
    assert rows["upstreamed"]["verdict"] == "landed" and "reverse-applies" in rows["upstreamed"]["why"]
    assert rows["clean"]["verdict"] == "needed" and "fails on main" in rows["clean"]["why"]
    assert rows["conflict"]["verdict"] == "conflicts" and "megatron/core/delta.py" in rows["conflict"]["why"]
    assert rows["threeway"]["verdict"] == "unknown"
    assert "did not run here" in rows["threeway"]["why"] and "still applies" in rows["threeway"]["why"]
    summary = (out / "summary.md").read_text()
    assert "## Canary" in summary and "| conflict | conflicts |" in summary
    assert "WARNING canary megatron-lm: conflict conflicts on main" in summary
    assert "warning: canary megatron-lm: conflict conflicts on main" in res.stdout
    # the series itself is untouched by the canary
    assert demo["v0"] in (sdir / "series.toml").read_text()
