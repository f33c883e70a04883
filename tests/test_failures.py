"""Failure paths: interruption, concurrency, bad manifests and patches, lint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time


from fakeup import NO_PROOF, edit_entry
from helpers import SERIES, TOOLS, git, read_json, tool
from helpers import apply_demo as apply


def _spawn_apply(d):
    env = dict(os.environ)
    return subprocess.Popen([sys.executable, str(TOOLS / "apply.py"), "--series", str(d["series"]), "--workdir",
                             str(d["work"]), "--cache", str(d["cache"]), "--source", f"megatron-lm={d['up']}"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _consistent(d, allowed_heads):
    ws = d["work"] / "megatron-lm"
    state = json.loads((d["work"] / ".carry" / "state.json").read_text())
    head = git(ws, "rev-parse", "HEAD")
    assert head in allowed_heads, "workspace holds a half-applied series"
    assert state["upstreams"]["megatron-lm"]["head"] == head
    assert git(ws, "status", "--porcelain") == ""


def test_killed_mid_apply_leaves_previous_workspace(demo):
    apply(demo, check=0)
    old = git(demo["work"] / "megatron-lm", "rev-parse", "HEAD")
    demo["write_series"](demo["v0"], ids=("clean", "threeway"))
    # Kill the rebuild at increasing delays: each time the workspace is the old or the new one, whole.
    kills = 0
    for delay in (0.05, 0.15, 0.3, 0.45, 0.6, 0.8):
        proc = _spawn_apply(demo)
        time.sleep(delay)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
        if (demo["work"] / ".carry" / "journal.json").exists():
            # Killed during the swap: the next run must finish it.
            break
        ws_head = git(demo["work"] / "megatron-lm", "rev-parse", "HEAD")
        if ws_head != old:
            break
        _consistent(demo, {old})
    assert kills >= 1, "the apply finished before any kill; the machine is too fast for this test"
    res = apply(demo, "--json", demo["tmp"] / "after.json", check=0)
    doc = read_json(demo["tmp"] / "after.json")
    new = doc["upstreams"][0]["head"]
    _consistent(demo, {new})
    assert len(git(demo["work"] / "megatron-lm", "log", "--format=%H").splitlines()) == 3
    assert not list((demo["work"] / ".carry").glob("staging-*")), res.stdout


def test_journal_is_rolled_forward(demo, tmp_path):
    """A run killed between 'all trees built' and 'state written' is completed by the next run."""
    apply(demo, check=0)
    other = dict(demo, work=tmp_path / "other")
    demo["write_series"](demo["v0"], ids=("clean",))
    apply(other, check=0)  # the tree the interrupted run had built
    meta = demo["work"] / ".carry"
    staging = meta / "staging-killed"
    staging.mkdir()
    os.rename(other["work"] / "megatron-lm", staging / "megatron-lm")
    new_state = json.loads((other["work"] / ".carry" / "state.json").read_text())
    (meta / "journal.json").write_text(json.dumps({"staging": str(staging), "names": ["megatron-lm"],
                                                   "state": new_state}))
    out = tmp_path / "r.json"
    apply(demo, "--json", out, check=0)
    assert {p["status"] for p in read_json(out)["upstreams"][0]["patches"] if p["id"] == "clean"} == {"already-applied"}
    assert not (meta / "journal.json").exists() and not staging.exists()
    _consistent(demo, {new_state["upstreams"]["megatron-lm"]["head"]})


def test_concurrent_applies_serialise(demo):
    procs = [_spawn_apply(demo) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    statuses = [o[0] for o in outs]
    assert sum("already-applied" in s for s in statuses) == 2  # one built, the others found it done
    ws = demo["work"] / "megatron-lm"
    assert len(git(ws, "log", "--format=%H").splitlines()) == 5 and git(ws, "status", "--porcelain") == ""


def test_lock_timeout_is_a_clear_failure(demo):
    from carry.lock import DirLock
    with DirLock(demo["work"] / ".carry" / "lock"):
        res = apply(demo, "--lock-timeout", "0.2", check=1)
    assert "locked by another run" in res.stderr and str(os.getpid()) in res.stderr
    assert not (demo["work"] / "megatron-lm").exists()


def test_malformed_and_escaping_patches_are_rejected(demo):
    patch = demo["series"] / "megatron-lm/0002-threeway.patch"
    good = patch.read_text()
    patch.write_text("this is not a patch\n")
    res = apply(demo, check=2)
    assert "0002-threeway.patch" in res.stderr and "format-patch" in res.stderr
    lint = tool("lint", "--series", demo["series"], check=1)
    assert "threeway" in lint.stderr
    patch.write_text(good.replace("a/megatron/core/beta.py", "a/../outside.py").replace(
        "b/megatron/core/beta.py", "b/../outside.py"))
    res = apply(demo, check=2)
    assert "escapes the tree" in res.stderr
    assert not (demo["work"] / "megatron-lm").exists()
    assert not (demo["tmp"] / "outside.py").exists()
    lint = tool("lint", "--series", demo["series"], check=1)
    assert "escapes the tree" in lint.stderr
    # hand-edited hunk counts
    patch.write_text(good.replace("@@ -7,7 +7,7 @@", "@@ -7,9 +7,7 @@"))
    assert "header" in apply(demo, check=2).stderr


def test_symlink_patch_is_rejected(demo):
    patch = demo["series"] / "megatron-lm/0001-clean.patch"
    patch.write_text(patch.read_text().replace("index ", "new mode 120000\nold mode 100644\nindex ", 1))
    res = tool("lint", "--series", demo["series"], check=1)
    assert "symlink" in res.stderr


def test_unknown_manifest_key_suggests(demo):
    toml = demo["series"] / "series.toml"
    toml.write_text(toml.read_text().replace('retire_when = ', 'retire_wen = ', 1))
    res = apply(demo, check=2)
    assert "unknown key 'retire_wen'" in res.stderr and "did you mean 'retire_when'" in res.stderr
    toml.write_text(toml.read_text().replace('retire_wen = ', 'retire_when = ').replace(
        'status = "pending"', 'status = "pendng"', 1))
    res = tool("lint", "--series", demo["series"], check=2)
    assert "pendng" in res.stderr and "did you mean 'pending'" in res.stderr


def test_lint_catches_orphans_duplicates_cycles(demo):
    sdir = demo["series"]
    assert "4 patch(es), 0 problem(s)" in tool("lint", "--series", sdir, check=0).stdout
    (sdir / "megatron-lm/0009-orphan.patch").write_text((sdir / "megatron-lm/0001-clean.patch").read_text())
    toml = sdir / "series.toml"
    text = toml.read_text()
    text = text.replace('id = "clean"', 'id = "clean"\nrequires = ["conflict"]')
    text = text.replace('id = "conflict"', 'id = "conflict"\nrequires = ["clean"]\nlinks = ["not a url"]')
    toml.write_text(text)
    res = tool("lint", "--series", sdir, check=2)
    err = res.stderr
    assert "orphan" in err and "0009-orphan.patch" in err
    assert "cycle" in err
    assert "comes later" in err
    assert "link 'not a url' is not https://github.com/OWNER/REPO/pull/N" in err


def test_lint_names_each_entry_that_is_incomplete_or_inconsistent(demo):
    """Each of lint's own rules on a patch entry, broken once: empty metadata, a status without the link
    it needs, merged without merged_in, a proof not named like one, a proof file that is not there, two
    patches with the same bytes. Each is named, the report is not ok, and lint exits 1."""
    sdir = demo["series"]
    no_proof = f'proof = "{NO_PROOF}"'
    edit_entry(sdir, "clean", 'owner = "tests"', 'owner = "  "')
    edit_entry(sdir, "clean", 'status = "pending"', 'status = "backport"')
    edit_entry(sdir, "threeway", 'status = "pending"',
                'status = "submitted"\nlinks = ["https://github.com/NVIDIA/Megatron-LM/issues/12"]')
    edit_entry(sdir, "threeway", no_proof, 'proof = "proofs/megatron_lm/check_threeway.py"')
    edit_entry(sdir, "upstreamed", 'status = "pending"',
                'status = "merged"\nlinks = ["https://github.com/NVIDIA/Megatron-LM/pull/12"]')
    edit_entry(sdir, "upstreamed", no_proof, 'proof = "proofs/megatron_lm/test_not_there.py"')
    (sdir / "megatron-lm/0004-conflict.patch").write_bytes((sdir / "megatron-lm/0001-clean.patch").read_bytes())
    res = tool("lint", "--series", sdir, "--json", demo["tmp"] / "lint.json", check=1)
    doc = read_json(demo["tmp"] / "lint.json")
    got = sorted(f"{x['where']}: {x['message']}" for x in doc["problems"])
    assert got == sorted([
        "patch clean: owner is empty",
        "patch clean: status backport needs an upstream link",
        "patch threeway: status submitted needs a link to the pull request",
        "patch threeway: proof 'proofs/megatron_lm/check_threeway.py' must look like "
        "proofs/<dir>/test_<name>.py[::test_fn]",
        "patch upstreamed: status merged needs merged_in (the upstream commit that has it)",
        "patch upstreamed: proof file proofs/megatron_lm/test_not_there.py does not exist",
        "patch conflict: same content as clean",
    ]), got
    assert doc["ok"] is False and "7 problem(s)" in res.stdout, (doc, res.stdout)
    assert all(line in res.stderr for line in got), res.stderr


def test_unreachable_source_names_the_override(demo):
    res = tool("apply", "--series", demo["series"], "--workdir", demo["work"], "--cache", demo["cache"], check=1)
    assert "megatron-lm" in res.stderr and "--source megatron-lm=PATH" in res.stderr
    res = apply(demo, "--source", "nemo-rl", check=2)
    assert "NAME=PATH" in res.stderr


def test_bad_usage(demo):
    res = tool("apply", "--series", "no-such-series", "--workdir", demo["work"], check=2)
    assert "no series manifest" in res.stderr
    res = tool("apply", check=2)
    assert "--workdir" in res.stderr
    help_text = tool("apply", "--help", check=0).stdout
    assert "exit codes" in help_text and "default: gtp, the only series" in help_text
    # The repository has one series: --series may be left out.
    assert "series gtp:" in tool("lint", check=0).stdout


def _requires(demo, **deps):
    toml = demo["series"] / "series.toml"
    text = toml.read_text()
    for pid, req in deps.items():
        text = text.replace(f'id = "{pid}"', f'id = "{pid}"\nrequires = {req}'.replace("'", '"'))
    toml.write_text(text)


def test_broken_requires_are_refused_by_every_command(demo, tmp_path):
    """apply, prove, retire, rebase and export load the series through the same check: exit 2, named."""
    apply(demo, check=0)
    commands = {
        "apply": ["--workdir", demo["work"], "--cache", demo["cache"], "--source", f"megatron-lm={demo['up']}"],
        "prove": ["--workdir", demo["work"]],
        "export": ["--workdir", demo["work"], "--check"],
        "retire": ["--against", f"megatron-lm={demo['v1']}", "--source", f"megatron-lm={demo['up']}",
                   "--cache", demo["cache"]],
        "rebase": ["--onto", f"megatron-lm={demo['v1']}", "--source", f"megatron-lm={demo['up']}",
                   "--cache", demo["cache"], "--workdir", tmp_path / "rw"],
    }
    before = (demo["series"] / "series.toml").read_text()
    for broken, named in ((dict(clean=["conflict"], conflict=["clean"]), "cycle: clean -> conflict -> clean"),
                          (dict(threeway=["no-such"]), "patch threeway: requires unknown patch 'no-such'"),
                          (dict(clean=["threeway"]), "requires threeway, which comes later")):
        (demo["series"] / "series.toml").write_text(before)
        _requires(demo, **broken)
        for name, args in commands.items():
            res = tool(name, "--series", demo["series"], *args, check=2)
            assert "the patches' requires are broken" in res.stderr and named in res.stderr, (name, res.stderr)
            assert "tools/lint.py --series" in res.stderr
        lint = tool("lint", "--series", demo["series"], check=2)
        assert named in lint.stderr
    assert not (tmp_path / "rw").exists()


def test_every_patch_has_a_proof_or_says_why(demo):
    toml = demo["series"] / "series.toml"
    text = toml.read_text()
    res = tool("lint", "--series", demo["series"], check=0)
    assert "note: patch clean: no proof: a demo patch" in res.stdout
    assert "0 problem(s), 4 without a proof (see the notes)" in res.stdout
    # No proof key at all: a problem.
    toml.write_text(text.replace('proof = "none: a demo patch, proven by the tests of the tool"\n', "", 1))
    res = tool("lint", "--series", demo["series"], "--json", demo["tmp"] / "lint.json", check=1)
    assert "patch clean: has no proof" in res.stderr and 'proof = "none: <why>"' in res.stderr
    doc = read_json(demo["tmp"] / "lint.json")
    assert len(doc["notes"]) == 3 and doc["problems"][0]["where"] == "patch clean"
    # "none:" needs its why, and stands alone.
    toml.write_text(text.replace("none: a demo patch, proven by the tests of the tool", "none:  ", 1))
    assert "needs the why" in tool("lint", "--series", demo["series"], check=2).stderr
    toml.write_text(text.replace('proof = "none: a demo patch, proven by the tests of the tool"',
                                 'proof = ["proofs/megatron_lm/test_x.py", "none: no"]', 1))
    assert "stands alone" in tool("lint", "--series", demo["series"], check=2).stderr


def test_the_gtp_series_has_a_proof_or_a_why_for_every_patch():
    """Every NeMo-RL patch has a proof but the functional test, which says why it has none."""
    res = tool("lint", "--series", "gtp", check=0)
    count = (SERIES / "series.toml").read_text().count("\n[[patches]]\n")
    assert f"{count} patch(es), 0 problem(s), 1 without a proof" in res.stdout
    assert "note: patch nrl-gtp-functional-test: no proof: the patch is itself a test" in res.stdout
