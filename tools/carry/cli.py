"""The command line: ``gtp-carry <verb> [options]``, and ``tools/<verb>.py`` as the same thing.

One module per command under carry.commands, each with ``main(argv, prog)``.
Errors become a message and an exit code here only (see the README's exit
codes): typed errors print ``error:`` and, when there is one, a ``next:``
line with the command to run.
"""

from __future__ import annotations

import importlib
import sys

from . import shell
from .errors import CarryError, from_os_error

VERBS = {
    "apply": "apply the series onto the pinned upstream bases (patched workspaces)",
    "export": "workspace commits -> normalised patch files",
    "prove": "each patch's proof: red on the pristine base, green patched",
    "lint": "check the series' files, metadata, proofs and requires",
    "retire": "which patches a new upstream base already has, with evidence",
    "rebase": "move one upstream's patches onto a new base (3-way)",
    "build-image": "build a container image of the patched stack",
    "nightly": "run, judge and bisect the integration matrix",
    "upstream-tests": "each upstream's own unit tests, pristine against patched",
    "kept": "the old workspaces a rebuild kept aside: list, restore, delete, prune",
}


def guarded(entry, *args) -> int:
    """Call a command's entry point; its typed errors become their message and exit code."""
    try:
        return entry(*args)
    except CarryError as exc:
        print(exc.render(), file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        # A path of the user's set-up (a file where a folder must be, a read-only mount, a full
        # disk, ...) is named, not a traceback. An OSError we cannot name is a bug: it propagates.
        named = from_os_error(exc)
        if named is None:
            raise
        print(named.render(), file=sys.stderr)
        return named.exit_code
    except KeyboardInterrupt as exc:
        print("interrupted: nothing was changed that a later run does not finish or undo", file=sys.stderr)
        return getattr(exc, "exit_code", 130)  # 128 + the signal (carry.nightly.stop: SIGTERM too)


def run(verb: str, argv: list[str], prog: str | None = None) -> int:
    module = importlib.import_module(f".commands.{verb.replace('-', '_')}", __package__)
    shell.running(verb)  # a hint that says "run it again with ..." spells this command
    try:
        return guarded(module.main, argv, prog or f"gtp-carry {verb}")
    finally:
        shell.running(None)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in VERBS:
        width = max(map(len, VERBS))
        lines = ["usage: gtp-carry <command> [options]   (gtp-carry <command> --help for its options)", "",
                 "commands:"] + [f"  {v:<{width}}  {what}" for v, what in VERBS.items()]
        if argv and argv[0] not in ("-h", "--help"):
            print("\n".join(lines), file=sys.stderr)
            print(f"error: unknown command {argv[0]!r}", file=sys.stderr)
            return 2
        print("\n".join(lines), file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    return run(argv[0], argv[1:])
