"""Hostile patch files: every file section git am would apply is seen, and the unsafe ones refused.

Each case hides a section where a reader that stops early, or splits names at spaces, would
not look: after the ``-- `` signature, in a path with a space, with no ``diff --git`` header, in
a second mail. Its sections are made by real git (``git diff --cached``) from a clone of the
demo upstream; lint must report the patch and apply must refuse it before any git am.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from helpers import TOOLS, git, tool

sys.path.insert(0, str(TOOLS))
from carry.series.patchfile import parse, safety_problems  # noqa: E402

SIGNATURE = "-- \n2.39.5\n\n"


def _section(demo, make) -> str:
    """The ``git diff --cached`` text of what ``make(tree)`` does in a clone of the upstream at v0."""
    tree = demo["tmp"] / "hostile-src"
    if tree.exists():
        shutil.rmtree(tree)
    git(demo["tmp"], "clone", "-q", str(demo["up"]), str(tree))
    git(tree, "checkout", "-q", demo["v0"])
    if make(tree) != "staged":
        git(tree, "add", "-A")
    return git(tree, "diff", "--no-ext-diff", "--cached", "--full-index", "--binary", "-M", "-C", "--find-copies-harder") + "\n"


def _symlink(name, target="/etc/passwd"):
    def make(tree):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, tree / name)
    return make


def _gitlink(name):
    def make(tree):
        git(tree, "update-index", "--add", "--cacheinfo", f"160000,{demo_commit(tree)},{name}")
        return "staged"
    return make


def demo_commit(tree):
    return git(tree, "rev-parse", "HEAD")


def _binary(name):
    def make(tree):
        (tree / name).write_bytes(bytes(range(256)) * 4)
    return make


def _moved(new, how="rename"):
    """A rename or copy of gamma.py to ``new``, written as git writes one (git diff cannot leave the tree)."""
    return (f"diff --git a/megatron/core/gamma.py b/{new}\nsimilarity index 100%\n"
            f"{how} from megatron/core/gamma.py\n{how} to {new}\n")


def _clean(demo) -> str:
    return (demo["series"] / "megatron-lm/0001-clean.patch").read_text()


def _traditional(demo) -> str:
    body = _section(demo, lambda t: (t / "megatron/core/delta.py").write_text("owned = True\n"))
    return "\n".join(line for line in body.splitlines() if not line.startswith(("diff --git", "index "))) + "\n"


def _second_mail(demo) -> str:
    return _clean(demo).split("\n\n\n", 1)[0] + "\n\n" + _section(demo, _symlink("docs/read me"))


CASES = {
    # the two ways of issue 32 item 5
    "space-symlink": lambda d: _clean(d) + _section(d, _symlink("docs/my notes")),
    "after-signature-symlink": lambda d: _clean(d) + SIGNATURE + _section(d, _symlink("link")),
    # the same class
    "space-submodule": lambda d: _clean(d) + _section(d, _gitlink("vendor/sub mod")),
    "after-signature-submodule": lambda d: _clean(d) + SIGNATURE + _section(d, _gitlink("sub")),
    "quoted-tab-symlink": lambda d: _clean(d) + _section(d, _symlink("x\ty")),
    "rename-escapes-with-space": lambda d: _clean(d) + _moved("../escape me.py"),
    "rename-into-git-with-space": lambda d: _clean(d) + _moved(".git/hooks/post checkout"),
    "copy-escapes-after-signature": lambda d: _clean(d) + SIGNATURE + _moved("../copied.py", "copy"),
    "binary-with-space": lambda d: _clean(d) + _section(d, _binary("blob file.bin")),
    "mode-to-symlink-after-signature": lambda d: _clean(d) + SIGNATURE + (
        "diff --git a/megatron/core/beta.py b/megatron/core/beta.py\nold mode 100644\nnew mode 120000\n"),
    "traditional-after-signature": lambda d: _clean(d) + SIGNATURE + _traditional(d),
    "second-mail": lambda d: _clean(d) + SIGNATURE + _second_mail(d),
    # files git reads as its own settings (issue 41 item 8): attributes, submodules, ignores
    "adds-gitattributes": lambda d: _clean(d) + _section(d, _text(".gitattributes", "*.py export-ignore\n")),
    "adds-gitattributes-in-a-folder": lambda d: _clean(d) + _section(d, _text("megatron/.gitattributes", "*.py -diff\n")),
    "adds-gitmodules": lambda d: _clean(d) + _section(d, _text(".gitmodules", '[submodule "x"]\n\tpath = x\n')),
    "adds-gitignore-after-signature": lambda d: _clean(d) + SIGNATURE + _section(d, _text("megatron/core/.gitignore",
                                                                                          "*.py\n")),
    "rename-into-gitattributes": lambda d: _clean(d) + _moved("megatron/.GitAttributes"),
}


def _text(name, text):
    def make(tree):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(text)
    return make


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hidden_section_is_seen_and_refused_by_lint_and_apply(demo, case):
    text = CASES[case](demo)
    (demo["series"] / "megatron-lm/0001-clean.patch").write_text(text)
    lint = tool("lint", "--series", demo["series"], check=1)
    assert "patch clean:" in lint.stderr, lint.stderr
    res = tool("apply", "--series", demo["series"], "--workdir", demo["work"], "--cache", demo["cache"],
               "--source", f"megatron-lm={demo['up']}", check=2)
    assert "patch clean (megatron-lm/0001-clean.patch)" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr + lint.stderr
    assert not (demo["work"] / "megatron-lm").exists()


@pytest.mark.parametrize("case", ["space-symlink", "after-signature-symlink"])
def test_the_hidden_section_is_real_git_am_applies_it(demo, case):
    """Not a strawman: raw git am on the pristine upstream makes the symlink the patch hides."""
    patch = demo["tmp"] / "hostile.patch"
    patch.write_text(CASES[case](demo))
    tree = demo["tmp"] / "raw"
    git(demo["tmp"], "clone", "-q", str(demo["up"]), str(tree))
    git(tree, "checkout", "-q", demo["v0"])
    git(tree, "am", "-q", str(patch))
    links = [p for p in tree.rglob("*") if p.is_symlink()]
    assert [os.readlink(p) for p in links] == ["/etc/passwd"], links


def test_a_symlink_the_upstream_has_may_not_be_repointed():
    """The mode on an ``index`` line is an existing file's: a patch that edits a symlink is refused."""
    text = ("From 0 Mon Sep 17 00:00:00 2001\nSubject: [PATCH] x\n\n"
            "diff --git a/link b/link\nindex 3594e94..e5e29bb 120000\n--- a/link\n+++ b/link\n"
            "@@ -1 +1 @@\n-/etc/hosts\n\\ No newline at end of file\n+/etc/passwd\n\\ No newline at end of file\n")
    assert any("symlink" in p for p in safety_problems(parse(text)))


def test_a_hand_broken_hunk_names_the_file_and_line(demo):
    """A hunk shorter than its header says is a malformed file (exit 2), not a conflict to rebase."""
    path = demo["series"] / "megatron-lm/0001-clean.patch"
    lines = path.read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if line.startswith("+value_5"))
    # git reads a "\\" line shorter than "\\ No newline..." as corrupt
    path.write_text("".join(lines[:cut] + ["\\ x\n"] + lines[cut:]))
    res = tool("apply", "--series", demo["series"], "--workdir", demo["work"], "--cache", demo["cache"],
               "--source", f"megatron-lm={demo['up']}", check=2)
    assert f"0001-clean.patch:{cut + 1}: corrupt patch" in res.stderr, res.stderr
    assert "rebase" not in res.stderr and "conflict" not in res.stderr
    lint = tool("lint", "--series", demo["series"], check=1)
    assert f"0001-clean.patch:{cut + 1}: corrupt patch" in lint.stderr


def test_git_and_this_parse_agree_on_the_real_series():
    """Every patch of the gtp series parses, is safe, and git reads the same sections."""
    res = subprocess.run([sys.executable, str(TOOLS / "lint.py"), "--series", "gtp"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert ", 0 problem(s)" in res.stdout


def test_paths_a_reader_must_not_take_at_face_value():
    from carry.series.patchfile import path_problems

    for bad in ("/etc/passwd", "a/../../x", ".git/config", "x/.GIT/hooks", ".git./x", "x\ty", "a\\b",
                ".gitattributes", "a/b/.gitattributes", ".gitmodules", "x/.GITMODULES", "x/.gitignore", ".gitignore "):
        assert path_problems(bad), bad
    for good in ("megatron/core/x.py", "docs/my notes.md", "dir/..x", "é.py", ".github/workflows/ci.yml",
                 "x/.gitkeep", "gitattributes.py", ".mailmap"):
        assert not path_problems(good), good


def test_a_nul_byte_in_a_patch_is_refused_by_lint_and_apply(demo):
    """git takes a file that holds a NUL for binary (format-patch never writes one in a text
    hunk); a hand-made hunk could still put one in the tree."""
    path = demo["series"] / "megatron-lm/0001-clean.patch"
    data = path.read_bytes()
    assert b"+value_5 = 'patched'\n" in data
    path.write_bytes(data.replace(b"+value_5 = 'patched'\n", b"+value_5 = 'pat\0ched'\n"))
    lint = tool("lint", "--series", demo["series"], check=1)
    assert "patch clean:" in lint.stderr and "NUL byte" in lint.stderr, lint.stderr
    res = tool("apply", "--series", demo["series"], "--workdir", demo["work"], "--cache", demo["cache"],
               "--source", f"megatron-lm={demo['up']}", check=2)
    assert "patch clean (megatron-lm/0001-clean.patch)" in res.stderr and "NUL byte" in res.stderr, res.stderr
    assert not (demo["work"] / "megatron-lm").exists()


def test_a_message_line_that_starts_with_from_is_not_a_second_mail(demo):
    """Only what git mailsplit takes for an mbox 'From ' line (a date after it) is refused."""
    text = _clean(demo).replace("Subject: [PATCH] demo: clean change\n",
                                "Subject: [PATCH] demo: clean change\n\nFrom now on: value 5 is patched.\n", 1)
    assert [f.path for f in parse(text).files] == ["megatron/core/alpha.py"]
