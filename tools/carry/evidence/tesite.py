"""The TransformerEngine site: one name for where TE is installed on a GPU host.

``CARRY_TE_SITE=DIR`` (or ``--te-site DIR`` on prove and nightly, which sets it) names a folder
that holds TransformerEngine (``shared/gpu/README.md``'s ``/tmp/site``, a ``pip install
--target`` folder). Every check that may need TE puts it on its interpreter's path after the
trees under test: the proofs (carry.evidence.prove, so also the nightly's proofs cell and retire) and the
nightly's command cells (``${CARRY_TE_SITE:-}`` in integration/nightly.toml). Unset, nothing is
added and the GPU proofs skip for want of TE. A value that names no folder is an error: a typo
would otherwise turn every GPU proof into a silent skip.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..errors import ConfigError

VARIABLE = "CARRY_TE_SITE"


def add_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--te-site", type=Path, metavar="DIR",
                   help=f"where TransformerEngine is installed; put on the path of every check after the "
                        f"trees (sets ${VARIABLE}, which does the same)")


def use(flag: Path | None) -> Path | None:
    """Apply ``--te-site`` (it wins over the variable) and return the checked site, if any."""
    if flag is not None:
        os.environ[VARIABLE] = str(flag.absolute())
    return site()


def site() -> Path | None:
    raw = os.environ.get(VARIABLE, "")
    if not raw:
        return None
    path = Path(raw).absolute()
    if not path.is_dir():
        raise ConfigError(f"{VARIABLE}={raw} is not a folder: no TransformerEngine site there",
                          hint="point --te-site (or CARRY_TE_SITE) at the folder that holds transformer_engine/, "
                               "or unset it to run without TE")
    return path
