"""How the mini test names what went wrong: the series' known bugs, and its own failed checks.

A failure that matches a known bug of the gtp series is reported as ``BUG_HIT: <patch id>`` (ids
as in patches/gtp/series.toml), so that a nightly bisection can say which patch a tree lacks.
"""

from __future__ import annotations

import re

# Known signatures, in the words the unpatched code fails with. The text searched is the
# exception line plus its traceback (the prefetch bug is a bare "KeyError: None").
SIGNATURES = (
    ("mlm-te-bias-sizing", re.compile(r"must match the size of tensor")),
    # A GTP-off checkpoint into the GTP model: TE allocated the replicated QKV bias 1/gtp short.
    ("mlm-te-bias-sizing", re.compile(r"Global shape mismatch for loaded .* for key \S*\.bias\b")),
    ("mlm-tied-weight-guard", re.compile(r"supplied weight's shape")),
    ("mlm-pg-collection", re.compile(r"unexpected keyword argument '?pg_collection'?")),
    # megatron-core's refit planner takes a GTP shard for the whole TP-local tensor.
    ("mlm-gtp-refit-plan", re.compile(r"Cannot build TP descriptor for \S+ dim0")),
    # The tied embedding's stale dummy wgrad added to its gradient: finite, its norm not.
    ("mlm-gtp-tied-dummy-wgrad",
     re.compile(r"gradient norm is (inf|nan)\b.*largest gradient norms before clipping: "
                r"embedding\.word_embeddings\.weight")),
    ("mlm-gtp-tied-prefetch",
     re.compile(r"KeyError: None(?s:.*)(_get_prefetched_weight|wgrad_reduce_scatter)"
                r"|(_get_prefetched_weight|wgrad_reduce_scatter)(?s:.*)KeyError: None")),
)


class KnownBug(Exception):
    """A failure this test recognises as one of the series' bugs."""

    def __init__(self, patch_id: str, message: str):
        super().__init__(f"{patch_id}: {message}")
        self.patch_id = patch_id
        self.message = message


class CheckFailed(AssertionError):
    """One of this test's own checks failed (not a known bug)."""


def check(cond, message: str) -> None:
    if not cond:
        raise CheckFailed(message)


def classify(exc: BaseException, traceback_text: str = "") -> KnownBug | None:
    if isinstance(exc, KnownBug):
        return exc
    line = f"{type(exc).__name__}: {exc}"
    text = line + "\n" + traceback_text
    for patch_id, pattern in SIGNATURES:
        if pattern.search(text):
            return KnownBug(patch_id, " ".join(line.split())[:400])
    return None
