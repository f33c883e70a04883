"""An edited series (new manifest text, replaced patch files) applied in scratch.

Retire and rebase edit the series as text (carry.series.edit) and call this
before they touch the real series: if the edited series does not apply on its
new base, nothing is written.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from ..report import ApplyReport
from ..series.manifest import Series, load
from .apply import Options, apply_series


def trial_apply(series: Series, toml_text: str, patch_texts: dict[str, bytes], upstream: str, cache: Path,
                source: Path | None) -> ApplyReport:
    """Apply an edited copy of the series (new manifest text, replaced patch files) in scratch.

    Retire and rebase call this before they touch the real series: if the edited series does
    not apply on its new base, nothing is written.
    """
    with tempfile.TemporaryDirectory(prefix="carry-trial-") as tmp:
        trial = Path(tmp) / series.name
        shutil.copytree(series.root, trial)
        (trial / "series.toml").write_text(toml_text)
        for pid, body in patch_texts.items():
            (trial / series.patch(pid).file).write_bytes(body)
        return apply_series(load(trial), Options(
            workdir=Path(tmp) / "work", cache=cache, only=[upstream],
            sources={upstream: source} if source else {}))
