"""What NeMo-RL declares it depends on, against what the GPU host will have: the stage refuses a
dependency that neither a staged wheel nor the host's measured package list meets, unless wheels.toml's
[[nrl_without]] says why the run does without it. NeMo-RL's own tests met one on a GPU (zstandard: its
sparse refit's compression, h100/2026-12-05-upstream-tests); this finds the class before a GPU does."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT

NRL = ROOT / "integration" / "nemo_rl_gtp"
sys.path.insert(0, str(NRL))

from carry.errors import ConfigError  # noqa: E402
from harness.staging import coverage, wheel_lock  # noqa: E402
from harness.staging import stage as staging  # noqa: E402

LOCK = wheel_lock.load(NRL / "wheels.toml")


def _pyproject(tmp_path: Path, *deps: str) -> Path:
    path = tmp_path / "pyproject.toml"
    path.write_text("[project]\nname = 'nemo-rl'\ndependencies = [\n" + "".join(f"  {d!r},\n" for d in deps) + "]\n")
    return path


def _lock(**changes) -> wheel_lock.Lock:
    return dataclasses.replace(LOCK, **changes)


def test_each_unmet_dependency_is_named_and_each_met_or_waived_one_is_not(tmp_path):
    waived = (wheel_lock.Waiver("colored", "not imported"),)
    deps = ["zstandard",                       # staged, a [[wheel]]
            "torch==2.11.0",                   # the host's
            "onnx",                            # on the measured host list only (not in [dryrun])
            "colored==2.2.3",                  # waived
            "only-on-a-mac; sys_platform == 'darwin'",   # its marker leaves it out on the host
            "a-module-nobody-staged>=1",
            "torch>=2.12"]
    got = coverage.nrl_uncovered(_lock(nrl_without=waived), _pyproject(tmp_path, *deps), staging.HOST_PACKAGES)
    assert got == ["nemo-rl requires a-module-nobody-staged>=1: not staged ([[wheel]], [[sdist]], [[te]]), not on the "
                   "host (its measured list, [dryrun])",
                   "nemo-rl requires torch>=2.12: torch 2.11.0 is what the stage and host give"], got


def test_the_gpu_finding_is_found_here_and_a_waiver_nothing_asks_for_is_named(tmp_path):
    """Without the zstandard wheel, the stage names it (the GPU found it only when NeMo-RL's own test failed
    to import); a waiver that no dependency asks for waives nothing today and would hide one added later."""
    without = _lock(wheels=tuple(a for a in LOCK.wheels if a.name != "zstandard"), nrl_without=())
    assert coverage.nrl_uncovered(without, _pyproject(tmp_path, "zstandard"), staging.HOST_PACKAGES) == [
        "nemo-rl requires zstandard: not staged ([[wheel]], [[sdist]], [[te]]), not on the host (its measured list, "
        "[dryrun])"]
    stale = _lock(nrl_without=(wheel_lock.Waiver("colored", "not imported"),))
    assert coverage.nrl_uncovered(stale, _pyproject(tmp_path, "zstandard"), staging.HOST_PACKAGES) == [
        "[[nrl_without]] colored: no dependency NeMo-RL declares requires it"]
    with pytest.raises(ConfigError, match="the GPU host would lack what NeMo-RL declares"):
        coverage.check_nrl_covered(without, _pyproject(tmp_path, "zstandard"), staging.HOST_PACKAGES)


def test_bad_input_is_a_clear_error(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'nemo-rl'\n")
    with pytest.raises(ConfigError, match=r"no \[project\].dependencies list"):
        coverage.nrl_uncovered(LOCK, tmp_path / "pyproject.toml", staging.HOST_PACKAGES)
    with pytest.raises(ConfigError, match="cannot read NeMo-RL's declared dependencies"):
        coverage.nrl_uncovered(LOCK, tmp_path / "missing.toml", staging.HOST_PACKAGES)
    lock = tmp_path / "wheels.toml"
    lock.write_text((NRL / "wheels.toml").read_text().replace('[[nrl_without]]\nname = "colored"\nwhy = ',
                                                                '[[nrl_without]]\nname = "colored"\nnot_why = ', 1))
    with pytest.raises(ConfigError, match=r"\[nrl_without 0\] has an unknown key 'not_why'"):
        wheel_lock.load(lock)


def test_the_lock_writes_its_waivers_back_as_it_read_them():
    assert len(LOCK.nrl_without) >= 1 and all(w.why for w in LOCK.nrl_without)
    assert wheel_lock.render(LOCK) == (NRL / "wheels.toml").read_text()


DECLARED = ROOT / "integration" / "proofs" / "nemo-rl-dependencies.txt"


def _pin() -> str:
    from carry.series.manifest import load
    return load(ROOT / "patches" / "gtp").upstream("nemo-rl").git.commit


def _declared() -> list[str]:
    """The committed list of what NeMo-RL declares at the pin (its header names the commit)."""
    lines = DECLARED.read_text().splitlines()
    header = " ".join(ln for ln in lines if ln.startswith("#"))
    assert _pin() in header, f"{DECLARED.name}: not read at the series' NeMo-RL pin {_pin()}"
    return [ln for ln in lines if ln and not ln.startswith("#")]


def test_the_committed_lock_covers_every_dependency_nemo_rl_declares_at_the_pin(tmp_path):
    """On every run, no NeMo-RL checkout needed: what the pin declares (the committed list) is staged or on the
    measured host, or waived with why."""
    declared = _declared()
    assert "zstandard" in declared and len(declared) >= 40, declared
    assert coverage.nrl_uncovered(LOCK, _pyproject(tmp_path, *declared), staging.HOST_PACKAGES) == []


@pytest.mark.skipif(not os.environ.get("GTP_CARRY_TEST_NEMO_RL"),
                    reason="no NeMo-RL checkout: GTP_CARRY_TEST_NEMO_RL is unset (a checkout that has the pinned commit)")
def test_the_committed_list_is_what_nemo_rl_declares_at_the_pin(tmp_path):
    text = subprocess.run(["git", "show", f"{_pin()}:pyproject.toml"], cwd=os.environ["GTP_CARRY_TEST_NEMO_RL"],
                          capture_output=True, text=True, check=True).stdout
    (tmp_path / "pyproject.toml").write_text(text)
    assert coverage.declared_dependencies(tmp_path / "pyproject.toml") == _declared()
