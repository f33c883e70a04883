"""retire and rebase end to end on real git histories: an upstream that merges
one patch verbatim, fixes another differently, merges then reverts a third;
and a real pair of megatron-core releases (0.19.1 -> 0.19.2)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from carry.git import Git
from helpers import SERIES, TOOLS, git, read_json, tool
from fakeup import edit, make_patch, make_upstream, patch_entry, series_toml

PROOF = '''
import importlib

def test_fixed():
    mod = importlib.import_module("megatron.core.{mod}")
    assert mod.{name} == {value!r}
'''


@pytest.fixture
def history(tmp_path):
    up = make_upstream(tmp_path)
    v0 = git(up, "rev-parse", "HEAD")
    sdir = tmp_path / "patches" / "demo"
    specs = {
        "verbatim": ("alpha", 5, "value_5 = 'patched'\n", "value_5", "patched"),
        "different": ("beta", 10, "value_10 = 'patched'\n", "value_10", "patched"),
        "reverted": ("gamma", 20, "value_20 = 'patched'\n", "value_20", "patched"),
        "plain": ("delta", 15, "value_15 = 'patched'\n", "value_15", "patched"),
    }
    (sdir / "proofs" / "megatron_lm").mkdir(parents=True)
    (sdir / "proofs" / "pytest.ini").write_text((SERIES / "proofs" / "pytest.ini").read_text())
    entries = []
    for i, (pid, (mod, line, new, name, value)) in enumerate(specs.items(), 1):
        rel = f"megatron-lm/{i:04d}-{pid}.patch"
        make_patch(up, v0, [(f"megatron/core/{mod}.py", line, new)], f"demo: {pid}", sdir / rel)
        (sdir / f"proofs/megatron_lm/test_{pid}.py").write_text(PROOF.format(mod=mod, name=name, value=value))
        entries.append(patch_entry(pid, rel, proof=f"proofs/megatron_lm/test_{pid}.py"))
    # upstream history: merge 'verbatim' as is, fix 'different' its own way, merge then revert 'reverted'
    g = Git(up)
    g("am", "-q", str(sdir / "megatron-lm/0001-verbatim.patch"))
    edit(up, "megatron/core/beta.py", 10, 'value_10 = "patched"  # fixed upstream, differently\n')
    g.commit_all("upstream: fix beta")
    g("am", "-q", str(sdir / "megatron-lm/0003-reverted.patch"))
    merged = g.head()
    v1 = merged
    g("revert", "--no-edit", merged)
    v2 = g.head()
    entries[2]["merged_in"] = merged
    (sdir / "series.toml").write_text(series_toml(v0, "https://example.invalid/up.git", entries))
    return {"up": up, "v0": v0, "v1": v1, "v2": v2, "series": sdir, "tmp": tmp_path,
            "cache": tmp_path / "cache"}


def retire(h, target, *extra, check=None):
    return tool("retire", "--series", h["series"], "--against", f"megatron-lm={target}", "--source",
                f"megatron-lm={h['up']}",
                "--cache", h["cache"], *extra, check=check)


def test_verdicts_and_evidence(history):
    out = history["tmp"] / "r.json"
    retire(history, history["v2"], "--json", out, check=0)
    doc = read_json(out)
    v = {p["id"]: p for p in doc["patches"]}
    assert (v["verbatim"]["verdict"], v["verbatim"]["text"], v["verbatim"]["behaviour"]) == ("landed", "landed", "pass")
    assert v["different"]["verdict"] == "landed" and v["different"]["behaviour"] == "pass"
    assert v["different"]["text"] == "conflicts" and "differently" in " ".join(v["different"]["disagreements"])
    assert (v["reverted"]["verdict"], v["reverted"]["behaviour"], v["reverted"]["link"]) == ("needed", "fail", "landed")
    assert v["reverted"]["disagreements"], "link says landed, the proof says the bug is back: reported"
    assert (v["plain"]["verdict"], v["plain"]["text"], v["plain"]["behaviour"]) == ("needed", "applies", "fail")
    assert doc["written"] is False
    # Every proof run forked from a zygote, as prove's do: the imports no tree provides are paid once a retire,
    # not once a proof. Where torch sees a CUDA device no run forks (README, "A zygote per prove").
    import torch
    way = "fresh" if torch.cuda.is_available() else "zygote"
    assert {pid: p["via"] for pid, p in v.items()} == {pid: [way] for pid in v}, v
    # before the revert, the merged patch is landed by text, link and behaviour
    out1 = history["tmp"] / "r1.json"
    retire(history, history["v1"], "--json", out1, check=0)
    v1 = {p["id"]: p for p in read_json(out1)["patches"]}
    assert (v1["reverted"]["verdict"], v1["reverted"]["link"]) == ("landed", "landed")


def test_the_upstream_tests_a_patch_fixed_are_listed_as_its_evidence(history):
    """A patch's upstream_tests (tools/upstream_tests.py --record-fixed) are named in its evidence, not run without
    --upstream-tests (tests/test_upstream_record.py runs them); a patch without them names none."""
    from carry.series.edit import set_upstream_tests
    manifest = history["series"] / "series.toml"
    tests = [f"megatron-lm:tests/unit_tests/test_x.py::test_{i}" for i in range(4)]
    manifest.write_text(set_upstream_tests(manifest.read_text(), "plain", tests))
    out = history["tmp"] / "r.json"
    retire(history, history["v2"], "--json", out, check=0)
    v = {p["id"]: p for p in read_json(out)["patches"]}
    said = [e for e in v["plain"]["evidence"] if e.startswith("upstream's own tests it fixed")]
    assert said == ["upstream's own tests it fixed (its upstream_tests, 4, not run: --upstream-tests runs them): "
                    + ", ".join(tests[:3]) + " ..."], v["plain"]["evidence"]
    assert not [e for e in v["verbatim"]["evidence"] if "upstream_tests" in e], v["verbatim"]
    # with --upstream-tests, an upstream that pins no tests runs none: said, and the proof alone decides
    retire(history, history["v2"], "--json", out, "--upstream-tests", check=0)
    v = {p["id"]: p for p in read_json(out)["patches"]}
    assert "upstream's own tests it fixed: 4 of megatron-lm's, which pins no tests: not run" in v["plain"]["evidence"]
    assert (v["plain"]["verdict"], v["plain"]["behaviour"], v["plain"]["disagreements"]) == ("needed", "fail", []), v


def test_write_retires_repins_and_reapplies(history):
    before = (history["series"] / "series.toml").read_text()
    res = retire(history, history["v2"], "--write", check=0)
    assert "retired: verbatim, different" in res.stdout
    sdir = history["series"]
    text = (sdir / "series.toml").read_text()
    assert text != before and history["v2"] in text and history["v0"] not in text
    assert 'id = "verbatim"' not in text and 'id = "different"' not in text and 'id = "plain"' in text
    rec = (sdir / "retired" / "verbatim" / "record.toml").read_text()
    assert "reverse-applies" in rec and history["v2"] in rec
    assert (sdir / "retired" / "verbatim" / "0001-verbatim.patch").exists()
    assert not (sdir / "megatron-lm" / "0001-verbatim.patch").exists()
    assert not (sdir / "proofs/megatron_lm/test_verbatim.py").exists()
    tool("lint", "--series", sdir, check=0)
    tool("apply", "--series", sdir, "--workdir", history["tmp"] / "w", "--cache", history["cache"],
         "--source", f"megatron-lm={history['up']}", check=0)


def test_write_does_nothing_when_the_rest_does_not_apply(history):
    # a new upstream commit that breaks 'plain'
    up = history["up"]
    edit(up, "megatron/core/delta.py", 15, "value_15 = 'theirs'\n")
    v3 = Git(up).commit_all("upstream: clash with plain")
    before = (history["series"] / "series.toml").read_text()
    res = retire(history, v3, "--write", check=1)
    assert "nothing was written" in res.stderr
    assert (history["series"] / "series.toml").read_text() == before
    assert not (history["series"] / "retired").exists() or not any((history["series"] / "retired").iterdir())
    assert (history["series"] / "megatron-lm/0001-verbatim.patch").exists()


def test_a_proof_that_passes_where_the_patch_still_applies_is_only_a_candidate(history):
    """Upstream fixes 'plain' its own way without touching the patch's lines: the proof passes on the new
    base and the patch still applies. Landed, but a candidate: --write leaves it in the series unless
    --accept-candidates. And a patch with two proofs, one red on the new base, is needed: the green one
    does not outvote it."""
    up, sdir = history["up"], history["series"]
    with open(up / "megatron/core/delta.py", "a") as f:
        f.write('value_15 = "patched"  # fixed upstream, another way\n')
    v3 = Git(up).commit_all("upstream: fix delta its own way")
    (sdir / "proofs/megatron_lm/test_reverted_also.py").write_text(
        PROOF.format(mod="gamma", name="value_1", value=1))
    toml = sdir / "series.toml"
    one = 'proof = "proofs/megatron_lm/test_reverted.py"'
    assert toml.read_text().count(one) == 1
    toml.write_text(toml.read_text().replace(
        one, 'proof = ["proofs/megatron_lm/test_reverted.py", "proofs/megatron_lm/test_reverted_also.py"]'))
    out = history["tmp"] / "r.json"
    res = retire(history, v3, "--write", "--json", out, check=0)
    doc = read_json(out)
    v = {p["id"]: p for p in doc["patches"]}
    assert (v["plain"]["verdict"], v["plain"]["text"], v["plain"]["behaviour"], v["plain"]["candidate"]) == \
        ("landed", "applies", "pass", True), v["plain"]
    assert "a candidate, not a certainty" in " ".join(v["plain"]["disagreements"]), v["plain"]
    assert (v["reverted"]["verdict"], v["reverted"]["behaviour"]) == ("needed", "fail"), v["reverted"]
    assert doc["retired"] == ["verbatim", "different"] and "retired: verbatim, different;" in res.stdout, doc
    text = toml.read_text()
    assert 'id = "plain"' in text and 'id = "reverted"' in text and v3 in text, text
    # accepted: the candidate is retired too
    res = retire(history, v3, "--write", "--accept-candidates", "--json", out, check=0)
    assert read_json(out)["retired"] == ["plain"], read_json(out)
    assert 'id = "plain"' not in toml.read_text() and (sdir / "retired" / "plain" / "record.toml").exists()


def test_a_change_upstream_made_in_other_context_is_landed_by_its_3way_apply(history):
    """Upstream makes 'plain''s change and also edits a line of its context: the patch no longer
    reverse-applies, but applying it 3-way finds the change already there. Landed by text, as by behaviour."""
    from fakeup import edit
    up = history["up"]
    edit(up, "megatron/core/delta.py", 15, "value_15 = 'patched'\n")
    edit(up, "megatron/core/delta.py", 18, "value_18 = 'upstream moved the context'\n")
    v3 = Git(up).commit_all("upstream: plain's change, with its context moved")
    out = history["tmp"] / "r.json"
    retire(history, v3, "--json", out, check=0)
    v = {p["id"]: p for p in read_json(out)["patches"]}["plain"]
    assert (v["verdict"], v["text"], v["behaviour"], v["disagreements"]) == ("landed", "landed", "pass", []), v
    assert "text: applying it on the new base (3-way) finds the change already there" in v["evidence"], v


@pytest.mark.parametrize("text, behaviour, link, verdict, candidate, disagrees", [
    # the proof could not run: no behaviour evidence, whatever the text and the link say
    ("landed", "error", "landed", "unknown", False, True),
    # the bug is gone upstream
    ("landed", "pass", "n/a", "landed", False, False),
    ("applies", "pass", "not-yet", "landed", True, True),   # fixed some other way: only a candidate
    ("applies", "pass", "landed", "landed", False, False),
    ("conflicts", "pass", "n/a", "landed", False, True),
    # the bug is still there upstream
    ("landed", "fail", "n/a", "needed", False, True),
    ("applies", "fail", "landed", "needed", False, True),
    ("applies", "fail", "n/a", "needed", False, False),
    ("conflicts", "fail", "not-yet", "conflicts", False, False),
    # no behaviour evidence (no proof, or a proof skipped here): the text and the link decide
    ("landed", "no-proof", "n/a", "landed", False, False),
    ("applies", "skipped", "landed", "landed", False, False),
    ("conflicts", "skipped", "not-yet", "conflicts", False, False),
    ("conflicts", "no-proof", "n/a", "conflicts", False, False),
    ("applies", "no-proof", "not-yet", "needed", False, False),
    ("n/a", "skipped", "not-yet", "unknown", False, False),
])
def test_each_way_the_evidence_can_fall_gives_its_verdict(text, behaviour, link, verdict, candidate, disagrees):
    from carry.evidence.retire import _decide
    got, cand, dis = _decide(text, behaviour, link)
    assert (got, cand, bool(dis)) == (verdict, candidate, disagrees), (got, cand, dis)


# The proof of 'plain' says when it runs, then waits: a kill then lands inside the proof runs,
# well before the commit point, however fast the machine is (a fixed sleep raced the run).
STALLS = '''
import os
import time


def test_stalls():
    open(os.environ["CARRY_TEST_PROOF_STARTED"], "w").close()
    time.sleep(120)
'''


def test_interrupted_write_leaves_series_unchanged(history):
    (history["series"] / "proofs/megatron_lm/test_plain.py").write_text(STALLS)
    before = {p: p.read_bytes() for p in history["series"].rglob("*") if p.is_file()}
    started = history["tmp"] / "proof-started"
    proc = subprocess.Popen([sys.executable, str(TOOLS / "retire.py"), "--series", str(history["series"]),
                             "--against", f"megatron-lm={history['v2']}", "--source", f"megatron-lm={history['up']}",
                             "--cache", str(history["cache"]), "--write"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "CARRY_TEST_PROOF_STARTED": str(started)})
    deadline = time.monotonic() + 120
    while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started.exists(), f"the stalling proof never ran: {proc.poll()}"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    after = {p: p.read_bytes() for p in history["series"].rglob("*") if p.is_file()}
    assert after == before
    # A command that reads the series finds nothing journalled to finish, and changes nothing either.
    tool("lint", "--series", history["series"], check=None)
    assert {p: p.read_bytes() for p in history["series"].rglob("*") if p.is_file()} == before


def test_crashing_proof_and_unreachable_base(history):
    # A proof that dies in its test body is a red run of that body: the patch stays needed.
    (history["series"] / "proofs/megatron_lm/test_plain.py").write_text("import os\n\ndef test_x():\n    os._exit(3)\n")
    out = history["tmp"] / "c.json"
    retire(history, history["v2"], "--json", out, check=0)
    v = {p["id"]: p for p in read_json(out)["patches"]}
    assert v["plain"]["behaviour"] == "fail" and v["plain"]["verdict"] == "needed"
    assert "exited 3" in " ".join(v["plain"]["evidence"])
    res = retire(history, "0" * 40, check=1)
    assert "has no commit" in res.stderr
    res = tool("retire", "--series", history["series"], "--against", f"megatron-lm={history['v2']}",
               "--cache", history["cache"], check=1)
    assert "--source" in res.stderr


def test_a_proof_that_cannot_import_its_dependency_is_no_evidence(history):
    """22.3: a proof whose interpreter lacks a module no tree provides (there: torch) is an error
    of the environment; retire must not take it for the bug still being there ('needed')."""
    (history["series"] / "proofs/megatron_lm/test_plain.py").write_text(
        "import carry_test_no_such_dependency  # noqa: F401\n\ndef test_x():\n    pass\n")
    (history["series"] / "proofs/megatron_lm/test_verbatim.py").write_text(
        "import os\n\nos._exit(3)\n\ndef test_x():\n    pass\n")  # dies before any test body
    out = history["tmp"] / "e.json"
    retire(history, history["v2"], "--json", out, check=0)
    v = {p["id"]: p for p in read_json(out)["patches"]}
    for pid in ("plain", "verbatim"):
        assert v[pid]["behaviour"] == "error", v[pid]
        assert "no behaviour evidence" in " ".join(v[pid]["disagreements"]), v[pid]
    assert v["plain"]["verdict"] == "unknown" and "carry_test_no_such_dependency" in " ".join(v["plain"]["evidence"])
    # The text alone still speaks where it can: 'verbatim' reverse-applies on the new base.
    assert (v["verbatim"]["text"], v["verbatim"]["verdict"]) == ("landed", "unknown"), v["verbatim"]


def test_rebase_summary_and_conflict_continue(history, tmp_path):
    sdir = history["series"]
    up = history["up"]
    # v2 + unrelated upstream change near 'plain' (context only) -> refreshed
    edit(up, "megatron/core/delta.py", 13, "value_13 = 'context moved'\n")
    v3 = Git(up).commit_all("upstream: touch context near plain")
    out = tmp_path / "rb.json"
    res = tool("rebase", "--series", sdir, "--onto", f"megatron-lm={v3}", "--source", f"megatron-lm={up}", "--cache",
               history["cache"], "--workdir", tmp_path / "rw", "--json", out, check=1)
    doc = read_json(out)
    e = {x["id"]: x["outcome"] for x in doc["patches"]}
    assert e["different"] == "conflicting" and e["verbatim"] == "dropped"
    assert "--continue" in res.stderr and f"git -C {tmp_path / 'rw' / 'megatron-lm'} am --continue" in res.stderr
    ws = tmp_path / "rw" / "megatron-lm"
    # resolve as a person would: keep upstream's fix for 'different' (drop our patch), continue the rest
    g = Git(ws)
    g("am", "--skip")
    rest = [str(sdir / "megatron-lm/0003-reverted.patch"), str(sdir / "megatron-lm/0004-plain.patch")]
    g("am", "-q", "--3way", *rest)
    # the dropped patch must leave the series first: retire it (landed) on the old base range
    res = tool("rebase", "--series", sdir, "--onto", f"megatron-lm={v3}", "--source", f"megatron-lm={up}", "--cache",
               history["cache"], "--workdir", tmp_path / "rw", "--continue", check=2)
    assert "expected" in res.stderr  # 'different' has no commit: the series must say so first
    text = (sdir / "series.toml").read_text()
    from carry.series.edit import remove_patches
    (sdir / "series.toml").write_text(remove_patches(text, {"different"}))
    (sdir / "megatron-lm/0002-different.patch").unlink()
    res = tool("rebase", "--series", sdir, "--onto", f"megatron-lm={v3}", "--source", f"megatron-lm={up}", "--cache",
               history["cache"], "--workdir", tmp_path / "rw", "--continue", "--json", out, check=0)
    e = {x["id"]: x["outcome"] for x in read_json(out)["patches"]}
    assert e == {"verbatim": "dropped", "reverted": "unchanged", "plain": "refreshed"}
    assert v3 in (sdir / "series.toml").read_text()
    assert "value_13 = 'context moved'" in (sdir / "megatron-lm/0004-plain.patch").read_text()
    tool("apply", "--series", sdir, "--workdir", tmp_path / "w", "--cache", history["cache"],
         "--source", f"megatron-lm={up}", check=0)


# -- a real pair of PyPI releases ------------------------------------------------------
PAIR_PROOF = '''
"""0.19.1's TransformerLayer lacks get_inner_quantization_context (0.19.2 adds it)."""
from contextlib import nullcontext
from types import SimpleNamespace

from megatron.core.transformer.transformer_layer import TransformerLayer


def test_layer_has_quantization_context():
    fake = SimpleNamespace(config=SimpleNamespace(fp8=None, fp4=None, fp8_recipe=None), layer_number=1)
    ctx = TransformerLayer.get_inner_quantization_context(fake)
    assert isinstance(ctx, nullcontext)
'''

OLD_WHEEL = ("megatron_core-0.19.1-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
             "615c0cc84df2d0cb67dc9ade04686d78ac1624772550315db2150fd941dd9390")


@pytest.mark.network
@pytest.mark.slow
def test_real_release_pair_landed_by_behaviour(tmp_path, pin_cache):
    sdir = tmp_path / "patches" / "pair"
    pins = (SERIES / "series.toml").read_text().split("\n[[patches]]")[0].split("[upstreams.megatron-bridge]")[0]
    pins = pins.replace('name = "gtp"', 'name = "pair"').replace('version = "0.19.2"', 'version = "0.19.1"')
    import re
    pins = re.sub(r"artifacts = \[.*?\n\]", f'artifacts = [\n  {{ file = "{OLD_WHEEL[0]}", sha256 = "{OLD_WHEEL[1]}", '
                  'tree = true },\n]', pins, flags=re.S)
    sdir.mkdir(parents=True)
    (sdir / "series.toml").write_text(pins)
    author = tmp_path / "author"
    tool("apply", "--series", sdir, "--workdir", author, "--cache", pin_cache, check=0)
    ws = author / "megatron-lm"
    f = ws / "megatron/core/transformer/transformer_layer.py"
    text = f.read_text()
    anchor = "        self.bias_dropout_add_exec_handler = torch.enable_grad\n"
    assert anchor in text
    text = text.replace(anchor, anchor + "\n    def get_inner_quantization_context(self):\n"
                        "        \"\"\"Carried: the low-precision context the fine-grained schedule needs.\"\"\"\n"
                        "        from contextlib import nullcontext\n\n"
                        "        cfg = self.config\n"
                        "        if cfg.fp8 and str(cfg.fp8_recipe) != 'delayed':\n"
                        "            from megatron.core.fp8_utils import get_fp8_context\n\n"
                        "            return get_fp8_context(cfg, self.layer_number - 1)\n"
                        "        if cfg.fp4:\n"
                        "            from megatron.core.fp4_utils import get_fp4_context\n\n"
                        "            return get_fp4_context(cfg, self.layer_number - 1)\n"
                        "        return nullcontext()\n", 1)
    f.write_text(text)
    from carry.workspace.export import format_patch
    commit = Git(ws).commit_all("transformer_layer: a quantization context for fine-grained schedules")
    (sdir / "megatron-lm").mkdir()
    (sdir / "megatron-lm/0001-quant-context.patch").write_bytes(format_patch(ws, commit))
    (sdir / "proofs/megatron_lm").mkdir(parents=True)
    (sdir / "proofs/pytest.ini").write_text((SERIES / "proofs/pytest.ini").read_text())
    (sdir / "proofs/megatron_lm/test_quant_context.py").write_text(PAIR_PROOF)
    (sdir / "series.toml").write_text(pins + """
[[patches]]
id = "quant-context"
upstream = "megatron-lm"
title = "TransformerLayer.get_inner_quantization_context"
file = "megatron-lm/0001-quant-context.patch"
status = "pending"
owner = "tests"
why = "0.19.1's fine-grained schedule ignores FP4"
retire_when = "a release has the method"
proof = "proofs/megatron_lm/test_quant_context.py"
""")
    out = tmp_path / "pair.json"
    tool("retire", "--series", sdir, "--against", "megatron-lm=0.19.2", "--cache", pin_cache, "--json", out,
         timeout=1800, check=0)
    v = read_json(out)["patches"][0]
    assert v["verdict"] == "landed" and v["behaviour"] == "pass", v
    assert v["text"] in ("conflicts", "applies"), v  # upstream wrote it its own way


def test_patch_id_finds_a_merged_patch_that_upstream_later_changed(history):
    """Neither reverse-apply nor 3-way sees 'verbatim' any more once upstream edits the same line
    again; its patch-id still finds the commit that merged it, and the disagreement with the
    (now failing) proof is reported."""
    up = history["up"]
    merged = git(up, "log", "--format=%H", "-1", "--grep=demo: verbatim")
    edit(up, "megatron/core/alpha.py", 5, "value_5 = 'patched, then changed upstream'\n")
    v3 = Git(up).commit_all("upstream: rework alpha")
    out = history["tmp"] / "pid.json"
    retire(history, v3, "--json", out, check=0)
    v = {p["id"]: p for p in read_json(out)["patches"]}["verbatim"]
    assert v["text"] == "landed" and f"upstream commit {merged[:12]} has the same patch-id" in " ".join(v["evidence"])
    assert (v["behaviour"], v["verdict"]) == ("fail", "needed") and v["disagreements"]


def _pypi_first(h, git_table: bool = True) -> None:
    """The history series pinned like megatron-lm is in gtp: PyPI first, a git table with a ref only
    (or no git table at all, like megatron-bridge)."""
    toml = h["series"] / "series.toml"
    text = toml.read_text()
    _, rest = text.split("[[patches]]", 1)
    pins = ('[series]\nname = "demo"\ndescription = "test series"\n\n'
            '[upstreams.megatron-lm]\npython_path = "."\nsources = ["pypi"' + (', "git"' if git_table else "") + ']\n\n'
            '[upstreams.megatron-lm.pypi]\nname = "megatron-core"\nversion = "0.0.1"\n'
            'map = { "megatron/" = "megatron/" }\n'
            f'artifacts = [\n  {{ file = "demo-0.0.1-py3-none-any.whl", sha256 = "{"0" * 64}", tree = true }},\n]\n\n'
            + ('[upstreams.megatron-lm.git]\nurl = "https://example.invalid/up.git"\nref = "v0"\n'
               'paths = ["megatron/core"]\n\n' if git_table else ""))
    toml.write_text(pins + "[[patches]]" + rest)


def test_a_checkout_moves_a_pypi_pin_to_git_with_link_evidence(history):
    """A release night rehearsed on an upstream's main: --source is a checkout of a PyPI-pinned
    upstream. Before the fix the checkout's commit was no pin: no link evidence (merged_in never
    checked) and --write kept the PyPI pin while claiming to have moved it."""
    _pypi_first(history)
    tool("lint", "--series", history["series"], check=0)
    out = history["tmp"] / "l.json"
    retire(history, history["v1"], "--json", out, check=0)
    v = {p["id"]: p for p in read_json(out)["patches"]}
    assert v["reverted"]["link"] == "landed", v["reverted"]
    assert any("is an ancestor of the new base" in e for e in v["reverted"]["evidence"])
    res = retire(history, history["v2"], "--write", check=0)
    assert "retired: verbatim, different" in res.stdout
    text = (history["series"] / "series.toml").read_text()
    assert 'sources = ["git"]' in text and f'commit = "{history["v2"]}"' in text, text[:900]
    tool("lint", "--series", history["series"], check=0)
    tool("apply", "--series", history["series"], "--workdir", history["tmp"] / "w", "--cache", history["cache"],
         "--source", f"megatron-lm={history['up']}", check=0)


def test_write_refuses_a_checkout_for_an_upstream_without_git_pin(history, tmp_path):
    _pypi_first(history, git_table=False)
    before = {p: p.read_bytes() for p in history["series"].rglob("*") if p.is_file()}
    res = retire(history, history["v2"], "--write", check=2)
    assert "cannot become its pin" in res.stderr and "nothing was written" in res.stderr
    res = tool("rebase", "--series", history["series"], "--onto", f"megatron-lm={history['v2']}", "--source",
               f"megatron-lm={history['up']}", "--cache", history["cache"], "--workdir", tmp_path / "rw", check=2)
    assert "cannot become its pin" in res.stderr
    assert {p: p.read_bytes() for p in history["series"].rglob("*") if p.is_file()} == before
    retire(history, history["v2"], check=0)  # the verdicts alone still work


def merged_in_its_own_words(history) -> tuple:
    """Upstream fixes delta its own way (v3), and series.toml records merged_in for 'different' (the
    commit before v1) and 'plain' (v3): (upstream, series folder, v3)."""
    up, sdir = history["up"], history["series"]
    fixed_beta = git(up, "rev-parse", f"{history['v1']}~1")
    edit(up, "megatron/core/delta.py", 15, 'value_15 = "patched"  # upstream, in its own words\n')
    v3 = Git(up).commit_all("upstream: fix delta its own way")
    toml = sdir / "series.toml"
    text = toml.read_text()
    for pid, commit in (("different", fixed_beta), ("plain", v3)):
        text = text.replace(f'id = "{pid}"\n', f'id = "{pid}"\nmerged_in = "{commit}"\n', 1)
    toml.write_text(text)
    return up, sdir, v3


def test_rebase_retires_a_patch_upstream_merged_in_its_own_words(history, tmp_path):
    """Upstream fixed 'different' and 'plain' in its own words and merged_in records those commits:
    their text conflicts with the new base, so rebase used to stop for a person, who then had to
    skip them and edit series.toml by hand (retire --write could not: the rest did not apply yet).
    Now rebase retires them with that evidence and finishes unattended."""
    up, sdir, v3 = merged_in_its_own_words(history)
    toml = sdir / "series.toml"
    out = tmp_path / "rb.json"
    tool("rebase", "--series", sdir, "--onto", f"megatron-lm={v3}", "--source", f"megatron-lm={up}", "--cache",
         history["cache"], "--workdir", tmp_path / "rw", "--json", out, check=0)
    e = {x["id"]: x for x in read_json(out)["patches"]}
    assert {k: v["outcome"] for k, v in e.items()} == {
        "verbatim": "dropped", "different": "dropped", "reverted": "unchanged", "plain": "dropped"}
    assert "retired" in e["plain"]["detail"] and "ancestor" in e["plain"]["detail"]
    text = toml.read_text()
    assert 'id = "different"' not in text and 'id = "plain"' not in text and 'id = "reverted"' in text
    assert v3 in text
    rec = (sdir / "retired" / "plain" / "record.toml").read_text()
    assert "is an ancestor of the new base" in rec and "conflicts" in rec
    assert not (sdir / "megatron-lm/0004-plain.patch").exists()
    tool("lint", "--series", sdir, check=0)
    tool("apply", "--series", sdir, "--workdir", tmp_path / "w", "--cache", history["cache"],
         "--source", f"megatron-lm={up}", check=0)


def test_a_checkout_of_a_pypi_only_upstream_gives_the_wheel_tree(history):
    """megatron-bridge is pinned on PyPI only; its main checkout (a snapshot) lacks the blobs of its
    large documentation files. Before, the base was the whole commit and cloning it failed
    ("unable to read sha1 file"); now a checkout of such an upstream is narrowed to what its wheel
    maps (pypi.map), the tree a release would give."""
    _pypi_first(history, git_table=False)
    up = history["up"]
    (up / "docs").mkdir()
    (up / "docs" / "big.gif").write_bytes(b"GIF89a" + bytes(range(256)) * 64)
    v3 = Git(up).commit_all("upstream: a large picture in the docs")
    blob = git(up, "rev-parse", f"{v3}:docs/big.gif")
    (up / ".git" / "objects" / blob[:2] / blob[2:]).unlink()  # as the snapshot has it: listed, absent
    out = history["tmp"] / "b.json"
    retire(history, v3, "--json", out, check=0)
    v = {p["id"]: p for p in read_json(out)["patches"]}
    assert v["verbatim"]["verdict"] == "landed" and v["plain"]["verdict"] == "needed", v


def test_three_way_finds_the_old_blobs_on_a_one_commit_base(history):
    """A new base of one commit (a tree: a release, or a pin narrowed to paths) has none of the
    blobs a patch was written against; git 2.39 says "Repository lacks necessary blobs to fall back
    on 3-way merge", which the fallback did not recognise, so a patch whose context merely moved
    was reported as a conflict (mlm-gtp-ckpt-without-te on Megatron-LM main)."""
    _pypi_first(history)
    up = history["up"]
    retire(history, history["v0"], check=0)  # the old base is now cached, as after a night at the old pin
    edit(up, "megatron/core/delta.py", 13, "value_13 = 'context moved'\n")
    # and no other file of the new base keeps delta.py's old content (gamma.py did, after the revert)
    edit(up, "megatron/core/gamma.py", 38, "value_38 = 'elsewhere'\n")
    v3 = Git(up).commit_all("upstream: touch context near plain")
    out = history["tmp"] / "t.json"
    retire(history, v3, "--json", out, check=0)
    v = {p["id"]: p for p in read_json(out)["patches"]}
    assert v["plain"]["text"] == "applies" and v["plain"]["verdict"] == "needed", v["plain"]


def test_repin_keeps_the_comment_that_introduces_the_next_section():
    """The rehearsal's retire --write on nemo-rl dropped series.toml's "# -- patches, ..." banner:
    the last pin table's block ran to the next header, and repin rewrote it whole."""
    from dataclasses import replace

    from carry.series import edit as seriesedit
    from carry.series.manifest import load

    series = load(SERIES)
    text = (SERIES / "series.toml").read_text()
    banner = "# -- patches, in application order per upstream"
    assert banner in text
    up = series.upstream("nemo-rl")
    out = seriesedit.repin(text, replace(up, git=replace(up.git, commit="a" * 40)), "git")
    assert banner in out and 'commit = "' + "a" * 40 + '"' in out
    assert out.replace("a" * 40, up.git.commit) == text
