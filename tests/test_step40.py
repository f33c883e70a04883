"""Image step 40 (the series' NeMo-RL patches onto a NeMo-RL checkout), run for real on a git checkout.

The step runs again on a host whose setup failed after it (run-on-gpu-host's setup is meant to be run
again): a checkout that already holds the whole series must be left as it is, even where a later patch
changes a hunk an earlier one made (so the earlier patch alone no longer reverses: the 2026-12-04 H200
setup died there). A checkout in any other state is refused with nothing changed, and a series that
does not apply changes nothing.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from helpers import ROOT, git

STEP = ROOT / "images" / "gtp-te219" / "steps" / "40-nemo-rl.sh"
LINES = [f"line {i}\n" for i in range(1, 11)]


def _checkout(tmp: Path) -> tuple[Path, str]:
    repo = tmp / "nemo-rl"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "conf.yaml").write_text("".join(LINES))
    (repo / "other.py").write_text("x = 1\n")
    return repo, _commit(repo, "pin")


def _commit(repo: Path, msg: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", msg)
    return git(repo, "rev-parse", "HEAD")


def _series(tmp: Path, repo: Path, new: str = "new_test.py") -> Path:
    """Two patches on one hunk: the second rewrites the line the first changed, and adds a file (NEW)."""
    pin = git(repo, "rev-parse", "HEAD")
    (repo / "conf.yaml").write_text("".join(LINES).replace("line 5", "line five"))
    one = _commit(repo, "first")
    (repo / "conf.yaml").write_text("".join(LINES).replace("line 5", "line FIVE"))
    (repo / new).parent.mkdir(parents=True, exist_ok=True)
    (repo / new).write_text("def test_x():\n    pass\n")
    two = _commit(repo, "second")
    house = tmp / "wheelhouse"
    (house / "nemo-rl").mkdir(parents=True)
    for name, a, b in (("0001-first.patch", pin, one), ("0002-second.patch", one, two)):   # git() strips the end
        (house / "nemo-rl" / name).write_text(git(repo, "diff", "--no-ext-diff", "--binary", a, b) + "\n")
    git(repo, "reset", "-q", "--hard", pin)
    return house


def _step(house: Path, repo: Path, pin: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "GTP_FLAVOR": "cuda", "GTP_WHEELHOUSE": str(house), "GTP_NEMO_RL_DIR": str(repo),
           "GTP_NEMO_RL_COMMIT": pin, "GTP_STEP": "40-nemo-rl"}
    return subprocess.run(["bash", str(STEP)], env=env, capture_output=True, text=True, timeout=60)


def _state(repo: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(repo.iterdir()) if p.is_file()}


def test_applies_the_series_then_leaves_a_checkout_that_holds_it(tmp_path):
    repo, pin = _checkout(tmp_path)
    house = _series(tmp_path, repo)
    (repo / "scratch.txt").write_text("not the series' business\n")   # untracked, outside the series

    first = _step(house, repo, pin)
    assert first.returncode == 0, first.stderr
    assert "applied 0001-first.patch" in first.stdout and "applied 0002-second.patch" in first.stdout
    patched = _state(repo)
    assert "line FIVE" in patched["conf.yaml"] and patched["new_test.py"].startswith("def test_x")

    again = _step(house, repo, pin)   # the setup run once more
    assert again.returncode == 0, again.stderr
    assert "already applied: the whole series (2 patch(es), 2 file(s))" in again.stdout
    assert _state(repo) == patched
    assert git(repo, "diff", "--cached", "--name-only") == ""   # the checkout's own index untouched


def test_a_checkout_changed_otherwise_is_refused_and_left_as_it_is(tmp_path):
    repo, pin = _checkout(tmp_path)
    house = _series(tmp_path, repo)
    (repo / "conf.yaml").write_text("".join(LINES).replace("line 5", "my own edit"))
    before = _state(repo)

    res = _step(house, repo, pin)
    assert res.returncode == 1
    assert "neither as at the pin nor as the series leaves them" in res.stderr and "conf.yaml" in res.stderr
    assert "nothing was applied" in res.stderr and "stash push --include-untracked" in res.stderr
    assert _state(repo) == before


def test_half_a_series_is_refused(tmp_path):
    repo, pin = _checkout(tmp_path)
    house = _series(tmp_path, repo)
    git(repo, "apply", str(house / "nemo-rl" / "0001-first.patch"))   # a run stopped between the two
    before = _state(repo)

    res = _step(house, repo, pin)
    assert res.returncode == 1 and "neither as at the pin" in res.stderr
    assert _state(repo) == before


def test_a_series_that_does_not_apply_changes_nothing(tmp_path):
    repo, pin = _checkout(tmp_path)
    house = _series(tmp_path, repo)
    second = house / "nemo-rl" / "0002-second.patch"
    second.write_text(second.read_text().replace("-line five", "-line 5 was never this"))
    before = _state(repo)

    res = _step(house, repo, pin)
    assert res.returncode == 1
    assert "0002-second.patch does not apply" in res.stderr and "nothing was changed" in res.stderr
    assert _state(repo) == before


def test_a_folder_where_the_series_makes_a_file_is_refused_before_anything_is_applied(tmp_path):
    repo, pin = _checkout(tmp_path)
    house = _series(tmp_path, repo)
    (repo / "new_test.py").mkdir()   # not the pin's (no such path) nor the series' (a file)
    before = _state(repo)

    res = _step(house, repo, pin)
    assert res.returncode == 1 and "neither as at the pin" in res.stderr and "new_test.py" in res.stderr
    assert _state(repo) == before and (repo / "new_test.py").is_dir()


def test_a_patch_the_working_tree_refuses_undoes_the_ones_applied_before_it(tmp_path):
    """Every path the series touches is as at the pin, but an untracked file stands where the second patch
    needs a folder: the first patch applied, the second failed after writing part of itself (git apply is
    not atomic then), and every file is back as at the pin."""
    repo, pin = _checkout(tmp_path)
    house = _series(tmp_path, repo, new="tests/new_test.py")
    (repo / "tests").write_text("an untracked file, not a folder\n")
    before = _state(repo)

    res = _step(house, repo, pin)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "0002-second.patch did not apply to the working tree" in res.stderr and "back as at the pin" in res.stderr
    assert "applied 0001-first.patch" in res.stdout
    assert _state(repo) == before
