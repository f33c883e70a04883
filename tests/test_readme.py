"""The README, followed as written, in a fresh clone of this repository.

Every command the README shows (its code blocks and the commands of its table) runs here in
order, from a clone of the working tree, with the real pins. What a person would type for a
placeholder is filled in: NEW_VERSION is the current pin (as the README suggests), COMMIT the
patch commit `git log` shows, $EDITOR an edit of that file. Skipped, with the reason said:
the setup command (CI's .ci/run runs it; here it would reinstall the package under test), the
test command (this is it), the image build (tests/test_images.py builds it on a Docker
engine) and the clone of NeMo-RL (github.com). The NeMo-RL commands run, after the rest, in
their own test, which is skipped (a pytest skip, with its reason) unless GTP_CARRY_TEST_NEMO_RL
names a NeMo-RL checkout.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from helpers import ROOT, git, python_env

pytestmark = [pytest.mark.network, pytest.mark.slow]

NOT_RUN = {
    "python3 -m venv .venv": "the quick start's venv, install and clone; its apply and prove are the guide's, run here",
    "python3 -m pip install -e": "CI's .ci/run runs the setup; here it would reinstall the package under test",
    "python3 -m pytest -q -n auto": "this is that run",
    "python3 tools/upstream_tests.py": "fetches upstream's pinned tests from github.com; tests/test_upstream_tests.py runs it",
    "python3 tools/build_image.py": "needs a Docker engine; tests/test_images.py builds the image",
    "git clone https://github.com/NVIDIA-NeMo/RL": "needs github.com; GTP_CARRY_TEST_NEMO_RL names a checkout",
}
NO_NEMO_RL = "no NeMo-RL checkout: GTP_CARRY_TEST_NEMO_RL is unset (a checkout that has the pinned commit)"


# The README's quick start and commands, then the user guide's pages in reading order: the
# walkthrough a newcomer follows (the README links to each).
WALK = ["README.md", "docs/guide/install.md", "docs/guide/apply.md", "docs/guide/edit.md",
        "docs/guide/prove.md", "docs/guide/retire-rebase.md", "docs/maintainers/tests.md"]


def _walk_text(root) -> str:
    return "".join((root / page).read_text() for page in WALK)


def _is_nemo_rl(block: str) -> bool:
    return "PATH/TO/NeMo-RL" in block or "--only nemo-rl" in block


def _blocks(text: str) -> list[str]:
    # the shell blocks (a fence without a language; the flow picture is ```mermaid)
    return [body for lang, body in re.findall(r"(?ms)^```(\w*)\n(.*?)^```\n", text) if not lang]


def _table_commands(text: str) -> list[str]:
    return re.findall(r"(?m)^\| `(python3 tools/[^`]+)` \|", text)


@pytest.fixture(scope="module")
def clone(tmp_path_factory, pin_cache):
    """The working tree as a fresh clone would have it (tracked and new files, no caches)."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    dest = tmp_path_factory.mktemp("fresh") / "gtp-carry"
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "a fresh clone")
    return dest


def _run(clone, script: str, env: dict) -> subprocess.CompletedProcess:
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=clone, env=env, capture_output=True,
                          text=True, timeout=3000)
    assert proc.returncode == 0, f"README block failed ({proc.returncode}):\n{script}\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def walkthrough(clone, pin_cache, tmp_path_factory):
    """Every README command but the NeMo-RL ones, in order, in the clone: what ran, what was not
    run and why, the NeMo-RL blocks (for their own test) and the environment they ran in."""
    text = _walk_text(clone)
    # `python3` is the Python running the tests, with its bin/ next on PATH: in a venv that is not
    # activated, PATH's python3 is another Python (the README says to type .venv/bin/python).
    env = {**python_env(tmp_path_factory.mktemp("bin")), "GTP_CARRY_CACHE": str(pin_cache),
           # a person's git identity (HOME is isolated here, without one)
           "GIT_AUTHOR_NAME": "A Person", "GIT_AUTHOR_EMAIL": "person@example.invalid",
           "GIT_COMMITTER_NAME": "A Person", "GIT_COMMITTER_EMAIL": "person@example.invalid"}
    blocks = _blocks(text)
    table = _table_commands(text)
    assert len(blocks) >= 6 and len(table) >= 6
    ran, skipped, nemo_rl = [], [], []
    outputs = {}
    for block in blocks:
        reason = next((why for start, why in NOT_RUN.items() if block.startswith(start)), None)
        if reason:
            skipped.append((block.splitlines()[0], reason))
            continue
        if _is_nemo_rl(block):
            nemo_rl.append(block)
            continue
        if "$EDITOR" in block:
            block = _edit_for(block)
        block = block.replace("NEW_VERSION", "0.6.2")
        # a command the table already ran (same line) is not run twice: the proofs are slow
        block = "\n".join(line for line in block.splitlines() if line not in ran)
        outputs[block] = _run(clone, block, env)
        ran.append(block)
        if "--only megatron-lm,megatron-bridge" in block and "cd work" not in block:
            for cmd in table:  # the table's commands, right after the first apply
                if any(cmd.startswith(start) for start in NOT_RUN):
                    skipped.append((cmd, next(w for s, w in NOT_RUN.items() if cmd.startswith(s))))
                    continue
                _run(clone, cmd, env)
                ran.append(cmd)
    return {"ran": ran, "skipped": skipped, "nemo_rl": nemo_rl, "env": env, "outputs": outputs}


def test_the_readme_as_written(clone, walkthrough):
    ran, skipped = walkthrough["ran"], walkthrough["skipped"]
    edits = [out for block, out in walkthrough["outputs"].items() if "git diff patches/" in block]
    assert len(edits) == 1
    assert "+# edited by the README walkthrough" in edits[0].stdout
    assert "megatron-lm/0003-tied-gtp-weight-shape-guard.patch" in edits[0].stdout
    assert {why for _, why in skipped} <= set(NOT_RUN.values()), skipped
    assert any("tools/retire.py" in b and "--write" in b for b in ran)
    assert any("carry-base" in b for b in ran)
    # --write with the pin itself retired nothing and moved nothing
    assert not (clone / "patches/gtp/retired").exists()
    assert "0.6.2" in (clone / "patches/gtp/series.toml").read_text()
    # what the README's commands leave behind (work/, rebase-work/) is ignored by git
    untracked = [line for line in git(clone, "status", "--porcelain", "--untracked-files=all").splitlines()
                 if line.startswith("??")]
    assert untracked == [], untracked


def test_the_readme_nemo_rl_commands(request):
    """The README's NeMo-RL commands (apply with --source nemo-rl=, prove --only nemo-rl), after the rest."""
    nemo_rl = os.environ.get("GTP_CARRY_TEST_NEMO_RL")
    if not nemo_rl:
        pytest.skip(NO_NEMO_RL)
    clone, walkthrough = request.getfixturevalue("clone"), request.getfixturevalue("walkthrough")
    assert len(walkthrough["nemo_rl"]) >= 2, walkthrough["nemo_rl"]
    for block in walkthrough["nemo_rl"]:
        _run(clone, block.replace("PATH/TO/NeMo-RL", nemo_rl), walkthrough["env"])


def _edit_for(block: str) -> str:
    """The editing walkthrough: an edit where $EDITOR is, the commit of the patch of that file for COMMIT."""
    m = re.search(r"(?m)^\$EDITOR (\S+)$", block)
    assert m, block
    path = m.group(1)
    edit = f"printf '# edited by the README walkthrough\\n' >> {path}"
    find = f"COMMIT=$(git log --format=%H -1 carry-base..HEAD -- {path})"
    block = block.replace(m.group(0), f"{edit}\n{find}")
    return block.replace("--fixup=COMMIT", "--fixup=$COMMIT")


def test_the_build_image_row_says_it_needs_a_running_engine_and_how_to_start_one():
    """build-image talks to a Docker engine: the README's row says so, and how to start one (the
    command the tool's own error names)."""
    from carry.images.docker import ENGINE_HINT

    (row,) = [line for line in (ROOT / "README.md").read_text().splitlines()
              if line.startswith("| `python3 tools/build_image.py")]
    assert "running Docker engine" in row and "`bash .ci/docker-engine.sh`" in row, row
    assert "`bash .ci/docker-engine.sh`" in ENGINE_HINT and (ROOT / ".ci" / "docker-engine.sh").is_file()
