"""The workspace record (DIR/.carry/state.json), owned by carry.workspace.workdir, read from a real apply."""

from __future__ import annotations

import json

import pytest

from carry.errors import DirtyTreeError
from carry.series.manifest import load
from carry.workspace.workdir import STATE_VERSION, State, UpstreamRecord, WorkDir
from helpers import apply_demo, git


@pytest.fixture
def applied(demo):
    text = (demo["series"] / "series.toml").read_text()
    (demo["series"] / "series.toml").write_text(text.replace('id = "threeway"', 'id = "threeway"\nrequires = ["clean"]'))
    apply_demo(demo, "--only", "threeway,conflict", check=0)
    return demo


def test_the_record_of_a_real_apply(applied):
    wd = WorkDir(applied["work"])
    state = wd.load_state()
    series = load(applied["series"])
    ws = applied["work"] / "megatron-lm"
    (name, rec), = state.records()
    assert name == "megatron-lm" and isinstance(rec, UpstreamRecord)
    assert rec.base_commit == applied["v0"] and rec.head == git(ws, "rev-parse", "HEAD")
    assert rec.selected == ["clean", "threeway", "conflict"]  # --only, plus what threeway requires
    assert state.order == ["clean", "threeway", "conflict"]
    subjects = dict(line.split(" ", 1) for line in git(ws, "log", "--format=%H %s").splitlines())
    assert subjects[state.commit_of(series.patch("threeway"))] == "demo: threeway change"
    assert state.commit_of(series.patch("upstreamed")) is None  # not selected
    assert state.prefix_commit("megatron-lm", 0) == applied["v0"]
    assert state.prefix_commit("megatron-lm", 2) == state.commit_of(series.patch("threeway"))
    assert state.prefix_commit("megatron-lm", 9) == rec.head
    state.mark_exported("megatron-lm", "d" * 64, rec.head, [p.commit for p in rec.patches], {})
    wd.save_state(state)
    again = wd.load_state()
    assert again.record("megatron-lm").digest == "d" * 64
    assert json.loads(wd.state_file.read_text())["version"] == STATE_VERSION
    assert State.from_dict(again.to_dict()) == again


def test_a_record_written_by_the_first_format_still_reads(applied):
    wd = WorkDir(applied["work"])
    doc = wd.load_state().to_dict()
    doc["version"] = 1
    del doc["order"]
    wd.state_file.write_text(json.dumps(doc))
    state = wd.load_state()
    assert state.order == ["clean", "threeway", "conflict"]
    apply_demo(applied, "--only", "threeway,conflict", check=0)  # and apply still finds it up to date
    assert wd.load_state().order == ["clean", "threeway", "conflict"]


@pytest.mark.parametrize("text", ["{", '{"upstreams": {"megatron-lm": {"base": "x"}}}', "[]"])
def test_an_unreadable_record_is_a_named_failure(applied, text):
    wd = WorkDir(applied["work"])
    wd.state_file.write_text(text)
    with pytest.raises(DirtyTreeError) as info:
        wd.load_state()
    assert "not a workspace record this tool can read" in info.value.message
    assert f"tools/kept.py --workdir {wd.root} --set-aside" in info.value.hint and "rm " not in info.value.hint
