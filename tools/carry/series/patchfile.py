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
from ..files import read_input

_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
# The extended header lines git apply reads after ``diff --git`` (its parse_git_diff_header):
# the first other line ends the header.
_GIT_HEADERS = ("--- ", "+++ ", "old mode ", "new mode ", "deleted file mode ", "new file mode ",
                "copy from ", "copy to ", "rename old ", "rename new ", "rename from ", "rename to ",
                "similarity index ", "dissimilarity index ", "index ")
# Names git reads as its own settings wherever they are in a tree, so a patch may not add, change or
# remove one: .git (the repository); .gitattributes (line ends, -diff, export-ignore, export-subst,
# working-tree-encoding: what export writes, what apply checks out, what prove's extracted trees
# hold); .gitmodules (submodules); .gitignore (what `git status` and `git add -A` see: export's
# and apply's checks that a workspace holds nothing uncommitted). Compared as Windows and macOS
# file systems compare names (any case, trailing dots and spaces dropped), as git itself guards
# .git. Not here: .mailmap (no command of this tool reads authors through it) and names git gives
# no meaning (.gitkeep, .github/).
GIT_METADATA = (".git", ".gitattributes", ".gitmodules", ".gitignore")
_ESCAPES = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11, "\\": 92, '"': 34}


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
    copy: bool = False
    hunks: list[Hunk] = field(default_factory=list)
    line: int = 0            # of its ``diff --git`` line, 1-based
    names: set[str] = field(default_factory=set)  # every name any of its header lines gives
    index_mode: str | None = None  # the mode on its ``index`` line: an existing file's, kept as it is
    traditional: bool = False  # a ``---``/``+++`` section with no ``diff --git`` (git apply takes it too)

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


def _unquote(raw: str, source: str, lineno: int) -> tuple[str, str]:
    """A C-quoted name as git writes one (``"a/x\ty"``, octal bytes): (the name, the rest of the line)."""
    out = bytearray()
    i = 1
    while i < len(raw):
        c = raw[i]
        if c == '"':
            return out.decode("utf-8", "surrogateescape"), raw[i + 1:]
        if c == "\\" and i + 1 < len(raw):
            nxt = raw[i + 1]
            if nxt in _ESCAPES:
                out.append(_ESCAPES[nxt])
                i += 2
                continue
            if raw[i + 1:i + 4].isdigit() and len(raw[i + 1:i + 4]) == 3:
                out.append(int(raw[i + 1:i + 4], 8) & 0xFF)
                i += 4
                continue
            raise PatchFormatError(f"{source}:{lineno}: bad escape in the quoted name {raw}")
        out += c.encode("utf-8", "surrogateescape")
        i += 1
    raise PatchFormatError(f"{source}:{lineno}: unterminated quoted name {raw}")


def _strip(name: str, prefix: str, source: str, lineno: int) -> str:
    if not name.startswith(prefix):
        raise PatchFormatError(f"{source}:{lineno}: path {name!r} lacks the {prefix!r} prefix")
    return name[len(prefix):]


def _header_names(rest: str, source: str, lineno: int) -> set[str]:
    """The names a ``diff --git`` line can mean, read as git reads it.

    git splits ``a/X b/Y`` where X equals Y (so a name may hold spaces); quoted names are
    unquoted. A rename's two names differ: then git takes them from the ``rename``/``---``
    lines, and every split is returned here so that each is checked.
    """
    if rest.startswith('"'):
        first, tail = _unquote(rest, source, lineno)
        tail = tail.lstrip(" ")
        second = _unquote(tail, source, lineno)[0] if tail.startswith('"') else tail
        return {_strip(first, "a/", source, lineno), _strip(second, "b/", source, lineno)}
    cut = rest.find(' "')
    if cut >= 0:
        second = _unquote(rest[cut + 1:], source, lineno)[0]
        return {_strip(rest[:cut], "a/", source, lineno), _strip(second, "b/", source, lineno)}
    names: set[str] = set()
    for i, c in enumerate(rest):
        if c == " ":
            left, right = rest[:i], rest[i + 1:]
            if left.startswith("a/") and right.startswith("b/"):
                names.update({left[2:], right[2:]})
    if not names:
        raise PatchFormatError(f"{source}:{lineno}: 'diff --git {rest}' names no a/ and b/ paths")
    return names


def _line_name(raw: str, source: str, lineno: int) -> str:
    """A name on a ``---``/``+++``/``rename``/``copy`` line: quoted, or up to a tab (git's own rule)."""
    return _unquote(raw, source, lineno)[0] if raw.startswith('"') else raw.split("\t", 1)[0]


def _headers(lines: list[str], source: str) -> tuple[str, str, str, int]:
    """(author, date, subject, index of the first body line). Refuses what makes ``git am`` read another
    text than this file's (an encoded body, a multipart mail)."""
    author = date = ""
    subject_lines: list[str] = []
    i = 1
    in_subject = False
    while i < len(lines) and lines[i].strip():
        line = lines[i]
        low = line.lower()
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
        if low.startswith("content-transfer-encoding:") and low.split(":", 1)[1].strip() not in ("7bit", "8bit"):
            raise PatchFormatError(f"{source}:{i + 1}: {line.strip()}: git am would decode the body, so the "
                                   "patch it applies is not the text in this file")
        if low.startswith("content-type:") and "multipart" in low:
            raise PatchFormatError(f"{source}:{i + 1}: a multipart mail: git am would apply its parts, "
                                   "which this file does not show as text")
        i += 1
    subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", " ".join(subject_lines)).strip()
    if not subject:
        raise PatchFormatError(f"{source}: no Subject header")
    return author, date, subject, i


def _starts_a_mail(line: str) -> bool:
    """Whether git mailsplit takes this line for an mbox "From " line (its is_from_line: a time's
    digits around the last colon, and a year after it)."""
    if len(line) < 19 or not line.startswith("From "):
        return False
    c = line.rfind(":", 5, len(line) - 1)
    if c < 9 or c + 3 > len(line):
        return False
    if not all(line[i].isdigit() for i in (c - 4, c - 2, c - 1, c + 1, c + 2)):
        return False
    year = re.match(r"\s*(\d+)", line[c + 3:])
    return bool(year) and int(year[1][:9]) > 90


def parse(text: str, source: str = "<patch>") -> Patch:
    """Every file section ``git am`` would apply, found as git apply finds them.

    git apply reads the whole text after the message: a section may follow the ``-- ``
    signature, and a ``---``/``+++`` pair with no ``diff --git`` is a section too. A hunk
    is as long as its header says; what follows it is read for headers again. A ``From ``
    line starts another mail for git am, and is refused.
    """
    nul = text.find("\0")
    if nul >= 0:
        # git takes a file that holds a NUL for binary: format-patch never writes one as text, and a
        # hunk made by hand would put it in the tree unseen (it shows as nothing)
        raise PatchFormatError(f"{source}:{text.count(chr(10), 0, nul) + 1}: a NUL byte: a patch file is text "
                               "(git writes a change to a file holding one as binary)")
    # git splits lines at "\n" only (a form feed or "\r" inside a line is the line's)
    lines = [x[:-1] if x.endswith("\r") else x for x in text.split("\n")]
    if lines and lines[-1] == "":
        lines.pop()
    if not lines or not lines[0].startswith("From "):
        raise PatchFormatError(f"{source}: not a git format-patch file (no 'From <commit>' first line)")
    author, date, subject, i = _headers(lines, source)
    files: list[FileDiff] = []
    n = len(lines)
    while i < n:
        line = lines[i]
        if _starts_a_mail(line):
            raise PatchFormatError(f"{source}:{i + 1}: a second 'From ' line: git am would read the rest as "
                                   "another mail (one patch per file)")
        if line.startswith("diff --git "):
            cur = FileDiff(None, None, line=i + 1)
            cur.names = _header_names(line[len("diff --git "):], source, i + 1)
            if len(cur.names) == 2:
                cur.old_path, cur.new_path = sorted(cur.names)  # refined by the lines below
            else:
                cur.old_path = cur.new_path = next(iter(cur.names))
            i = _git_header(lines, i + 1, cur, source)
        elif line.startswith("--- ") and i + 1 < n and lines[i + 1].startswith("+++ "):
            cur = FileDiff(None, None, line=i + 1, traditional=True)
            for raw in (lines[i][4:], lines[i + 1][4:]):
                name = _line_name(raw, source, i + 1)
                if name != "/dev/null":
                    cur.names.add(name.split("/", 1)[-1])
            cur.old_path = cur.new_path = min(cur.names) if cur.names else None
            i += 2
        elif line.startswith("@@ -"):
            raise PatchFormatError(f"{source}:{i + 1}: a hunk with no file header before it ({line!r}): "
                                   "the patch file is malformed")
        else:
            i += 1
            continue
        files.append(cur)
        i = _hunks(lines, i, cur, source)
    if not files:
        raise PatchFormatError(f"{source}: contains no 'diff --git' section")
    return Patch(source, author, date, subject, files)


def _git_header(lines: list[str], i: int, cur: FileDiff, source: str) -> int:
    """Read the extended header lines of a ``diff --git`` section; the index of the first other line."""
    while i < len(lines):
        line = lines[i]
        key = next((k for k in _GIT_HEADERS if line.startswith(k)), None)
        if key is None:
            if line.startswith("GIT binary patch") or (line.startswith("Binary files ") and line.endswith(" differ")):
                cur.binary = True
                i += 1
                continue
            return i
        val = line[len(key):]
        if key in ("--- ", "+++ "):
            name = _line_name(val, source, i + 1)
            if name != "/dev/null":
                name = _strip(name, "a/" if key == "--- " else "b/", source, i + 1)
                cur.names.add(name)
            if key == "--- ":
                cur.old_path = None if name == "/dev/null" else name
            else:
                cur.new_path = None if name == "/dev/null" else name
        elif key in ("old mode ", "deleted file mode "):
            cur.old_mode = val.strip()
            cur.deleted = cur.deleted or key.startswith("deleted")
        elif key in ("new mode ", "new file mode "):
            cur.new_mode = val.strip()
            cur.new_file = cur.new_file or key.startswith("new file")
        elif key == "index ":
            parts = val.split()
            cur.index_mode = parts[1] if len(parts) > 1 else None
        elif key in ("rename from ", "rename old ", "copy from "):
            cur.rename_from = cur.old_path = _line_name(val, source, i + 1)
            cur.names.add(cur.rename_from)
            cur.copy = key.startswith("copy")
        elif key in ("rename to ", "rename new ", "copy to "):
            cur.rename_to = cur.new_path = _line_name(val, source, i + 1)
            cur.names.add(cur.rename_to)
        i += 1
    return i


def _hunks(lines: list[str], i: int, cur: FileDiff, source: str) -> int:
    """Read a section's hunks, each exactly as long as its header says (as git apply does)."""
    while i < len(lines) and lines[i].startswith("@@ -"):
        h = _HUNK_RE.match(lines[i])
        if not h:
            raise PatchFormatError(f"{source}:{i + 1}: bad hunk header {lines[i]!r} in {cur.path}: the patch "
                                   "file is malformed")
        hunk = Hunk(int(h[1]), 1 if h[2] is None else int(h[2]), int(h[3]), 1 if h[4] is None else int(h[4]),
                    lines[i])
        cur.hunks.append(hunk)
        old, new = hunk.old_len, hunk.new_len
        start = i
        i += 1
        while (old or new) and i < len(lines):
            line = lines[i]
            c = line[:1]
            if c in (" ", "") and old and new:
                old, new = old - 1, new - 1
            elif c == "-" and old:
                old -= 1
            elif c == "+" and new:
                new -= 1
            elif c == "\\" and len(line) >= 12:
                pass
            else:
                break
            hunk.lines.append(line if c else " ")
            i += 1
        if old or new:
            raise PatchFormatError(
                f"{source}:{i + 1}: corrupt patch: hunk {hunk.header} (line {start + 1}) in {cur.path} ends "
                f"after {hunk.old_len - old}/{hunk.new_len - new} of the {hunk.old_len}/{hunk.new_len} lines its "
                "header says (edited by hand? fix it or re-export it with tools/export.py)")
        if i < len(lines) and lines[i].startswith("\\ "):
            hunk.lines.append(lines[i])
            i += 1
    return i


def parse_file(path: Path, source: str | None = None) -> Patch:
    """The patch in ``path``; ``source`` names it in messages (default: the path)."""
    source = source or str(path)
    try:
        data = read_input(path)
    except FileNotFoundError:
        raise PatchFormatError(f"patch file {source} does not exist") from None
    except IsADirectoryError:
        raise PatchFormatError(f"patch file {source} is a directory") from None
    return parse_bytes(data, source)


def parse_bytes(data: bytes, source: str) -> Patch:
    """A patch file's bytes as this module reads them: UTF-8 text (line ends kept as they are)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PatchFormatError(f"{source}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    return parse(text, source)


def safety_problems(patch: Patch) -> list[str]:
    """Ways a patch could write outside its tree or smuggle in odd files: every name any header line
    of a section gives is checked, and every mode, the ``index`` line's too (an existing symlink)."""
    problems = []
    for f in patch.files:
        where = f"{f.path or '?'} (line {f.line})"
        if f.traditional:
            problems.append(f"{where}: a file section with no 'diff --git' header (git apply takes it too; "
                            "format-patch never writes one)")
        for p in sorted(f.names | ({f.old_path, f.new_path, f.rename_from, f.rename_to} - {None})):
            problems += [f"{p}: {why}" for why in path_problems(p)]
        for mode in dict.fromkeys((f.old_mode, f.new_mode, f.index_mode)):
            if mode == "120000":
                problems.append(f"{where}: symlink (mode 120000)")
            elif mode == "160000":
                problems.append(f"{where}: submodule entry (mode 160000)")
            elif mode and mode not in ("100644", "100755"):
                problems.append(f"{where}: unusual mode {mode}")
        if f.binary:
            problems.append(f"{where}: binary diff (cannot be reviewed as text)")
    return problems


def path_problems(p: str) -> list[str]:
    """Why a path in a patch is not a plain path inside the tree (empty list: it is)."""
    pp = PurePosixPath(p)
    why = []
    if not p or p.startswith("/"):
        why.append("absolute path" if p else "empty path")
    if ".." in p.split("/"):
        why.append("'..' escapes the tree")
    if any(part.lower().rstrip(". ") in GIT_METADATA for part in pp.parts):
        why.append("touches git metadata")
    if "\\" in p:
        why.append("backslash in path")
    if any(ord(c) < 32 or c == "\x7f" for c in p):
        why.append("control character in path")
    return why


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
