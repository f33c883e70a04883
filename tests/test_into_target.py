"""--into NAME=CHECKOUT names the top folder of a git checkout, or it is bad input (exit 2, at once,
nothing changed): a bare repository has no work tree for the patches, and a folder inside a
checkout would have the whole checkout reset to its start by a later run."""

from __future__ import annotations

import pytest

from helpers import git, tool

ML = "megatron-lm"


@pytest.mark.parametrize("kind", ["missing", "file", "bare", "inside"])
def test_into_a_place_that_is_no_checkout_is_refused_and_nothing_changes(demo, tmp_path, kind):
    checkout = tmp_path / "checkout"
    git(tmp_path, "clone", "-q", str(demo["up"]), str(checkout))
    git(checkout, "checkout", "-q", "-B", "main", demo["v0"])
    head = git(checkout, "rev-parse", "HEAD")
    target = {"missing": tmp_path / "nothing", "file": tmp_path / "a-file", "bare": tmp_path / "bare.git",
              "inside": checkout / "megatron"}[kind]
    if kind == "file":
        target.write_text("not a checkout\n")
    if kind == "bare":
        git(tmp_path, "clone", "-q", "--bare", str(demo["up"]), str(target))
    res = tool("apply", "--series", demo["series"], "--workdir", demo["work"], "--cache", demo["cache"],
               "--into", f"{ML}={target}", check=2)
    why = "a folder inside the git checkout" if kind == "inside" else "not a git checkout"
    assert why in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert git(checkout, "rev-parse", "HEAD") == head and git(checkout, "status", "--porcelain") == ""
    if kind == "bare":
        assert git(target, "rev-parse", "HEAD") == git(demo["up"], "rev-parse", "HEAD")
