"""Export writes the bytes git gives and --check compares bytes (issue 41, item 6).

A file committed with CRLF line ends, a bare CR inside a line, or no final newline is exported
as git writes it: a fresh apply of the exported series makes the very tree the workspace has.
What lint and apply refuse (a symlink, a binary section, a ``-diff`` attribute that makes a diff
binary, an empty commit, bytes that are not UTF-8, git metadata) export refuses too, with exit 2,
before it replaces any file: the old patch files stay as they were, byte for byte.
"""

from __future__ import annotations

import os

import pytest

from helpers import apply_demo as apply, git, tool

LAST = "megatron-lm/0004-conflict.patch"  # the patch of the workspace's last commit


def _series_bytes(demo) -> dict[str, bytes]:
    return {str(p.relative_to(demo["series"])): p.read_bytes() for p in sorted(demo["series"].rglob("*"))
            if p.is_file()}


def _amend(ws, files: dict[str, bytes]) -> None:
    """Write ``files`` into the workspace and fold them into its last commit (the conflict patch)."""
    for rel, data in files.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_bytes(data)
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "--amend", "--no-edit")


def _export(demo, *extra, env=None):
    return tool("export", "--series", demo["series"], "--workdir", demo["work"], *extra, env=env)


ODD_BYTES = {
    "crlf": {"megatron/core/windows.py": b"first = 1\r\nsecond = 2\r\n"},
    "bare-cr": {"megatron/core/mac.py": b"one = 1\rtwo = 2\n"},
    "crlf-in-an-edit": {"megatron/core/alpha.py": b"".join(f"value_{i} = {i}\r\n".encode() for i in range(1, 41))},
    "no-final-newline": {"megatron/core/last.py": b"no_newline = True"},
    "cr-and-no-final-newline": {"megatron/core/last.py": b"ends = 'in a CR'\r"},
}


@pytest.mark.parametrize("case", sorted(ODD_BYTES))
def test_export_then_a_fresh_apply_makes_the_same_tree(demo, case):
    apply(demo, check=0)
    ws = demo["work"] / "megatron-lm"
    _amend(ws, ODD_BYTES[case])
    res = _export(demo)
    assert res.returncode == 0, res.stderr
    written = (demo["series"] / LAST).read_bytes()
    for data in ODD_BYTES[case].values():
        for line in data.split(b"\n"):
            if b"\r" in line:
                assert b"+" + line + b"\n" in written, (line, written)
    res = _export(demo, "--check")
    assert res.returncode == 0, res.stdout + res.stderr
    fresh = dict(demo, work=demo["tmp"] / "fresh")
    apply(fresh, check=0)
    assert git(fresh["work"] / "megatron-lm", "rev-parse", "HEAD^{tree}") == git(ws, "rev-parse", "HEAD^{tree}")


def test_check_compares_bytes(demo):
    """A patch file that lost its CRs (as the text-mode export wrote it) is drift for --check."""
    apply(demo, check=0)
    ws = demo["work"] / "megatron-lm"
    _amend(ws, ODD_BYTES["crlf"])
    _export(demo).check_returncode()
    path = demo["series"] / LAST
    path.write_bytes(path.read_bytes().replace(b"\r\n", b"\n"))
    res = _export(demo, "--check")
    assert res.returncode == 1, res.stdout + res.stderr
    assert LAST in res.stderr, res.stderr


def _symlink(ws):
    os.symlink("/etc/passwd", ws / "megatron/core/link.py")


def _binary(ws):
    (ws / "megatron/core/blob.bin").write_bytes(bytes(range(256)) * 4)


def _nul(ws):
    (ws / "megatron/core/alpha.py").write_bytes((ws / "megatron/core/alpha.py").read_bytes() + b"x = '\0'\n")


def _diff_attribute(ws):
    """``-diff`` for every .py file, where git status does not see it (the repository's own attributes)."""
    (ws / ".git/info").mkdir(exist_ok=True)
    (ws / ".git/info/attributes").write_text("*.py -diff\n")
    (ws / "megatron/core/delta.py").write_text((ws / "megatron/core/delta.py").read_text() + "extra = 1\n")


def _not_utf8(ws):
    (ws / "megatron/core/latin.py").write_bytes(b"name = 'Andr\xe9'\n")


def _gitattributes(ws):
    (ws / ".gitattributes").write_text("*.py export-ignore\n")


def _empty(ws):
    """The last commit made empty (the user reverted its change): format-patch writes nothing for it."""
    git(ws, "reset", "-q", "--soft", "HEAD~1")
    git(ws, "reset", "-q")
    git(ws, "checkout", "-q", "--", ".")
    git(ws, "commit", "-q", "--allow-empty", "-m", "demo: conflict change")
    return "made"


REFUSED = {
    "symlink": (_symlink, "symlink"),
    "binary": (_binary, "binary diff"),
    "nul-byte": (_nul, "binary diff"),
    "diff-attribute": (_diff_attribute, "binary diff"),
    "not-utf8": (_not_utf8, "not UTF-8"),
    "gitattributes": (_gitattributes, "git metadata"),
    "empty-commit": (_empty, "makes no change"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
@pytest.mark.parametrize("check", [False, True], ids=["write", "check"])
def test_export_refuses_what_lint_refuses_and_writes_nothing(demo, case, check):
    apply(demo, check=0)
    ws = demo["work"] / "megatron-lm"
    make, named = REFUSED[case]
    if make(ws) != "made":
        git(ws, "add", "-A")
        git(ws, "commit", "-q", "--amend", "--no-edit")
    before = _series_bytes(demo)
    state = (demo["work"] / ".carry" / "state.json").read_bytes()
    res = _export(demo, *(["--check"] if check else []))
    out = res.stdout + res.stderr
    assert res.returncode == 2, out
    assert "Traceback" not in out, out
    assert "error: " in res.stderr and LAST in res.stderr and named in res.stderr, out
    assert _series_bytes(demo) == before, "a refused export changed the series"
    assert (demo["work"] / ".carry" / "state.json").read_bytes() == state
    assert not [p for p in demo["series"].rglob(".*") if p.is_file()], "a temporary file was left"


def test_a_users_own_attributes_do_not_change_the_export(demo, tmp_path):
    """~/.config/git/attributes (git reads it whatever the config says) makes no diff binary."""
    apply(demo, check=0)
    ws = demo["work"] / "megatron-lm"
    _amend(ws, {"megatron/core/delta.py": (ws / "megatron/core/delta.py").read_bytes() + b"extra = 1\n"})
    xdg = tmp_path / "xdg"
    (xdg / "git").mkdir(parents=True)
    (xdg / "git" / "attributes").write_text("*.py -diff\n")
    res = _export(demo, env={"XDG_CONFIG_HOME": str(xdg)})
    assert res.returncode == 0, res.stderr
    assert b"+extra = 1\n" in (demo["series"] / LAST).read_bytes()


def test_git_text_output_keeps_its_line_ends_and_survives_other_bytes(tmp_path):
    """The runner's text mode: a CR git prints is kept (no universal newlines), a byte that is not
    UTF-8 is replaced, not a crash."""
    from carry.git import Git

    g = Git(tmp_path / "r")
    g.init()
    (tmp_path / "r" / "crlf.txt").write_bytes(b"one\r\ntwo\rthree\n")
    (tmp_path / "r" / "latin.txt").write_bytes(b"Andr\xe9\n")
    g.commit_all("odd bytes")
    assert g("show", "HEAD:crlf.txt").stdout == "one\r\ntwo\rthree\n"
    assert g("show", "HEAD:latin.txt").stdout == "Andr\ufffd\n"
    assert g("cat-file", "--batch-check", input="HEAD:crlf.txt\n").stdout.endswith(" blob 15\n")
