"""Edits to series.toml as text, so comments and layout elsewhere survive.

Three edits exist: drop [[patches]] tables by id, re-pin an upstream, and set a patch's list of
upstream tests it fixes (``upstream_tests``).
An edited series is applied in scratch (carry.workspace.trial) before it replaces the
real one; this module only edits text and imports nothing that applies.
"""

from __future__ import annotations

import re
import tomllib

from ..errors import ConfigError
from .manifest import Upstream

_HEADER = re.compile(r"(?m)^[ \t]*\[\[?[^\]\n]+\]\]?[ \t]*(#.*)?$")


def _blocks(text: str) -> list[tuple[str, str]]:
    """[(header or '', block text)] in order; a block runs to the next table header."""
    out = []
    starts = [m.start() for m in _HEADER.finditer(text)]
    if not starts or starts[0] != 0:
        out.append(("", text[: starts[0] if starts else len(text)]))
    for i, s in enumerate(starts):
        e = starts[i + 1] if i + 1 < len(starts) else len(text)
        block = text[s:e]
        out.append((block.splitlines()[0].strip(), block))
    return out


def remove_patches(text: str, ids: set[str]) -> str:
    kept = []
    found = set()
    for header, block in _blocks(text):
        if header.startswith("[[patches]]"):
            m = re.search(r'(?m)^id\s*=\s*"([^"]+)"', block)
            if m and m.group(1) in ids:
                found.add(m.group(1))
                continue
        kept.append(block)
    missing = ids - found
    if missing:
        raise ConfigError(f"series.toml has no [[patches]] with id {', '.join(sorted(missing))}")
    return "".join(kept)


def toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


_TRAILER = re.compile(r"(?:\n[ \t]*(?:#[^\n]*)?)*\n?$")


def _trailer(block: str) -> str:
    """The comment and blank lines that end a block: they introduce what follows, not this table."""
    body = block.rstrip("\n")
    m = _TRAILER.search(body)
    lines = body[m.start():].lstrip("\n") if m else ""
    return ("\n" + lines + "\n\n") if lines.strip() else ""


def repin(text: str, up: Upstream, kind: str) -> str:
    """Rewrite the [upstreams.NAME.<kind>] table (pypi or git) from a new pin."""
    out = []
    for header, block in _blocks(text):
        if header == f"[upstreams.{up.name}]":
            # the pin's kind may change (a PyPI-pinned upstream moved to a git commit)
            block = re.sub(r"(?m)^sources\s*=\s*\[[^\]]*\]",
                           "sources = [" + ", ".join(toml_str(s) for s in up.sources) + "]", block, count=1)
        if kind == "pypi" and header == f"[upstreams.{up.name}.pypi]" and up.pypi:
            p = up.pypi
            lines = [header, f"name = {toml_str(p.name)}", f"version = {toml_str(p.version)}",
                     "map = { " + ", ".join(f"{toml_str(a)} = {toml_str(b)}" for a, b in p.map) + " }"]
            if p.exclude:
                lines.append("exclude = [" + ", ".join(toml_str(x) for x in p.exclude) + "]")
            lines.append("artifacts = [")
            for a in p.artifacts:
                tree = ", tree = true" if a.tree else ""
                lines.append(f"  {{ file = {toml_str(a.file)}, sha256 = {toml_str(a.sha256)}{tree} }},")
            lines.append("]")
            block = "\n".join(lines) + "\n\n" + _trailer(block).lstrip("\n")
        elif kind == "git" and header == f"[upstreams.{up.name}.git]" and up.git:
            g = up.git
            lines = [header, f"url = {toml_str(g.url)}"]
            if g.commit:
                lines.append(f"commit = {toml_str(g.commit)}")
            if g.ref:
                lines.append(f"ref = {toml_str(g.ref)}")
            if g.paths:
                lines.append("paths = [" + ", ".join(toml_str(x) for x in g.paths) + "]")
            block = "\n".join(lines) + "\n\n" + _trailer(block).lstrip("\n")
        out.append(block)
    return "".join(out)


def set_upstream_tests(text: str, pid: str, tests: list[str]) -> str:
    """The [[patches]] table of ``pid`` with ``upstream_tests`` set to TESTS, one per line (replacing the
    key where the table has it, else after the table's last key)."""
    out, found = [], False
    for header, block in _blocks(text):
        if header.startswith("[[patches]]") and re.search(rf'(?m)^id\s*=\s*{re.escape(toml_str(pid))}\s*$', block):
            found = True
            cut = _TRAILER.search(block.rstrip("\n")).start()   # the comments that introduce what follows stay
            value = "upstream_tests = [\n" + "".join(f"  {toml_str(t)},\n" for t in tests) + "]"
            block = _without_key(block[:cut], "upstream_tests") + "\n" + value + (block[cut:] or "\n")
        out.append(block)
    if not found:
        raise ConfigError(f"series.toml has no [[patches]] with id {pid}")
    return "".join(out)


def _without_key(body: str, key: str) -> str:
    """BODY without the ``key = ...`` line(s): a value over several lines ends where the lines so far are
    TOML (a test id may hold ``]``)."""
    lines = body.split("\n")
    for i, line in enumerate(lines):
        if re.match(rf"{key}\s*=", line):
            for j in range(i, len(lines)):
                try:
                    tomllib.loads("\n".join(lines[i:j + 1]))
                except tomllib.TOMLDecodeError:
                    continue
                return "\n".join(lines[:i] + lines[j + 1:]).rstrip("\n")
    return body
