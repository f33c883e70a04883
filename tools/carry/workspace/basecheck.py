"""Whether a cached pristine base is still what it was built as: checked on every use, cheaply.

A pinned base must be the pinned commit (which names its tree). A base built from a tree (an
artifact, an unpacked tree, some paths of a commit) holds ``carry-base.json``, the commit and
tree it was built as: its main must be that commit, a root commit naming its cache key, with that
tree. One git process reads main and its commit, replace refs ignored (a clone does not carry
them). Someone who rewrites the record as well as the repository is not caught here: the cache
is the user's own folder.
"""

from __future__ import annotations

import json

from ..git import Git

RECORD = "carry-base.json"  # in a base built from a tree: the commit and tree it was built as


def check_base(repo: Git, key: str, pinned: str | None) -> tuple[str | None, str | None]:
    """(main, None) when the cached base is usable; (None, why not) otherwise; (None, None) if absent.

    One git process reads main and its commit (replace refs ignored: a clone does not carry
    them). A pinned base must be the pinned commit, which names its tree. A base built from a
    tree (an artifact, an unpacked tree, some paths) must be the commit and the tree recorded
    when it was built from that source: an amended root commit with the same message is
    another commit, with another tree.
    """
    if not repo.path.exists():
        return None, None
    res = repo("--no-replace-objects", "cat-file", "--batch", input="refs/heads/main\n", check=False)
    first, _, raw = res.stdout.partition("\n")
    words = first.split()
    if not res.ok or words[1:2] != ["commit"]:
        return None, "it has no main"
    main = words[0]
    if pinned is not None:
        return (main, None) if main == pinned else (None, f"its main is {main[:12]}, not the pinned {pinned[:12]}")
    header, _, message = raw.partition("\n\n")
    fields = [line.split(" ", 1) for line in header.splitlines()]
    if any(f[0] == "parent" for f in fields):
        return None, f"its main {main[:12]} has a parent: commits were added on top of the pristine tree"
    if f"Carry-Base-Key: {key}" not in message.splitlines():
        return None, f"its main {main[:12]} is not the base built for {key}"
    tree = next((f[1] for f in fields if f[0] == "tree" and len(f) > 1), None)
    try:
        record = json.loads((repo.path / RECORD).read_text())
        want_commit, want_tree = record["commit"], record["tree"]
    except (OSError, ValueError, KeyError, TypeError):
        return None, f"it has no readable {RECORD} (the tree it was built as)"
    if (main, tree) != (want_commit, want_tree):
        return None, (f"its main {main[:12]} (tree {str(tree)[:12]}) is not the commit {str(want_commit)[:12]} "
                      f"(tree {str(want_tree)[:12]}) built from the source")
    return main, None
