"""The front door and the docs: the README is short and links to pages that exist; the docs
build with MkDocs in strict mode (a broken link or a page left out of the nav is a red test);
docs/pending/ is not part of the site; README and docs speak of the user's machines only."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from helpers import ROOT

pytest.importorskip("mkdocs", reason="mkdocs is in the test extra: pip install -e '.[test]'")


def _build(root, tmp_path):
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(root / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                          capture_output=True, text=True, cwd=root, timeout=300)


def _copy(tmp_path):
    dest = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", dest / "docs")
    shutil.copy2(ROOT / "mkdocs.yml", dest / "mkdocs.yml")
    return dest


def test_the_docs_build_strictly(tmp_path):
    res = _build(ROOT, tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "site" / "guide" / "upstream-tests" / "index.html").is_file()
    assert (tmp_path / "site" / "evidence" / "index.html").is_file()


def test_a_broken_link_or_a_page_left_out_is_red(tmp_path):
    repo = _copy(tmp_path)
    page = repo / "docs" / "concepts.md"
    page.write_text(page.read_text() + "\n[gone](guide/no-such-page.md)\n")
    res = _build(repo, tmp_path)
    assert res.returncode != 0 and "no-such-page.md" in res.stdout + res.stderr
    page.write_text((ROOT / "docs" / "concepts.md").read_text())
    (repo / "docs" / "orphan.md").write_text("# not in the nav\n")
    res = _build(repo, tmp_path)
    assert res.returncode != 0 and "orphan.md" in res.stdout + res.stderr


def test_pending_notes_are_not_part_of_the_site(tmp_path):
    repo = _copy(tmp_path)
    (repo / "docs" / "pending" / "note.md").write_text("# a note\n\n[later](../guide/not-yet.md)\n")
    res = _build(repo, tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert not (tmp_path / "site" / "pending").exists()


def test_the_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 160
    for heading in ("## Quick start", "## The flow", "## Commands", "## Exit codes"):
        assert heading in text
    assert "```mermaid" in text
    for link in re.findall(r"\]\(((?:docs|integration)/[^)#]+)", text):
        assert (ROOT / link).is_file(), link
    # every verb has its one line
    for verb in ("lint", "prove", "export", "retire", "rebase", "upstream_tests", "build_image", "nightly"):
        assert f"`python3 tools/{verb}.py" in text, verb


def _readme_option_claims(text: str) -> dict[str, set[str]]:
    """The README's sentence on which commands take --cache and --source: {option: commands}."""
    para = " ".join(text.split("The commands that fetch upstream inputs take", 1)[1].split("\n\n", 1)[0].split())
    cache_part, rest = para.split("and the first four", 1)
    cache = re.findall(r"`(\w+)`", cache_part.split("(", 1)[1].split(")", 1)[0])
    plain = re.findall(r"`(\w+)`", rest.split(";", 1)[1].split("read only", 1)[0])
    return {"--cache": set(cache), "--source": set(cache[:4]), "none": set(plain)}


def test_the_readme_says_which_commands_take_cache_and_source_as_their_help_does():
    """README's line on the shared options against each command's own --help: a command the README says takes
    --cache or --source takes it, and one it says reads only the series takes neither."""
    claims = _readme_option_claims((ROOT / "README.md").read_text())
    commands = sorted(p.stem for p in (ROOT / "tools").glob("*.py"))
    assert claims["--cache"] | claims["none"] == set(commands), (claims, commands)
    for name in commands:
        usage = subprocess.run([sys.executable, str(ROOT / "tools" / f"{name}.py"), "--help"], capture_output=True,
                               text=True, timeout=60).stdout
        for option in ("--cache", "--source"):
            assert (f"{option} " in usage) == (name in claims[option]), (name, option)


@pytest.mark.parametrize("words", ["shared/gpu/README.md", "/tmp/site", "$OUT", "device call", "call: carry"])
def test_readme_and_docs_speak_of_the_users_machines_only(words):
    pages = [ROOT / "README.md", ROOT / "integration" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for page in pages:
        if "pending" in page.parts:
            continue
        assert words not in page.read_text(), f"{page.relative_to(ROOT)} speaks of {words!r}"
