"""Export writes the bytes git gives and --check compares bytes (issue 41, item 6).

A file committed with CRLF line ends, a bare CR inside a line, or no final newline is exported
as git writes it: a fresh apply of the exported series makes the very tree the workspace has.
What lint and apply refuse (a symlink, a binary section, a ``-diff`` attribute that makes a diff
binary, an empty commit, bytes that are not UTF-8, git metadata) export refuses too, with exit 2,
before it replaces any file: the old patch files stay as they were, byte for byte.
"""

from __future__ import annotations

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
    from carry.runner import Git

    g = Git(tmp_path / "r")
    g.init()
    (tmp_path / "r" / "crlf.txt").write_bytes(b"one\r\ntwo\rthree\n")
    (tmp_path / "r" / "latin.txt").write_bytes(b"Andr\xe9\n")
    g.commit_all("odd bytes")
    assert g("show", "HEAD:crlf.txt").stdout == "one\r\ntwo\rthree\n"
    assert g("show", "HEAD:latin.txt").stdout == "Andr\ufffd\n"
    assert g("cat-file", "--batch-check", input="HEAD:crlf.txt\n").stdout.endswith(" blob 15\n")
