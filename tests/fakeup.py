"""A small real upstream for end-to-end tests: a git repository with history,
and a series whose patches were exported from it by the tool itself."""

from __future__ import annotations

import shutil
from pathlib import Path

from carry.git import Git
from carry.workspace.export import format_patch

LINES = [f"value_{i} = {i}\n" for i in range(1, 41)]


def write(repo: Path, rel: str, text: str) -> None:
    p = repo / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def make_upstream(root: Path) -> Path:
    repo = root / "upstream"
    g = Git(repo)
    g.init()
    write(repo, "megatron/core/alpha.py", "".join(LINES))
    write(repo, "megatron/core/beta.py", "".join(LINES))
    write(repo, "megatron/core/gamma.py", "".join(LINES))
    write(repo, "megatron/core/delta.py", "".join(LINES))
    write(repo, "README.md", "fake upstream\n")
    g.commit_all("upstream v0")
    return repo


def edit(repo: Path, rel: str, lineno: int, new: str) -> None:
    p = repo / rel
    lines = p.read_text().splitlines(keepends=True)
    lines[lineno - 1] = new
    p.write_text("".join(lines))


def make_patch(repo: Path, base: str, changes: list[tuple[str, int, str]], subject: str, out: Path) -> Path:
    """Commit changes on a throwaway branch from base and export the patch with the tool's normaliser."""
    g = Git(repo)
    head = g("rev-parse", "--abbrev-ref", "HEAD").stdout.strip()
    g("checkout", "-q", "--detach", base)
    for rel, lineno, new in changes:
        edit(repo, rel, lineno, new)
    commit = g.commit_all(subject)
    data = format_patch(repo, commit)
    g("checkout", "-q", head)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    return out


def series_toml(commit: str, url: str, patches: list[dict]) -> str:
    out = ['[series]\nname = "demo"\ndescription = "test series"\n',
           '[upstreams.megatron-lm]\npython_path = "."\nsources = ["git"]\n',
           f'[upstreams.megatron-lm.git]\nurl = "{url}"\ncommit = "{commit}"\n']
    for p in patches:
        out.append("[[patches]]")
        for k, v in p.items():
            out.append(f"{k} = {v!r}" if not isinstance(v, list) else f"{k} = {v!r}".replace("'", '"'))
        out.append("")
    return "\n".join(out).replace("'", '"')


NO_PROOF = "none: a demo patch, proven by the tests of the tool"


def patch_entry(pid: str, file: str, **kw) -> dict:
    d = {"id": pid, "upstream": "megatron-lm", "title": f"test patch {pid}", "file": file,
         "status": "pending", "owner": "tests", "why": "exercise the tool", "retire_when": "never",
         "proof": NO_PROOF}
    d.update(kw)
    return d


def add_proofs(series_dir: Path, bodies: dict[str, str], proof_of: dict[str, str], ini: Path) -> None:
    """Write proofs/megatron_lm/test_<name>.py files and point patches at them (proof_of: id -> name)."""
    proofs = series_dir / "proofs" / "megatron_lm"
    proofs.mkdir(parents=True, exist_ok=True)
    (series_dir / "proofs" / "pytest.ini").write_text(ini.read_text())
    for name, body in bodies.items():
        (proofs / f"test_{name}.py").write_text(body)
    for pid, name in proof_of.items():
        set_proof(series_dir, pid, f"proofs/megatron_lm/test_{name}.py")


def set_proof(series_dir: Path, pid: str, proof: str) -> None:
    """Point patch ``pid`` of a demo series.toml at ``proof`` (in place of its "none: ..." one)."""
    edit_entry(series_dir, pid, f'proof = "{NO_PROOF}"', f'proof = "{proof}"')


def edit_entry(series_dir: Path, pid: str, old: str, new: str) -> None:
    """In patch ``pid``'s entry of series.toml (its block alone), the one ``old`` replaced by ``new``."""
    toml = series_dir / "series.toml"
    blocks = toml.read_text().split("[[patches]]")
    (i,) = [i for i, b in enumerate(blocks) if f'id = "{pid}"\n' in b]
    assert blocks[i].count(old) == 1, (pid, old)
    blocks[i] = blocks[i].replace(old, new)
    toml.write_text("[[patches]]".join(blocks))


# The demo's patches: id -> (file, its changes on v0).
DEMO_FILES = {
    "clean": ("megatron-lm/0001-clean.patch", [("megatron/core/alpha.py", 5, "value_5 = 'patched'\n")]),
    "threeway": ("megatron-lm/0002-threeway.patch", [("megatron/core/beta.py", 10, "value_10 = 'patched'\n")]),
    "upstreamed": ("megatron-lm/0003-upstreamed.patch", [("megatron/core/gamma.py", 20, "value_20 = 'fixed'\n")]),
    "conflict": ("megatron-lm/0004-conflict.patch", [("megatron/core/delta.py", 15, "value_15 = 'ours'\n")]),
}


def make_demo(tmp_path: Path) -> dict:
    """Upstream v0 and v1, four patches written against v0, a series pinned at v0.

    v1 moves the context of 'threeway', has the 'upstreamed' fix and clashes with 'conflict'.
    """
    up = make_upstream(tmp_path)
    v0 = Git(up).head()
    sdir = tmp_path / "patches" / "demo"
    for pid, (rel, changes) in DEMO_FILES.items():
        make_patch(up, v0, changes, f"demo: {pid} change", sdir / rel)
    # v1: upstream moves on: context near 'threeway', the 'upstreamed' fix, a clash with 'conflict'.
    edit(up, "megatron/core/beta.py", 8, "value_8 = 'upstream v1'\n")
    edit(up, "megatron/core/gamma.py", 20, "value_20 = 'fixed'\n")
    edit(up, "megatron/core/delta.py", 15, "value_15 = 'theirs'\n")
    v1 = Git(up).commit_all("upstream v1")
    demo = _demo_at(tmp_path, v0, v1)
    demo["write_series"](v0)
    return demo


def copy_demo(made: dict, tmp_path: Path) -> dict:
    """What ``make_demo(tmp_path)`` makes, copied from the demo ``made`` (that make_demo made
    elsewhere and nothing has changed since) instead of made again: the same files byte for byte,
    so the same commits (the tool commits with a fixed identity and date); git's index (its record
    of the files' inodes and times) is refreshed for the copy's files, as make_demo's commit left
    it for its own. ``made`` itself is not touched."""
    shutil.copytree(made["tmp"], tmp_path, symlinks=True, dirs_exist_ok=True)
    Git(tmp_path / "upstream")("update-index", "-q", "--refresh")
    return _demo_at(tmp_path, made["v0"], made["v1"])


def _demo_at(tmp_path: Path, v0: str, v1: str) -> dict:
    up, sdir = tmp_path / "upstream", tmp_path / "patches" / "demo"

    def write_series(commit: str, ids=("clean", "threeway", "upstreamed", "conflict")):
        entries = [patch_entry(pid, DEMO_FILES[pid][0]) for pid in ids]
        (sdir / "series.toml").write_text(series_toml(commit, "https://example.invalid/upstream.git", entries))
        for pid, (rel, _) in DEMO_FILES.items():  # unlisted files would be orphans for lint
            if pid not in ids and (sdir / rel).exists():
                (sdir / rel).unlink()
        return sdir

    return {"up": up, "v0": v0, "v1": v1, "series": sdir, "write_series": write_series,
            "work": tmp_path / "work", "cache": tmp_path / "cache", "tmp": tmp_path}


# Proof bodies for the demo series (megatron.core.<module> is the demo upstream's).
GOOD = '''
import megatron.core.alpha as alpha

PRISTINE_FAILS = r"^AssertionError: assert .*'patched'"   # what the pristine base fails with

def test_value_5_is_patched():
    assert alpha.value_5 == "patched"
'''
VACUOUS = '''
import megatron.core.beta as beta

def test_always_true():
    assert beta.value_1 == 1
'''
# A proof that the first patch ('clean') breaks: fails on the patched trees, passes pristine.
REGRESS = '''
import megatron.core.alpha as alpha

def test_value_5_is_still_5():
    assert alpha.value_5 == 5, f"value_5 is {alpha.value_5!r}"
'''
CRASH = '''
import os

def test_crash():
    os._exit(7)
'''
GPU = '''
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(True, reason="needs a CUDA GPU")]

def test_on_gpu():
    assert False
'''
# The TransformerEngine site (carry.evidence.tesite) on the path after the tree, and red/green.
SITE_PROOF = '''
import os
import sys

import megatron.core.alpha as alpha

PRISTINE_FAILS = r"^AssertionError: assert .*'patched'"   # what the pristine base fails with


def test_the_site_is_on_the_path_after_the_tree():
    site, tree = {site!r}, os.path.dirname(os.path.dirname(os.path.dirname(alpha.__file__)))
    assert site in sys.path, sys.path
    assert sys.path.index(site) > sys.path.index(tree), sys.path


def test_value_5_is_patched():
    assert alpha.value_5 == "patched"
'''
# A dependency this interpreter lacks and no tree provides: an environment error.
MISSING_DEPENDENCY = '''
import carry_test_no_such_dependency  # noqa: F401
import megatron.core.alpha as alpha

PRISTINE_FAILS = r"^AssertionError: assert .*'patched'"   # what the pristine base fails with


def test_value_5_is_patched():
    assert alpha.value_5 == "patched"
'''
# Red on the pristine base, but not for the reason it declares (a KeyError, not the assertion).
WRONG_REASON = '''
import megatron.core.alpha as alpha

PRISTINE_FAILS = r"^AssertionError: assert .*'patched'"


def test_value_5_is_patched():
    if alpha.value_5 != "patched":
        raise KeyError("something else broke")
'''
# Red on the pristine base without saying what it expects: its red cannot be checked.
UNDECLARED = '''
import megatron.core.alpha as alpha


def test_value_5_is_patched():
    assert alpha.value_5 == "patched"
'''
# Imports at collection what neither tree has (a name only a patch would add): no test body runs.
NEW_NAME = '''
from megatron.core.alpha import value_only_a_patch_adds  # noqa: F401

PRISTINE_FAILS = r"^AssertionError"


def test_uses_it():
    assert value_only_a_patch_adds
'''
# A fixture that fails on the pristine base: its setup error is no red of the body.
FIXTURE_ERROR = '''
import pytest
import megatron.core.alpha as alpha

PRISTINE_FAILS = r"^AssertionError"


@pytest.fixture
def patched_value():
    if alpha.value_5 != "patched":
        raise RuntimeError("the fixture could not set up")
    return alpha.value_5


def test_value_5_is_patched(patched_value):
    assert patched_value == "patched"
'''
