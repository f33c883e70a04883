"""The checks every command makes of a series' patch entries before using it.

Ids (ASCII kebab-case, never an upstream's name, short enough for every file name the tools
make from one: see ``made_names``), files (``<upstream>/<name>.patch`` inside the series
folder, each listed once; a patch, a proof or its requirements.txt, when there, a regular
file) and ``requires`` (known ids, no cycle, never a later patch of the same upstream). manifest.load refuses a series that fails them; lint
reports the same list among its other problems, so apply never takes what lint refuses.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Iterable

from ..files import not_regular

ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]*[a-z0-9]$", re.ASCII)
# The most bytes one file name may have (NAME_MAX of <limits.h>; ext4, xfs, btrfs and tmpfs alike).
NAME_MAX = 255
PROOF_LOG_LABELS = ("pristine", "patched")  # a proof's two runs, each with a log
_FILE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\.patch$", re.ASCII)


def suggest(word: str, choices: Iterable[str]) -> str | None:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else None


# -- the file names made from a patch id: made here, so that the check below sees each one --------
def pristine_tree_name(upstream: str, pid: str) -> str:
    """prove's (and the nightly's) pristine tree of a patch, in its scratch folder."""
    return f"{upstream}-base-for-{pid}"


def patched_tree_name(upstream: str, pid: str) -> str:
    """prove's patched tree of a patch, in its scratch folder."""
    return f"{upstream}-{pid}"


def proof_log_name(pid: str, proof: str, label: str) -> str:
    """The log of one run of a proof (prove --logs, a nightly cell's folder)."""
    return f"{pid}.{Path(proof.split('::')[0]).stem}.{label}.log"


def house_patch_name(index: int, pid: str) -> str:
    """A NeMo-RL patch in an image's build context (``index``: its place among them, from 1)."""
    return f"{index:04d}-{pid}.patch"


def made_names(series, p) -> list[tuple[str, str]]:
    """(file name, what makes it) for each name a tool makes from patch ``p``'s id."""
    names = [(pristine_tree_name(p.upstream, p.id), "prove's pristine tree"),
             (patched_tree_name(p.upstream, p.id), "prove's patched tree"),
             (p.id, "retire's folder for it (retired/<id>)")]
    names += [(proof_log_name(p.id, proof, label), f"the log of its proof {proof.split('::')[0]}")
              for proof in p.proofs for label in PROOF_LOG_LABELS]
    if p.upstream == "nemo-rl":
        index = [q.id for q in series.patches if q.upstream == p.upstream].index(p.id) + 1
        names.append((house_patch_name(index, p.id), "build-image's copy of it"))
    return names


def _name_problem(series, p) -> str | None:
    """Why an id is too long for a name made from it (the tightest one), or None."""
    size = len(p.id.encode())
    over = [(len(name.encode()) - size, name, what) for name, what in made_names(series, p)
            if len(name.encode()) > NAME_MAX]
    if not over:
        return None
    extra, name, what = max(over)
    return (f"id is {size} bytes: {what} would be named {name[:48]}... ({size + extra} bytes), past the "
            f"{NAME_MAX} bytes a file name may have; at most {NAME_MAX - extra} bytes for this id")


def entry_problems(series) -> list[tuple[str, str]]:
    """(where, message) for each bad patch entry: its id, or a file outside its upstream's
    folder of the series, or listed twice. apply would otherwise apply what lint refuses."""
    probs = []
    upstream_names = {u.name for u in series.upstreams}
    listed: dict[str, str] = {}
    root = series.root.resolve()
    for p in series.patches:
        where = f"patch {p.id}"
        if not ID_RE.match(p.id):
            probs.append((where, "id must be lowercase kebab-case (a-z, 0-9 and '-', ASCII)"))
        if p.id in upstream_names:
            probs.append((where, "a patch id equals an upstream name (--only would be ambiguous)"))
        too_long = _name_problem(series, p)
        if too_long:
            probs.append((where, too_long))
        folder, _, name = p.file.partition("/")
        if folder != p.upstream or not _FILE_NAME_RE.match(name):
            probs.append((where, f"file {p.file!r} must be {p.upstream}/<name>.patch (a file in the "
                                 f"series folder's {p.upstream}/, not outside the series folder)"))
        elif not (series.root / p.file).resolve().is_relative_to(root):
            probs.append((where, f"file {p.file} is a link to outside the series folder"))
        if p.file in listed:
            probs.append((where, f"file {p.file} is also listed by {listed[p.file]}"))
        listed.setdefault(p.file, p.id)
        for rel, kind in _not_files(series.root, p):
            probs.append((where, f"{rel} is {kind}, not a regular file"))
    return probs


def _not_files(root: Path, p) -> list[tuple[str, str]]:
    """The files an entry names that the tools read (its patch, each proof, the requirements.txt
    beside a proof) which exist and are not regular files: (the path in the series, what it is)."""
    rels = [p.file]
    for proof in p.proofs:
        test = proof.split("::")[0]
        rels += [test, (Path(test).parent / "requirements.txt").as_posix()]
    out = []
    for rel in dict.fromkeys(rels):
        kind = not_regular(root / rel)
        if kind is not None:
            out.append((rel, kind))
    return out


def requires_problems(series) -> list[tuple[str, str]]:
    """(where, message) for each broken ``requires``: unknown, itself, later in its upstream, a cycle."""
    probs = []
    ids = {p.id for p in series.patches}
    order = {p.id: i for i, p in enumerate(series.patches)}
    by_id = {p.id: p for p in series.patches}
    for p in series.patches:
        for dep in p.requires:
            if dep not in ids:
                hint = suggest(dep, ids)
                probs.append((f"patch {p.id}", f"requires unknown patch {dep!r}" + (f" ({hint})" if hint else "")))
            elif dep == p.id:
                probs.append((f"patch {p.id}", "requires itself"))
            elif by_id[dep].upstream == p.upstream and order[dep] > order[p.id]:
                probs.append((f"patch {p.id}", f"requires {dep}, which comes later in the same upstream's series"))
    for cycle in _cycles(series):
        probs.append(("requires", "cycle: " + " -> ".join(cycle)))
    return probs


def _cycles(series) -> list[list[str]]:
    graph = {p.id: [d for d in p.requires if d != p.id] for p in series.patches}
    state: dict[str, int] = {}
    found: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in graph.get(node, []):
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                found.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif state.get(nxt) is None:
                visit(nxt, path + [nxt])
        state[node] = 2

    for n in graph:
        if n not in state:
            visit(n, [n])
    return found
