"""Reading ``git format-patch`` files: headers, touched paths, modes, hunks.

Used by lint (is the patch well formed and confined to the tree?), by apply
(which files and hunks a conflict concerns) and by tests that import a file
a patch adds whole (``new_file_text``) without the upstream tree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ..errors import PatchFormatError

_DIFF_RE = re.compile(r"^diff --git (?P<a>\S+) (?P<b>\S+)$")
_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass
class Hunk:
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    header: str
    lines: list[str] = field(default_factory=list)


@dataclass
class FileDiff:
    old_path: str | None
    new_path: str | None
    old_mode: str | None = None
    new_mode: str | None = None
    new_file: bool = False
    deleted: bool = False
    binary: bool = False
    rename_from: str | None = None
    rename_to: str | None = None
    hunks: list[Hunk] = field(default_factory=list)

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""


@dataclass
class Patch:
    source: str
    author: str
    date: str
    subject: str
    files: list[FileDiff]


def _strip_prefix(raw: str, prefix: str) -> str:
    if raw.startswith('"'):
        raise PatchFormatError(f"quoted path {raw} is not supported")
    if not raw.startswith(prefix):
        raise PatchFormatError(f"path {raw!r} lacks the {prefix!r} prefix")
    return raw[len(prefix):]


def parse(text: str, source: str = "<patch>") -> Patch:
    lines = text.splitlines()
    if not lines or not lines[0].startswith("From "):
        raise PatchFormatError(f"{source}: not a git format-patch file (no 'From <commit>' first line)")
    author = date = ""
    subject_lines: list[str] = []
    i = 1
    in_subject = False
    while i < len(lines) and lines[i].strip():
        line = lines[i]
        if line.startswith("From: "):
            author, in_subject = line[6:], False
        elif line.startswith("Date: "):
            date, in_subject = line[6:], False
        elif line.startswith("Subject: "):
            subject_lines, in_subject = [line[9:]], True
        elif line[:1] in (" ", "\t") and in_subject:
            subject_lines.append(line.strip())
        else:
            in_subject = False
        i += 1
    subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", " ".join(subject_lines)).strip()
    if not subject:
        raise PatchFormatError(f"{source}: no Subject header")

    files: list[FileDiff] = []
    cur: FileDiff | None = None
    hunk: Hunk | None = None
    for line in lines[i:]:
        m = _DIFF_RE.match(line)
        if m:
            cur = FileDiff(_strip_prefix(m["a"], "a/"), _strip_prefix(m["b"], "b/"))
            files.append(cur)
            hunk = None
            continue
        if cur is None:
            continue
        if line == "-- " or line.startswith("-- \n"):
            break
        if hunk is None or line[:1] not in (" ", "+", "-", "\\"):
            if line.startswith("new file mode "):
                cur.new_file, cur.new_mode = True, line.split()[-1]
            elif line.startswith("deleted file mode "):
                cur.deleted, cur.old_mode = True, line.split()[-1]
            elif line.startswith("old mode "):
                cur.old_mode = line.split()[-1]
            elif line.startswith("new mode "):
                cur.new_mode = line.split()[-1]
            elif line.startswith("rename from "):
                cur.rename_from = line[len("rename from "):]
            elif line.startswith("rename to "):
                cur.rename_to = line[len("rename to "):]
            elif line.startswith("copy from ") or line.startswith("copy to "):
                cur.rename_from = cur.rename_from or line.split(" ", 2)[-1]
            elif line.startswith("GIT binary patch") or line.startswith("Binary files "):
                cur.binary = True
            elif line.startswith("--- "):
                cur.old_path = None if line[4:] == "/dev/null" else _strip_prefix(line[4:], "a/")
            elif line.startswith("+++ "):
                cur.new_path = None if line[4:] == "/dev/null" else _strip_prefix(line[4:], "b/")
            elif line.startswith("@@"):
                h = _HUNK_RE.match(line)
                if not h:
                    raise PatchFormatError(f"{source}: bad hunk header {line!r} in {cur.path}")
                hunk = Hunk(int(h[1]), int(h[2] or 1), int(h[3]), int(h[4] or 1), line)
                cur.hunks.append(hunk)
            continue
        hunk.lines.append(line)  # a context, added, removed or "\ No newline" line
    if not files:
        raise PatchFormatError(f"{source}: contains no 'diff --git' section")
    for f in files:
        for h in f.hunks:
            old = sum(1 for x in h.lines if x[:1] in (" ", "-"))
            new = sum(1 for x in h.lines if x[:1] in (" ", "+"))
            if (old, new) != (h.old_len, h.new_len):
                raise PatchFormatError(
                    f"{source}: hunk {h.header} in {f.path} has {old}/{new} lines where its header "
                    f"says {h.old_len}/{h.new_len} (edited by hand? re-export it with tools/export.py)"
                )
    return Patch(source, author, date, subject, files)


def parse_file(path: Path) -> Patch:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PatchFormatError(f"patch file {path} does not exist") from None
    except IsADirectoryError:
        raise PatchFormatError(f"patch file {path} is a directory") from None
    except UnicodeDecodeError:
        raise PatchFormatError(f"{path}: not UTF-8 text") from None
    return parse(text, str(path))


def safety_problems(patch: Patch) -> list[str]:
    """Ways a patch could write outside its tree or smuggle in odd files."""
    problems = []
    for f in patch.files:
        for p in {f.old_path, f.new_path, f.rename_from, f.rename_to} - {None}:
            pp = PurePosixPath(p)
            if pp.is_absolute() or p.startswith("/"):
                problems.append(f"{p}: absolute path")
            if ".." in pp.parts:
                problems.append(f"{p}: '..' escapes the tree")
            if pp.parts and pp.parts[0] == ".git" or ".git" in pp.parts:
                problems.append(f"{p}: touches git metadata")
            if "\\" in p:
                problems.append(f"{p}: backslash in path")
        for mode in (f.old_mode, f.new_mode):
            if mode == "120000":
                problems.append(f"{f.path}: symlink (mode 120000)")
            elif mode == "160000":
                problems.append(f"{f.path}: submodule entry (mode 160000)")
            elif mode and mode not in ("100644", "100755"):
                problems.append(f"{f.path}: unusual mode {mode}")
        if f.binary:
            problems.append(f"{f.path}: binary diff (cannot be reviewed as text)")
    return problems


def new_file_text(patch_path: Path | str, repo_path: str) -> str:
    """The full text of a file the patch adds whole, read from the patch alone."""
    patch = parse_file(Path(patch_path))
    for f in patch.files:
        if f.new_path == repo_path and f.new_file:
            out = []
            for h in f.hunks:
                for line in h.lines:
                    if line.startswith("+"):
                        out.append(line[1:])
                    elif line.startswith("\\"):
                        continue
            text = "\n".join(out) + "\n"
            return text
    raise PatchFormatError(f"{patch_path} does not add {repo_path} as a new file")
