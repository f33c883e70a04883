"""The nightly's canary (carry.evidence.canary) end to end: a demo series pinned at v0 of a real git
upstream whose main (v1) has one patch's fix, moved context near another, and clashes with a
third; real proofs (one that fails on main, one that needs a GPU). The verdicts come from
carry.evidence.retire; the canary states them for main and never fails the night."""

from __future__ import annotations

from pathlib import Path

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


# -- issue 34, part 2: the canary every night ----------------------------------------------------
def _repo_with_main(path: Path, files: dict[str, str], branch: str = "main") -> str:
    from carry.git import Git
    g = Git(path)
    g.init()
    g("checkout", "-q", "-B", branch)
    for name, text in files.items():
        (path / name).write_text(text)
    return g.commit_all(f"{branch}: {', '.join(files)}")


def test_fetch_main_makes_a_bare_cache_and_the_next_night_reuses_it(tmp_path):
    from carry.evidence.canary import fetch_main
    from carry.git import Git
    up, cache = tmp_path / "up", tmp_path / "mains" / "up.git"
    c1 = _repo_with_main(up, {"a.py": "a = 1\n"})
    assert fetch_main(str(up), cache) == (c1, "")
    g = Git(cache)
    assert g("rev-parse", "--is-bare-repository").stdout.strip() == "true"
    assert g.rev_parse("HEAD") == c1  # a mirror whose HEAD is main, as --canary wants
    stamp = (cache / "objects").stat().st_ino
    (up / "a.py").write_text("a = 2\n")
    c2 = Git(up).commit_all("main: a = 2")
    assert fetch_main(str(up), cache) == (c2, "")
    assert (cache / "objects").stat().st_ino == stamp and g.has_commit(c1)  # the same cache, brought up to date
    assert g.rev_parse("HEAD") == c2


def test_fetch_main_that_cannot_fetch_says_why_and_touches_nothing(tmp_path):
    import subprocess
    from carry.evidence.canary import fetch_main
    gone, cache = tmp_path / "not-yet", tmp_path / "mains" / "x.git"
    head, why = fetch_main(str(gone), cache)
    assert head is None and f"could not fetch main of {gone}" in why, why
    # its next: command works when pasted, once the upstream is there
    c1 = _repo_with_main(gone, {"a.py": "a = 1\n"})
    cmd = why.split("(next: ", 1)[1].rstrip(")")
    assert subprocess.run(["bash", "-c", cmd], capture_output=True).returncode == 0, cmd
    assert fetch_main(str(gone), cache) == (c1, "")
    # a branch that is not there
    other = tmp_path / "other"
    _repo_with_main(other, {"b.py": "b = 1\n"}, branch="trunk")
    head, why = fetch_main(str(other), tmp_path / "mains" / "other.git")
    assert head is None and "could not fetch main of" in why
    # something that is not a bare repository is refused and left as it was
    for bad in (tmp_path / "a-file", tmp_path / "a-checkout"):
        if bad.name == "a-file":
            bad.write_text("mine\n")
        else:
            _repo_with_main(bad, {"c.py": "c = 1\n"})
        head, why = fetch_main(str(gone), bad)
        assert head is None and "is not a bare git repository: not touched" in why, why
    assert (tmp_path / "a-file").read_text() == "mine\n" and (tmp_path / "a-checkout" / "c.py").exists()


def test_the_night_fetches_each_main_and_one_it_cannot_fetch_is_error_never_landed(demo, tmp_path):
    """--fetch-mains before the night, into a cache the next night reuses; the next night's fetch
    fails (the URL is gone): its rows are error, not last night's 'landed' from the stale cache."""
    from carry.git import Git
    assert Git(demo["up"]).rev_parse("main") == demo["v1"]  # the demo upstream's main is v1
    sdir = demo["series"]
    add_proofs(sdir, {"good": GOOD, "gpu": GPU}, {"clean": "good", "threeway": "gpu"}, SERIES / "proofs" / "pytest.ini")
    cache = tmp_path / "mains" / "megatron-lm.git"

    def night(url: str, name: str):
        config = tmp_path / f"{name}.toml"
        config.write_text(proofs_matrix(str(sdir), patches=["clean"], proof_timeout_s=120)
                          + f'\n[canary]\nmains = {{ megatron-lm = "{url}" }}\n')
        out = tmp_path / name
        res = tool("nightly", "--config", config, "--out", out, "--workdir", tmp_path / "nwork", "--cache",
                   demo["cache"], "--source", f"megatron-lm={demo['up']}", "--history", tmp_path / "h.jsonl",
                   "--fetch-mains", "--canary", f"megatron-lm={cache}", check=0, timeout=600)
        return res, read_json(out / "nightly.json"), (out / "summary.md").read_text()

    res, doc, md = night(str(demo["up"]), "n1")
    (c,) = doc["canary"]
    assert c["head"] == demo["v1"] and c["error"] is None, c
    rows = {r["id"]: r["verdict"] for r in c["rows"]}
    assert rows["upstreamed"] == "landed" and rows["conflict"] == "conflicts", rows
    res, doc, md = night(str(tmp_path / "moved-away"), "n2")
    assert doc["ok"] is True  # the release cells judge the night
    (c,) = doc["canary"]
    assert "could not fetch main of" in c["error"], c
    assert {r["verdict"] for r in c["rows"]} == {"error"}, c["rows"]
    assert "WARNING canary megatron-lm: could not fetch main" in md and "| upstreamed | error |" in md
    assert Git(cache).rev_parse("HEAD") == demo["v1"]  # last night's cache is kept, not used


def test_the_scheduled_nightlies_fetch_and_run_the_canary_for_every_upstream():
    from carry.nightly.config import load as load_matrix
    from carry.series.repo import load_series
    from helpers import ROOT
    names = [u.name for u in load_series("gtp").upstreams]
    cfg = load_matrix(ROOT / "integration" / "nightly.toml")
    assert sorted(cfg.mains) == sorted(names) and cfg.main_branch == "main"
    sbatch = (ROOT / "integration" / "slurm" / "nightly.sbatch").read_text()
    workflow = (ROOT / ".github" / "workflows" / "nightly.yml").read_text()
    jobs = workflow.split("\n  gpu:\n")
    assert len(jobs) == 2
    for where, text in (("nightly.sbatch", sbatch), ("cpu job", jobs[0]), ("gpu job", jobs[1])):
        call = text[text.index("tools/nightly.py"):]
        call = call[:call.index("\n", call.index("--canary nemo-rl") if "--canary nemo-rl" in call else 0)]
        assert "--fetch-mains" in call, where
        for name in names:
            assert f"--canary {name}=" in call, (where, name)
    for job in jobs:
        assert "path: nightly-mains" in job and "actions/cache/save" in job  # the next night reuses the cache
