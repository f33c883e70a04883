"""apply/export end to end on a real git upstream built here: clean, 3-way,
already-upstream and conflicting patches; idempotency; --check; --only;
foreign changes; --into; the export round trip."""

from __future__ import annotations

import shutil

from carry.git import Git
from fakeup import write
from helpers import apply_demo as apply, git, kill_at, read_json, tool


def statuses(report_path):
    doc = read_json(report_path)
    return {p["id"]: p["status"] for u in doc["upstreams"] for p in u["patches"]}, doc


def test_apply_on_pinned_base_then_idempotent(demo):
    out = demo["tmp"] / "r1.json"
    apply(demo, "--json", out, check=0)
    st, doc = statuses(out)
    assert st == dict.fromkeys(["clean", "threeway", "upstreamed", "conflict"], "applied")
    assert doc["ok"] is True and doc["series"] == "demo"
    u = doc["upstreams"][0]
    assert u["name"] == "megatron-lm" and u["workspace"] == str(demo["work"] / "megatron-lm")
    ws = demo["work"] / "megatron-lm"
    log = git(ws, "log", "--format=%s", "--reverse").splitlines()
    # The base is the pinned upstream commit itself, then one commit per patch.
    assert log[0] == "upstream v0" and len(log) == 5 and log[1] == "demo: clean change"
    assert git(ws, "rev-parse", "HEAD~4") == demo["v0"] == u["base_commit"]
    assert u["head"] == git(ws, "rev-parse", "HEAD")
    assert "value_5 = 'patched'" in (ws / "megatron/core/alpha.py").read_text()

    # Second run: nothing to do, nothing touched.
    before = git(ws, "rev-parse", "HEAD")
    mtime = (ws / "megatron/core/alpha.py").stat().st_mtime_ns
    out2 = demo["tmp"] / "r2.json"
    apply(demo, "--json", out2, check=0)
    st2, _ = statuses(out2)
    assert set(st2.values()) == {"already-applied"}
    assert git(ws, "rev-parse", "HEAD") == before
    assert (ws / "megatron/core/alpha.py").stat().st_mtime_ns == mtime


def test_heads_are_reproducible(demo, tmp_path):
    apply(demo, check=0)
    other = dict(demo, work=tmp_path / "elsewhere", cache=tmp_path / "cache2")
    apply(other, check=0)
    assert git(demo["work"] / "megatron-lm", "rev-parse", "HEAD") == git(other["work"] / "megatron-lm", "rev-parse", "HEAD")


def test_new_base_threeway_upstreamed_and_conflict_changes_nothing(demo):
    apply(demo, check=0)
    ws = demo["work"] / "megatron-lm"
    old_head = git(ws, "rev-parse", "HEAD")
    old_state = (demo["work"] / ".carry" / "state.json").read_text()

    demo["write_series"](demo["v1"])
    out = demo["tmp"] / "bump.json"
    res = apply(demo, "--json", out, check=1)
    st, doc = statuses(out)
    assert doc["ok"] is False
    assert st == {"clean": "applied", "threeway": "applied", "upstreamed": "already-applied", "conflict": "failed"}
    detail = {p["id"]: p["detail"] for p in doc["upstreams"][0]["patches"]}
    assert "3-way" in detail["threeway"]
    assert "megatron/core/delta.py" in detail["conflict"] and "@@" in detail["conflict"]
    # The message names upstream, patch, file, and what to do next.
    assert "megatron-lm" in res.stderr and "conflict" in res.stderr and "delta.py" in res.stderr
    assert "nothing was changed" in res.stderr
    # Nothing changed.
    assert git(ws, "rev-parse", "HEAD") == old_head
    assert (demo["work"] / ".carry" / "state.json").read_text() == old_state
    assert git(ws, "status", "--porcelain") == ""
    assert not list((demo["work"] / ".carry").glob("staging-*"))

    # Without the conflicting patch the series moves to v1.
    demo["write_series"](demo["v1"], ids=("clean", "threeway", "upstreamed"))
    out = demo["tmp"] / "bump2.json"
    apply(demo, "--json", out, check=0)
    st, _ = statuses(out)
    assert st == {"clean": "applied", "threeway": "applied", "upstreamed": "already-applied"}
    text = (ws / "megatron/core/beta.py").read_text()
    assert "value_8 = 'upstream v1'" in text and "value_10 = 'patched'" in text
    assert git(ws, "rev-list", "--count", f"{demo['v1']}..HEAD") == "2"  # two real commits on the pinned v1


def test_check_is_a_dry_run(demo):
    res = apply(demo, "--check", "--json", demo["tmp"] / "c.json", check=0)
    assert not (demo["work"] / "megatron-lm").exists()
    assert "check only" in res.stdout
    demo["write_series"](demo["v1"])
    apply(demo, "--check", check=1)
    assert not (demo["work"] / "megatron-lm").exists()


def test_only_selects_patches_and_requires(demo):
    sdir = demo["series"]
    text = (sdir / "series.toml").read_text().replace(
        'id = "threeway"', 'id = "threeway"\nrequires = ["clean"]')
    (sdir / "series.toml").write_text(text)
    out = demo["tmp"] / "only.json"
    apply(demo, "--only", "threeway", "--json", out, check=0)
    st, _ = statuses(out)
    assert st == {"clean": "applied", "threeway": "applied", "upstreamed": "not-attempted",
                  "conflict": "not-attempted"}
    ws = demo["work"] / "megatron-lm"
    assert len(git(ws, "log", "--format=%H").splitlines()) == 3
    # Going back to the whole series rebuilds; no leftovers of the partial one.
    apply(demo, check=0)
    assert len(git(ws, "log", "--format=%H").splitlines()) == 5
    res = apply(demo, "--only", "no-such-patch", check=2)
    assert "'no-such-patch', which is neither a patch nor an upstream" in res.stderr
    assert "its patches: clean, threeway, upstreamed, conflict" in res.stderr


def test_refuses_foreign_changes(demo):
    apply(demo, check=0)
    ws = demo["work"] / "megatron-lm"
    head = git(ws, "rev-parse", "HEAD")
    (ws / "megatron/core/alpha.py").write_text("local edit\n")
    demo["write_series"](demo["v0"], ids=("clean", "threeway"))  # a change that would rebuild
    res = apply(demo, check=1)
    assert "uncommitted changes" in res.stderr and "alpha.py" in res.stderr
    assert (ws / "megatron/core/alpha.py").read_text() == "local edit\n"
    git(ws, "commit", "-qam", "my own commit")
    res = apply(demo, check=1)
    assert "commits the series does not know" in res.stderr and "export.py" in res.stderr
    assert git(ws, "rev-parse", "HEAD") != head
    # A directory that the tool did not make is never replaced.
    shutil.rmtree(demo["work"])
    (demo["work"] / "megatron-lm").mkdir(parents=True)
    (demo["work"] / "megatron-lm" / "keep.txt").write_text("mine")
    res = apply(demo, check=1)
    assert "not made by tools/apply.py" in res.stderr
    assert (demo["work"] / "megatron-lm" / "keep.txt").read_text() == "mine"


def test_export_round_trip_and_edit_workflow(demo):
    apply(demo, check=0)
    sdir = demo["series"]
    before = {p: p.read_bytes() for p in (sdir / "megatron-lm").glob("*.patch")}
    tool("export", "--series", sdir, "--workdir", demo["work"], "--check", check=0)
    tool("export", "--series", sdir, "--workdir", demo["work"], check=0)
    assert {p: p.read_bytes() for p in (sdir / "megatron-lm").glob("*.patch")} == before

    # Edit a patch in the workspace: amend the last commit, export picks it up.
    ws = demo["work"] / "megatron-lm"
    write(ws, "megatron/core/delta.py", (ws / "megatron/core/delta.py").read_text() + "extra = 1\n")
    git(ws, "commit", "-q", "--amend", "-a", "--no-edit")
    drift_json = demo["tmp"] / "drift.json"
    res = tool("export", "--series", sdir, "--workdir", demo["work"], "--check", "--json", drift_json, check=1)
    assert "0004-conflict.patch" in res.stderr
    assert read_json(drift_json)["drift"] == ["megatron-lm/0004-conflict.patch"]
    tool("export", "--series", sdir, "--workdir", demo["work"], check=0)
    assert "+extra = 1" in (sdir / "megatron-lm/0004-conflict.patch").read_text()
    # The workspace now equals the series: apply has nothing to do, and a fresh apply reproduces it.
    st_path = demo["tmp"] / "after.json"
    apply(demo, "--json", st_path, check=0)
    assert set(statuses(st_path)[0].values()) == {"already-applied"}
    fresh = dict(demo, work=demo["tmp"] / "fresh")
    apply(fresh, check=0)
    assert git(fresh["work"] / "megatron-lm", "diff", "HEAD", git(ws, "rev-parse", "HEAD")) == ""


def test_a_new_patch_is_committed_then_entered_then_exported(demo):
    """The README's way to add a patch: commit it in the workspace, add its [[patches]] entry, export."""
    apply(demo, check=0)
    ws = demo["work"] / "megatron-lm"
    write(ws, "megatron/core/epsilon.py", "value = 'new'\n")
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "demo: a new patch")
    sdir = demo["series"]
    res = tool("export", "--series", sdir, "--workdir", demo["work"], check=2)
    assert "needs a [[patches]] entry" in res.stderr  # no entry yet: nothing is written
    assert not (sdir / "megatron-lm" / "0005-new.patch").exists()
    toml = sdir / "series.toml"
    toml.write_text(toml.read_text() + '\n[[patches]]\nid = "new"\nupstream = "megatron-lm"\ntitle = "a new patch"\n'
                    'file = "megatron-lm/0005-new.patch"\nstatus = "pending"\nowner = "tests"\nwhy = "the README"\n'
                    'retire_when = "never"\nproof = "none: a demo patch"\n')
    tool("export", "--series", sdir, "--workdir", demo["work"], check=0)
    assert "+value = 'new'" in (sdir / "megatron-lm" / "0005-new.patch").read_text()
    tool("export", "--series", sdir, "--workdir", demo["work"], "--check", check=0)
    # The workspace and the series agree: apply has nothing to do, and a fresh apply makes the same tree.
    out = demo["tmp"] / "after-new.json"
    apply(demo, "--json", out, check=0)
    assert statuses(out)[0] == dict.fromkeys(["clean", "threeway", "upstreamed", "conflict", "new"], "already-applied")
    fresh = dict(demo, work=demo["tmp"] / "fresh-new")
    apply(fresh, check=0)
    assert git(fresh["work"] / "megatron-lm", "diff", "HEAD", git(ws, "rev-parse", "HEAD")) == ""


def test_into_existing_checkout(demo, tmp_path):
    target = tmp_path / "checkout"
    git(tmp_path, "clone", "-q", str(demo["up"]), str(target))
    git(target, "checkout", "-q", demo["v0"])
    # dirty target: refused, untouched
    (target / "README.md").write_text("dirty\n")
    res = tool("apply", "--series", demo["series"], "--workdir", demo["work"], "--cache", demo["cache"],
               "--into", f"megatron-lm={target}", check=1)
    assert "uncommitted changes" in res.stderr and "README.md" in res.stderr
    assert (target / "README.md").read_text() == "dirty\n"
    git(target, "checkout", "-q", "--", "README.md")

    start = git(target, "rev-parse", "HEAD")
    out = tmp_path / "into.json"
    tool("apply", "--series", demo["series"], "--workdir", demo["work"], "--cache", demo["cache"],
         "--into", f"megatron-lm={target}", "--json", out, check=0)
    st, doc = statuses(out)
    assert set(st.values()) == {"applied"} and doc["upstreams"][0]["workspace"] == str(target)
    assert len(git(target, "log", "--format=%H", f"{start}..HEAD").splitlines()) == 4
    assert not (demo["work"] / "megatron-lm").exists()
    # idempotent
    tool("apply", "--series", demo["series"], "--workdir", demo["work"], "--cache", demo["cache"],
         "--into", f"megatron-lm={target}", "--json", out, check=0)
    assert set(statuses(out)[0].values()) == {"already-applied"}

    # a failing series leaves the checkout where it was
    head = git(target, "rev-parse", "HEAD")
    patch = demo["series"] / "megatron-lm/0001-clean.patch"
    patch.write_text(patch.read_text().replace("-value_5 = 5", "-value_5 = 555"))
    res = tool("apply", "--series", demo["series"], "--workdir", demo["work"], "--cache", demo["cache"],
               "--into", f"megatron-lm={target}", check=1)
    assert "0001-clean" in res.stderr or "clean" in res.stderr
    assert git(target, "rev-parse", "HEAD") == head and git(target, "status", "--porcelain") == ""


def test_a_failed_run_reports_the_workspace_head_not_the_trial(demo, tmp_path):
    """After a conflict the summary names the workspace's own HEAD, which did not move."""
    apply(demo, check=0)
    ws = demo["work"] / "megatron-lm"
    head = git(ws, "rev-parse", "HEAD")
    demo["write_series"](demo["v1"])
    out = tmp_path / "r.json"
    res = apply(demo, "--json", out, check=1)
    (u,) = read_json(out)["upstreams"]
    assert u["head"] == head == git(ws, "rev-parse", "HEAD")
    assert f"megatron-lm: {ws} at {head[:12]} (unchanged)" in res.stdout
    # The trial's HEAD (v1 plus the patches that applied before the conflict) is named nowhere:
    # stop the same run where its trial is built, and read it there.
    kill_at("staged", "--series", demo["series"], "--workdir", demo["work"], "--cache", demo["cache"],
            "--source", f"megatron-lm={demo['up']}")
    (staged,) = (demo["work"] / ".carry").glob("staging-*/megatron-lm")
    trial = Git(staged).head()
    assert trial not in (head, demo["v1"]) and git(staged, "rev-list", "--count", f"{demo['v1']}..HEAD") == "2"
    assert trial[:12] not in res.stdout + res.stderr
    # A first run that fails has no workspace to name.
    res = apply(dict(demo, work=tmp_path / "fresh"), "--json", out, check=1)
    assert read_json(out)["upstreams"][0]["head"] is None
    assert f"megatron-lm: {tmp_path / 'fresh' / 'megatron-lm'} not created" in res.stdout
    # --check reports the HEAD that stays, too.
    demo["write_series"](demo["v0"], ids=("clean",))
    res = apply(demo, "--check", "--json", out, check=0)
    assert read_json(out)["upstreams"][0]["head"] == head and "(unchanged)" in res.stdout


def test_relative_cache_and_workdir_paths(demo):
    """--cache and --workdir relative to the current folder: the cached base is found and used,
    although git runs with -C in a scratch folder."""
    apply(demo, check=0)  # fills the cache
    res = tool("apply", "--series", demo["series"], "--workdir", "fresh", "--cache", demo["cache"].name,
               "--source", f"megatron-lm={demo['up']}", cwd=demo["tmp"], check=0)
    ws = demo["tmp"] / "fresh" / "megatron-lm"
    assert git(ws, "rev-parse", "HEAD~4") == demo["v0"], res.stderr
    assert git(ws, "diff", "HEAD", git(demo["work"] / "megatron-lm", "rev-parse", "HEAD")) == ""
