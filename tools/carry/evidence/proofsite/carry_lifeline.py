"""A proof's processes die with their parent (carry.evidence.prove, issue: orphans after a SIGKILL).

``tie()`` asks Linux to SIGKILL this process when its parent exits (``PR_SET_PDEATHSIG`` through
libc's ``prctl``), and kills it at once where the parent is already gone. ``tie_forks()`` makes
every later ``os.fork`` of this process (multiprocessing's fork and forkserver ranks) do the same
in the child, so a chain prove -> zygote -> proof -> rank dies from its first link down. Elsewhere
than Linux both are no-ops: the process group a proof runs in, and the zygote's watchdog pipe, are
what stop them there.

Only the standard library: it runs in every proof interpreter, the zygote and ranks.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
_prctl = None
if sys.platform.startswith("linux"):
    try:
        _prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        _prctl = None


def tie(parent: int | None = None) -> bool:
    """SIGKILL this process when its parent exits; ``parent`` is the pid it should have (a check
    that the parent did not die before the request). True where the kernel took the request."""
    if _prctl is None:
        return False
    ok = _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)  # the parent went before the request took hold
    return ok


_tied_forks = False


def tie_forks() -> None:
    global _tied_forks
    if _tied_forks or _prctl is None:
        return
    _tied_forks = True
    parent = [os.getpid()]

    def before() -> None:
        parent[0] = os.getpid()

    os.register_at_fork(before=before, after_in_child=lambda: tie(parent[0]))
