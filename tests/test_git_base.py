"""A git-pinned upstream (NeMo-RL's kind) is applied on the pinned commit itself, with its history.

The upstream here is a real git repository with history before the pin and a submodule
link, like NeMo-RL's 3rdparty/ links. With --source the workspace's base is that commit,
fetched from the checkout with its history: git log, blame and patch-id see upstream, the
submodule link is kept. Apply, export, prove's trees, retire, rebase and bisect's prefixes
all work on it; without --source (the pin's URL) the same commit comes, shallow.
"""

from __future__ import annotations

import pytest

from carry.evidence.bisect import PrefixTrees
from carry.series.manifest import load
from carry.git import Git
from fakeup import LINES, edit, make_patch, patch_entry, series_toml, write
from helpers import git, read_json, tool


@pytest.fixture
def up(tmp_path):
    """history: three commits, then v0 (with a submodule link), the pin; v1 merges 'first'."""
    repo = tmp_path / "upstream"
    g = Git(repo)
    g.init()
    write(repo, "megatron/core/alpha.py", "".join(LINES[:10]))
    first = g.commit_all("upstream: alpha begins")
    write(repo, "megatron/core/alpha.py", "".join(LINES))
    g.commit_all("upstream: alpha grows")
    write(repo, "megatron/core/beta.py", "".join(LINES))
    g.commit_all("upstream: beta")
    write(repo, ".gitmodules", '[submodule "third/sub"]\n\tpath = third/sub\n\turl = https://example.invalid/sub.git\n')
    g("add", ".gitmodules")
    g("update-index", "--add", "--cacheinfo", f"160000,{first},third/sub")  # a link, no checkout
    g("commit", "-q", "-m", "upstream: v0, with a submodule")
    (repo / "third" / "sub").mkdir(parents=True)  # as a checkout without the submodule has it
    v0 = g.head()
    sdir = tmp_path / "patches" / "demo"
    files = {"first": ("megatron-lm/0001-first.patch", "megatron/core/alpha.py", 5),
             "second": ("megatron-lm/0002-second.patch", "megatron/core/beta.py", 7)}
    for pid, (rel, path, line) in files.items():
        make_patch(repo, v0, [(path, line, f"value_{line} = '{pid}'\n")], f"demo: {pid}", sdir / rel)
    g("am", "-q", str(sdir / files["first"][0]))
    v1 = g.head()
    entries = [patch_entry(pid, rel) for pid, (rel, _, _) in files.items()]
    (sdir / "series.toml").write_text(series_toml(v0, f"file://{repo}", entries))
    return {"repo": repo, "v0": v0, "v1": v1, "first": first, "series": sdir, "tmp": tmp_path,
            "cache": tmp_path / "cache", "work": tmp_path / "work"}


def apply(u, *extra, work=None, check=0):
    out = u["tmp"] / "apply.json"
    tool("apply", "--series", u["series"], "--workdir", work or u["work"], "--cache", u["cache"], "--json", out,
         *extra, check=check)
    return read_json(out)


def test_base_is_the_pinned_commit_with_history_and_submodule_link(up):
    doc = apply(up, "--source", f"megatron-lm={up['repo']}")
    (u,) = doc["upstreams"]
    ws = up["work"] / "megatron-lm"
    assert u["base_commit"] == up["v0"] and "the pinned commit" in u["base"] and "shallow" not in u["base"]
    assert git(ws, "rev-parse", "HEAD~2") == up["v0"]
    assert git(ws, "log", "--format=%s", "--reverse").splitlines() == [
        "upstream: alpha begins", "upstream: alpha grows", "upstream: beta", "upstream: v0, with a submodule",
        "demo: first", "demo: second"]
    assert git(ws, "ls-tree", "HEAD", "third/sub").split()[:3] == ["160000", "commit", up["first"]]
    assert git(ws, "status", "--porcelain") == ""
    blame = git(ws, "blame", "-L", "1,1", "--porcelain", "megatron/core/alpha.py").split()[0]
    assert blame == up["first"]  # blame reaches upstream's history
    assert not git(ws, "remote")  # no remote pointing back at the cache
    tool("export", "--series", up["series"], "--workdir", up["work"], "--check", check=0)


def test_without_source_the_pinned_url_gives_the_same_commit_shallow(up):
    (u,) = apply(up)["upstreams"]
    ws = up["work"] / "megatron-lm"
    assert u["base_commit"] == up["v0"] and "shallow: no history" in u["base"]
    assert git(ws, "rev-parse", "HEAD~2") == up["v0"]
    assert git(ws, "rev-parse", "--is-shallow-repository") == "true"
    # The same patches on the same commit: the same heads as with the full history.
    other = apply(up, "--source", f"megatron-lm={up['repo']}", work=up["tmp"] / "full")["upstreams"][0]
    assert other["head"] == u["head"]


def test_a_shallow_checkout_as_source(up, tmp_path):
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth=1", f"file://{up['repo']}", str(shallow))
    git(shallow, "fetch", "-q", "--depth=1", "origin", up["v0"])
    (u,) = apply(up, "--source", f"megatron-lm={shallow}")["upstreams"]
    assert u["base_commit"] == up["v0"] and "shallow: no history" in u["base"]


def test_prefix_trees_retire_and_rebase_on_the_real_commit(up):
    apply(up, "--source", f"megatron-lm={up['repo']}")
    series = load(up["series"])
    prefix = PrefixTrees(series, up["work"], up["tmp"] / "prefix")
    assert [p.id for p in prefix.order] == ["first", "second"]
    pristine = prefix.trees(0)["megatron-lm"]
    assert "value_5 = 5" in (pristine / "megatron/core/alpha.py").read_text()
    one = prefix.trees(1)["megatron-lm"]
    assert "value_5 = 'first'" in (one / "megatron/core/alpha.py").read_text()
    assert "value_7 = 7" in (one / "megatron/core/beta.py").read_text()

    out = up["tmp"] / "retire.json"
    tool("retire", "--series", up["series"], "--against", f"megatron-lm={up['v1']}", "--cache", up["cache"],
         "--source", f"megatron-lm={up['repo']}", "--json", out, check=0)
    v = {p["id"]: p for p in read_json(out)["patches"]}
    assert v["first"]["verdict"] == "landed" and v["second"]["verdict"] == "needed"

    # Upstream changes the context of 'second' and rewrites the line of 'first': patch-id still finds it.
    edit(up["repo"], "megatron/core/alpha.py", 5, "value_5 = 'first, reworked upstream'\n")
    edit(up["repo"], "megatron/core/beta.py", 3, "value_3 = 'moved'\n")
    v2 = Git(up["repo"]).commit_all("upstream: rework")
    tool("retire", "--series", up["series"], "--against", f"megatron-lm={v2}", "--cache", up["cache"],
         "--source", f"megatron-lm={up['repo']}", "--json", out, check=0)
    v = {p["id"]: p for p in read_json(out)["patches"]}
    assert f"upstream commit {up['v1'][:12]} has the same patch-id" in " ".join(v["first"]["evidence"])

    tool("retire", "--series", up["series"], "--against", f"megatron-lm={v2}", "--cache", up["cache"],
         "--source", f"megatron-lm={up['repo']}", "--write", check=0)
    rb = up["tmp"] / "rebase.json"
    tool("rebase", "--series", up["series"], "--onto", f"megatron-lm={v2}", "--cache", up["cache"],
         "--source", f"megatron-lm={up['repo']}", "--workdir", up["tmp"] / "rw", "--json", rb, check=0)
    assert [(e["id"], e["outcome"]) for e in read_json(rb)["patches"]] == [("second", "refreshed")]
    (u,) = apply(up, "--source", f"megatron-lm={up['repo']}", work=up["tmp"] / "after")["upstreams"]
    assert u["base_commit"] == v2
