"""retire --write as one journalled step, and a retirement another patch stands in the way of
(issue 32, items 4 and 11). Real kills at the step's stop points; the next run of another
command finishes or undoes it."""

from __future__ import annotations

import shlex
import subprocess

import pytest
from helpers import TOOLS, kill_at, tool
from test_retire import history, retire  # noqa: F401  (the fixture, and the command as its tests run it)


def _kill_at(h, stop: str) -> None:
    kill_at(stop, "--series", h["series"], "--against", f"megatron-lm={h['v2']}", "--source",
            f"megatron-lm={h['up']}", "--cache", h["cache"], "--write", verb="retire")


def _files(h) -> dict:
    return {p.relative_to(h["series"]).as_posix(): p.read_bytes() for p in h["series"].rglob("*") if p.is_file()}


@pytest.mark.parametrize("stop", ["retire-journalled", "retire-manifest"])
@pytest.mark.parametrize("next_verb", ["lint", "retire"])
def test_a_retirement_killed_after_its_journal_is_finished_by_the_next_run(history, stop, next_verb):  # noqa: F811
    h = history
    _kill_at(h, stop)
    if next_verb == "lint":
        res = tool("lint", "--series", h["series"])
    else:
        res = retire(h, h["v2"], "--write")
    assert res.returncode == 0, res.stdout + res.stderr
    sdir = h["series"]
    text = (sdir / "series.toml").read_text()
    assert 'id = "verbatim"' not in text and 'id = "plain"' in text
    assert (sdir / "retired" / "verbatim" / "record.toml").exists()
    assert not (sdir / "megatron-lm" / "0001-verbatim.patch").exists()
    assert sorted(p.name for p in (sdir / "retired").iterdir() if p.name.startswith(".")) == []
    tool("lint", "--series", sdir, check=0)


def test_a_retirement_killed_before_its_journal_leaves_nothing_behind(history):  # noqa: F811
    h = history
    before = _files(h)
    _kill_at(h, "retire-staged")
    assert list((h["series"] / "retired").glob(".staging-*")), "the stop point is after the staging"
    tool("lint", "--series", h["series"], check=0)
    assert _files(h) == before
    assert not (h["series"] / "retired").exists()


def test_a_manifest_edited_after_the_kill_is_not_overwritten(history):  # noqa: F811
    h = history
    _kill_at(h, "retire-journalled")
    toml = h["series"] / "series.toml"
    toml.write_text(toml.read_text() + "# my edit\n")
    res = tool("lint", "--series", h["series"], check=2)
    assert "edited after a retire --write" in res.stderr and "Traceback" not in res.stderr
    assert toml.read_text().endswith("# my edit\n")
    hint = res.stderr.split("next: ", 1)[1]
    subprocess.run(hint.split("`")[1], shell=True, check=True)
    tool("lint", "--series", h["series"], check=0)
    assert toml.read_text().endswith("# my edit\n")


def test_a_landed_patch_another_requires_names_the_real_manifest_and_the_choice(history):  # noqa: F811
    h = history
    toml = h["series"] / "series.toml"
    text = toml.read_text()
    toml.write_text(text.replace('id = "plain"\n', 'id = "plain"\nrequires = ["verbatim"]\n'))
    tool("lint", "--series", h["series"], check=0)
    res = retire(h, h["v2"], "--write", check=1)
    assert "verbatim" in res.stdout and "landed" in res.stdout, res.stdout  # the verdicts are shown
    err = res.stderr
    assert "plain (megatron-lm) requires verbatim" in err and str(toml) in err, err
    assert "carry-trial-" not in err and "Traceback" not in err
    hint = err.split("next: ", 1)[1]
    assert 'drop "verbatim" from the requires' in hint
    again = hint.split("`")[1]
    assert toml.read_text() != text  # nothing written: still with the requires
    toml.write_text(text)  # the choice made: plain does not need verbatim as a patch
    res = subprocess.run(shlex.split(again), capture_output=True, text=True, cwd=TOOLS.parent, check=False)
    assert res.returncode == 0 and "retired: verbatim" in res.stdout, res.stdout + res.stderr


def test_retire_with_a_workdir_finishes_an_interrupted_swap_there_first(history):  # noqa: F811
    """Its proofs read the other upstreams' trees from --workdir: not while a swap is half done."""
    h = history
    work = h["tmp"] / "w"
    args = ["--series", h["series"], "--workdir", work, "--cache", h["cache"], "--source", f"megatron-lm={h['up']}"]
    tool("apply", *args, check=0)
    (h["series"] / "megatron-lm" / "0004-plain.patch").write_text(
        (h["series"] / "megatron-lm" / "0004-plain.patch").read_text().replace("demo: plain", "demo: plain, again"))
    kill_at("journalled", *args)
    assert (work / ".carry" / "journal.json").exists()
    retire(h, h["v2"], "--workdir", work, check=0)
    assert not (work / ".carry" / "journal.json").exists()
    tool("apply", *args, check=0)


def test_a_retired_patch_file_edited_after_the_kill_is_not_deleted(history):  # noqa: F811
    h = history
    _kill_at(h, "retire-journalled")
    patch = h["series"] / "megatron-lm" / "0001-verbatim.patch"
    patch.write_text(patch.read_text() + "-- \nmy edit\n")
    res = tool("lint", "--series", h["series"], check=2)
    assert "0001-verbatim.patch changed after a retire --write" in res.stderr, res.stderr
    assert patch.read_text().endswith("my edit\n")
    subprocess.run(res.stderr.split("next: ", 1)[1].split("`")[1], shell=True, check=True)
    res = tool("lint", "--series", h["series"])
    assert (patch.parent / "0001-verbatim.patch.mine").read_text().endswith("my edit\n")
    assert not (h["series"] / "retired" / ".journal.json").exists()
