"""retire and rebase take a target release from the cache, checked by sha256 (issue 32 item 17).

The first download of a release notes which file it gave; a later call with the same release and
tags reads that file from the cache, its sha256 checked again, and runs no pip. The package
index is made unreachable here: a call that downloads fails, one that uses the cache does not.
"""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from carry.errors import SourceError
from carry.series.manifest import load
from carry.workspace.artifacts import download_version, release_record
from helpers import SERIES


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)


def _seed(cache, pin_cache):
    """The cache as one earlier download of 'release 0.19.2' left it (the pinned wheel stands in)."""
    pypi = load(SERIES).upstream("megatron-lm").pypi
    art = pypi.tree_artifact
    src = pin_cache / "artifacts" / art.sha256 / art.file
    dest = cache / "artifacts" / art.sha256 / art.file
    dest.parent.mkdir(parents=True)
    shutil.copy(src, dest)
    record = release_record(cache, pypi, art, pypi.version)
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"file": art.file, "sha256": art.sha256}))
    return pypi, art, dest


def test_a_release_downloaded_once_comes_from_the_cache(tmp_path, pin_cache, offline):
    pypi, art, dest = _seed(tmp_path / "cache", pin_cache)
    got = download_version("megatron-lm", pypi, art, pypi.version, tmp_path / "cache")
    assert (got.file, got.sha256) == (art.file, hashlib.sha256(dest.read_bytes()).hexdigest())


def test_a_cached_release_that_changed_is_not_used(tmp_path, pin_cache, offline):
    pypi, art, dest = _seed(tmp_path / "cache", pin_cache)
    dest.write_bytes(dest.read_bytes() + b"tampered")
    with pytest.raises(SourceError):  # not the cached file: it is downloaded again (and the index is gone)
        download_version("megatron-lm", pypi, art, pypi.version, tmp_path / "cache")
