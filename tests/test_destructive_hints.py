"""No hint deletes what the tool cannot restore (issue 41, item 9).

Every command a hint prints is found in the source (the calls that spell them: carry.shell's
code() and line(), carry.series.repo's command()) and each one that deletes or discards
(rm, git clean, git reset --hard, git am --abort, a delete...) must be in ALLOWED with the
reason it only removes what the tool itself rebuilds. The rest go aside whole into
DIR/.carry/kept instead (tools/kept.py --set-aside).

The cases the issue names are reproduced and their hints run as pasted: a damaged record or
swap journal (it said `rm -rf WORKDIR`, deleting workspaces that held the user's commits),
and a HEAD moved back (`git checkout HEAD~1`, called "commits the series does not know",
with a hint that exited 2).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess

import pytest
from helpers import TOOLS, apply_demo, git, kill_at, read_json, tool

ML = "megatron-lm"

# (file, function, the command with "…" for each computed word): why it destroys nothing of the user's.
ALLOWED = {
    ("carry/workspace/artifacts.py", "fetch_artifact", "rm -rf …"):
        "a cached download whose sha256 is not the pin's: the next run downloads the pinned file again",
    ("carry/workspace/apply.py", "_read_record", "rm …"):
        "apply's own unreadable record in an --into checkout's .git; the checkout and its commits stay "
        "(the hint names git log to see where the series started)",
    ("carry/workspace/workdir.py", "_read_journal", "rm …"):
        "a swap journal that names no staging folder of this work directory: nothing of ours to finish; "
        "every tree stays where it is and the next run keeps the replaced ones in .carry/kept",
    ("carry/series/retirement.py", "_read", "rm …"):
        "an unreadable series journal, which nothing can finish; the series files are in git (the hint "
        "says to check git status first) and the retire or rebase can be run again",
    ("carry/series/retirement.py", "_check_untouched", "rm -rf … …"):
        "a retirement's staging (copies of patch files and the records retire writes) and its journal; "
        "the originals are untouched (they are removed last) and retire --write makes them again",
    ("carry/report.py", "kept_back", "git -C … reset -q --hard …"):
        "printed, for a kept branch's history only, by the rebuild that just made the workspace or the run "
        "that just finished or undid a swap: it drops only the commits apply made there (apply makes them "
        "again); the old tree is kept whole in .carry/kept",
    ("carry/workspace/kept.py", "set_aside", "python3 tools/kept.py --workdir … --delete …"):
        "deletes one kept copy the user names, offered beside --restore on the line that says what it "
        "holds: the one way to free that space, by choice",
    ("carry/workspace/kept.py", "delete", "git -C … worktree remove …"):
        "offered only by a --delete the user asked for, after --restore (which keeps everything): git's own "
        "removal of a linked worktree of the kept copy, which git refuses while the worktree has uncommitted changes",
    ("carry/workspace/kept.py", "delete", "python3 tools/kept.py --workdir … --delete …"):
        "the --delete the user asked for, again, once the worktree that stopped it is gone",
    ("carry/series/retirement.py", "_check_untouched", "mv … …"):
        "moves a file the user edited (series.toml, a patch file) beside itself: a file, never a repository",
    ("carry/errors.py", "from_os_error", "mv … …"):
        "a directory in the place of a file the command writes (a record, a cache or series file), moved "
        "beside itself so the command can write there",
    ("carry/evidence/rebase.py", "_resume", "git -C … am --abort"):
        "the git am a person left in rebase's own workspace, offered beside am --continue: it goes back "
        "to the patches rebase applied, which a new rebase applies again",
    ("carry/workspace/apply.py", "_recover_into", "git -C … am --abort"):
        "git's own way out of a git am the user started in their checkout, offered beside am "
        "--continue; the commits before it stay",
}

_SPELLERS = {"code", "line", "command"}


def _words(call: ast.Call) -> list[str]:
    """The words of the command a code()/line()/command() call spells; "…" for a computed one."""
    name = getattr(call.func, "id", None) or getattr(call.func, "attr", None)
    args, out = list(call.args), []
    if name == "command":
        verb = args[0].value if args and isinstance(args[0], ast.Constant) else "…"
        out, args = ["python3", f"tools/{verb}.py"], args[2:]
    for a in args:
        if isinstance(a, ast.Constant) and isinstance(a.value, str):
            out.append(a.value)
        elif isinstance(a, ast.Starred) and isinstance(a.value, ast.Call) and getattr(a.value.func, "id", "") == "tool":
            verb = a.value.args[0]
            out += ["python3", f"tools/{verb.value if isinstance(verb, ast.Constant) else '…'}.py"]
        elif isinstance(a, ast.Call) and getattr(a.func, "id", "") == "Raw" and isinstance(a.args[0], ast.Constant):
            out.append(a.args[0].value)
        else:
            out.append("…")
    return out


def destroys(words: list[str]) -> bool:
    """Whether a command (``&&`` chains split) deletes or discards something."""
    cmds, cmd = [], []
    for w in words:
        if w in ("&&", ";", "||"):
            cmds.append(cmd)
            cmd = []
        else:
            cmd.append(w)
    cmds.append(cmd)
    for c in cmds:
        if not c:
            continue
        if c[0] in ("rm", "rmdir", "shred", "unlink", "truncate"):
            return True
        if c[0] == "mv":  # a repository moved by a bare mv orphans its linked worktrees (tools/kept.py --set-aside)
            return True
        if "--delete" in c or "--prune" in c:
            return True
        if c[0] == "git":
            sub = [w for w in c[1:] if not w.startswith("-") and w != "…"][:1]
            flags = set(c)
            if sub in (["clean"], ["restore"], ["prune"], ["gc"]):
                return True
            if sub == ["reset"] and "--hard" in flags:
                return True
            if sub == ["checkout"] and flags & {"-f", "--force", "--"}:
                return True
            if sub == ["branch"] and flags & {"-D", "-d", "--delete"}:
                return True
            if sub == ["stash"] and flags & {"drop", "clear"}:
                return True
            if sub == ["update-ref"] and "-d" in flags:
                return True
            if sub == ["worktree"] and flags & {"remove", "prune"}:
                return True
            if sub in (["am"], ["rebase"], ["merge"], ["cherry-pick"]) and "--abort" in flags:
                return True
            if sub == ["reflog"] and "expire" in flags:
                return True
    return False


def _walk(node: ast.AST, fn: str = "<module>"):
    """Each node under ``node`` with the name of the function it is in; docstrings left out."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Expr) and isinstance(child.value, ast.Constant):
            continue  # a docstring (or a bare string): no hint prints it
        name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else fn
        yield child, name
        yield from _walk(child, name)


def _hints_in(source: str, where: str) -> list[tuple[str, str, str]]:
    """(file, function, command) for every command spelled in ``source``, and every command
    written out between backticks in a string."""
    found = []
    for node, fn in _walk(ast.parse(source)):
        if isinstance(node, ast.Call) and (getattr(node.func, "id", None) or getattr(node.func, "attr", None)) \
                in _SPELLERS:
            found.append((where, fn, " ".join(_words(node))))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [(where, fn, span) for span in re.findall(r"(?<!`)`([^`{}]+)`(?!`)", node.value)]
    return sorted(set(found))


def _destructive(source: str, where: str) -> set[tuple[str, str, str]]:
    return {h for h in _hints_in(source, where) if destroys(h[2].split())}


@pytest.mark.parametrize("snippet", [
    'def f(ws):\n    return code("git", "-C", ws, "reset", "-q", "--hard", "HEAD")',
    'def f(ws):\n    return code("git", "-C", ws, "reset", Raw("&&"), "git", "-C", ws, "clean", "-ffdq")',
    'def f(root):\n    return shell.code("rm", "-rf", root)',
    'def f(ws):\n    return line("git", "-C", ws, "stash", "drop")',
    'def f(root):\n    return code(*tool("kept"), "--workdir", root, "--delete", "x")',
    'def f(s):\n    return command("kept", s, "--prune", "--older-than", "1d")',
    'def f():\n    return "run `rm -rf work` first"',
    'def f(ws):\n    return code("git", "-C", ws, "checkout", "-f", "main")',
    'def f(ws):\n    return code("mv", ws, "ws.old")',  # a repository's linked worktrees orphaned
])
def test_the_scan_sees_each_kind_of_destructive_command(snippet):
    assert _destructive(snippet, "x.py"), snippet


@pytest.mark.parametrize("snippet", [
    'def f(ws):\n    return code("git", "-C", ws, "merge", "-q", "--ff-only", "abc")',
    'def f(ws):\n    return code("git", "-C", ws, "stash", "push", "-u")',
    'def f(root):\n    return code(*tool("kept"), "--workdir", root, "--set-aside", "x")',
])
def test_the_scan_lets_a_command_that_keeps_everything_pass(snippet):
    assert _hints_in(snippet, "x.py") and not _destructive(snippet, "x.py"), snippet


def test_no_hint_deletes_what_the_tool_cannot_restore():
    found: set[tuple[str, str, str]] = set()
    for path in sorted((TOOLS / "carry").rglob("*.py")):
        found |= _destructive(path.read_text(), path.relative_to(TOOLS).as_posix())
    unexplained = sorted(found - ALLOWED.keys())
    assert not unexplained, ("hints that delete or discard, with no reason in ALLOWED (set the tree aside "
                             "into .carry/kept instead):\n" + "\n".join(map(str, unexplained)))
    stale = sorted(ALLOWED.keys() - found)
    assert not stale, "ALLOWED names hints the code no longer prints:\n" + "\n".join(map(str, stale))
    assert all(len(why) > 40 for why in ALLOWED.values())


# -- the cases, reproduced, their hints run as pasted ------------------------------------------------
def _next(stderr: str) -> list[str]:
    lines = [line for line in stderr.splitlines() if line.strip().startswith("next:")]
    assert lines, stderr
    return re.findall(r"`([^`]+)`", lines[-1])


def _paste(cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=900, cwd=TOOLS.parent)


def _mine(ws) -> str:
    (ws / "mine.txt").write_text("the user's work\n")
    git(ws, "add", "mine.txt")
    git(ws, "commit", "-q", "-m", "the user's commit")
    return git(ws, "rev-parse", "HEAD")


def _kept_with(demo, commit: str) -> list:
    kept = demo["work"] / ".carry" / "kept"
    return [k for k in (sorted(kept.iterdir()) if kept.is_dir() else [])
            if git(k, "cat-file", "-t", commit, check=False) == "commit"]


def test_a_damaged_record_sets_the_workspaces_aside_and_rebuilds(demo):
    apply_demo(demo, check=0)
    ws = demo["work"] / ML
    commit = _mine(ws)
    (demo["work"] / ".carry" / "state.json").write_text("{")
    res = apply_demo(demo, check=1)
    assert "not a workspace record this tool can read" in res.stderr
    aside, again = _next(res.stderr)
    for cmd in (aside, again):
        done = _paste(cmd)
        assert done.returncode == 0, (cmd, done.stderr)
    (kept,) = _kept_with(demo, commit)  # the user's commit, and their file, whole in .carry/kept
    assert (kept / "mine.txt").read_text() == "the user's work\n"
    assert "--set-aside" in aside
    assert git(ws, "rev-parse", "HEAD") != commit and (ws / "megatron/core/alpha.py").exists()
    apply_demo(demo, check=0)


def test_a_damaged_journal_keeps_the_old_trees_and_rebuilds(demo):
    """Killed after its journal, before any rename: the old tree is intact (with a commit the user
    made since); the journal is then damaged. The hint keeps that tree and rebuilds."""
    apply_demo(demo, check=0)
    ws = demo["work"] / ML
    demo["write_series"](demo["v0"], ids=("clean", "threeway"))
    kill_at("journalled", "--series", demo["series"], "--workdir", demo["work"], "--cache", demo["cache"],
            "--source", f"{ML}={demo['up']}")
    commit = _mine(ws)
    journal = demo["work"] / ".carry" / "journal.json"
    journal.write_text(journal.read_text()[:20])
    res = apply_demo(demo, check=1)
    assert f"{journal} is unreadable" in res.stderr
    aside, again = _next(res.stderr)
    for cmd in (aside, again):
        done = _paste(cmd)
        assert done.returncode == 0, (cmd, done.stderr)
    assert _kept_with(demo, commit)
    assert not journal.exists() and not list((demo["work"] / ".carry").glob("staging-*"))
    out = demo["tmp"] / "r.json"
    apply_demo(demo, "--json", out, check=0)
    assert {p["status"] for u in read_json(out)["upstreams"] for p in u["patches"]} == {"already-applied"}


def _moved_back(demo, how: list[str]) -> tuple[str, str]:
    apply_demo(demo, check=0)
    ws = demo["work"] / ML
    tip = git(ws, "rev-parse", "HEAD")
    git(ws, *how)
    return tip, git(ws, "rev-parse", "HEAD")


@pytest.mark.parametrize("how", [["checkout", "-q", "HEAD~1"], ["reset", "-q", "--hard", "HEAD~2"]],
                         ids=["checkout", "branch-moved-back"])
def test_a_head_moved_back_is_named_and_its_hint_works(demo, how):
    tip, head = _moved_back(demo, how)
    ws = demo["work"] / ML
    res = apply_demo(demo, check=1)
    assert "does not know" not in res.stderr, res.stderr
    assert f"HEAD {head[:12]}" in res.stderr and "older commit of its own series" in res.stderr
    assert f"behind the tip apply made, {tip[:12]}" in res.stderr and "nothing is lost" in res.stderr
    back, again = _next(res.stderr)
    assert ("checkout -q main" in back) == (how[0] == "checkout"), back
    for cmd in (back, again):
        done = _paste(cmd)
        assert done.returncode == 0, (cmd, done.stdout, done.stderr)
    assert git(ws, "rev-parse", "HEAD") == tip
    assert git(ws, "symbolic-ref", "--short", "HEAD") == "main"


def test_export_of_a_head_moved_back_says_the_same(demo):
    tip, _ = _moved_back(demo, ["checkout", "-q", "HEAD~1"])
    res = tool("export", "--series", demo["series"], "--workdir", demo["work"], check=1)
    assert "older commit of its own series" in res.stderr and "a new patch needs" not in res.stderr
    back, again = _next(res.stderr)
    assert _paste(back).returncode == 0
    done = _paste(again)
    assert done.returncode == 0 and "0 written" in done.stdout, done.stdout + done.stderr
    assert git(demo["work"] / ML, "rev-parse", "HEAD") == tip


def test_commits_the_series_does_not_know_are_set_aside_not_reset(demo):
    apply_demo(demo, check=0)
    commit = _mine(demo["work"] / ML)
    res = apply_demo(demo, check=1)
    assert "commits the series does not know" in res.stderr
    export, aside, rebuild = _next(res.stderr)
    assert "tools/export.py" in export and f"--set-aside {ML}" in aside
    for cmd in (aside, rebuild):
        done = _paste(cmd)
        assert done.returncode == 0, (cmd, done.stderr)
    assert _kept_with(demo, commit)
    assert git(demo["work"] / ML, "cat-file", "-t", commit, check=False) != "commit"


def test_set_aside_names_only_workspaces(demo):
    apply_demo(demo, check=0)
    res = tool("kept", "--workdir", demo["work"], "--set-aside", "nemo-rl", check=2)
    assert "has no workspace 'nemo-rl' (it has: megatron-lm)" in res.stderr
    assert (demo["work"] / ML / ".git").is_dir()
    os.rename(demo["work"] / ML, demo["tmp"] / "elsewhere")
    res = tool("kept", "--workdir", demo["work"], "--set-aside", "..", check=2)
    assert "has no workspace '..'" in res.stderr and (demo["tmp"] / "elsewhere" / ".git").is_dir()
