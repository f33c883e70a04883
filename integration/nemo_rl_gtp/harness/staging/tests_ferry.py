"""The "tests" ferry: the upstreams' own unit tests at their pinned commits, for a GPU host that reaches no git
server (tools/upstream_tests.py there, as integration/shared-gpu-h200.sh's upstream-tests-bg runs it).

Per upstream named with ``--tests-source NAME=CLONE``: the pin's paths (series.toml
``[upstreams.NAME.tests]``), read through tools/upstream_tests.py's own checkout (every path's git hash
checked, and the pin checked to hold every module of the repository its files import), as
``tests/NAME.tar.xz`` beside ``tests/manifest.json``. On the host, ``bash .ferry/recv.sh tests DIR``
joins and unpacks the parts; ``unpack_tests_ferry DIR`` (integration/shared-gpu-lib.sh) unpacks each
archive into ``DIR/NAME``, which is ``--tests-source NAME=DIR/NAME`` there (a folder of the pinned
paths, whose hashes the tool checks again). With them, ``wheels/``: the lock's ``[[tests]]`` wheels (what
those tests import that the host's stack lacks), which ``unpack_tests_ferry`` installs into ``DIR/site``,
put on those tests' path alone.
"""

from __future__ import annotations

import lzma
import shutil
import tarfile
import tempfile
from pathlib import Path

from carry import progress
from carry.errors import UsageError
from carry.evidence.upstream import suite
from carry.series.manifest import Series
from carry.workspace.artifacts import sha256_file

from . import ferry

TESTS_FERRY = "tests"


def stage_tests(series: Series, sources: dict[str, Path], out: Path, cache: Path, ferry_root: Path,
                part_bytes: int, xz_level: int = 9, wheels: list[Path] = ()) -> dict:
    """Write the "tests" ferry for SOURCES ({upstream: clone or folder of its pinned paths}) and WHEELS
    (hash-checked already); its report."""
    if not sources:
        raise UsageError("no --tests-source given: the tests ferry would hold nothing")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    files: dict[str, Path] = {}
    manifest: dict = {"schema": 1, "ferry": TESTS_FERRY, "series": series.name, "upstreams": {}}
    for name, source in sorted(sources.items()):
        pin = series.upstream(name).tests
        if pin is None or pin.source != "git":
            raise UsageError(f"--tests-source {name}: series {series.name} pins no tests commit for it "
                             f"({'its tests are its own tree' if pin else 'no [upstreams.' + name + '.tests]'})",
                             hint="name an upstream whose [upstreams.NAME.tests] pins a commit and its paths")
        checked = suite.checkout(pin, cache, source.absolute())
        xz = out / f"{name}.tar.xz"
        progress.say(f"tests ferry: {name}'s {len(pin.path_names)} pinned path(s) at {pin.commit[:12]}")
        with tempfile.TemporaryDirectory(prefix="carry-tests-ferry-") as tmp:
            checked.unpack(Path(tmp))
            with lzma.open(xz, "wb", preset=xz_level) as f, \
                    tarfile.open(fileobj=f, mode="w|", format=tarfile.GNU_FORMAT) as tf:
                for path in pin.path_names:
                    tf.add(Path(tmp) / path, arcname=path)
        files[xz.name] = xz
        manifest["upstreams"][name] = {"tests": pin.describe(), "paths": dict(pin.paths), "sha256": sha256_file(xz),
                                       "bytes": xz.stat().st_size}
    for whl in wheels:   # compressed already: as they are
        files[f"wheels/{whl.name}"] = whl
    manifest["wheels"] = {whl.name: sha256_file(whl) for whl in wheels}
    parts = ferry.pack_files(ferry_root, TESTS_FERRY, files, manifest, part_bytes)
    return {"tests_parts": [str(p) for p in parts], "tests_part_mb": ferry.sizes_mb(parts),
            "tests_wheels": [whl.name for whl in wheels],
            "tests_upstreams": sorted(sources), "tests_mb": round(sum(f.stat().st_size for f in files.values()) / 1e6, 1)}
