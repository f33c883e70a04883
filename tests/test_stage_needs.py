"""stage without the test extra: one clear error naming what to install (before: a download of
61 wheels, then a traceback, ModuleNotFoundError: tokenizers)."""

from __future__ import annotations

import subprocess
import sys

from helpers import ROOT


def test_stage_without_the_test_extra_names_what_to_install(tmp_path):
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    res = subprocess.run([str(py), "integration/nemo_rl_gtp/stage", "--no-pack", "--cache", str(tmp_path / "cache")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and "downloading" not in res.stderr, res.stderr
    assert "stage needs pip, tokenizers, transformers, packaging" in res.stderr, res.stderr
    assert f"{py} -m pip install -e" in res.stderr and "[test]" in res.stderr, res.stderr
    assert not (tmp_path / "cache").exists()


FORBIDDEN = ("shared/gpu", "/tmp/site", "$OUT", "device call", "call: carry")


def test_stage_speaks_of_the_users_gpu_host_only():
    """stage's --help and the lines it ends with name what to copy to the user's GPU host and what
    to run there, never this repository's own test machines."""
    import sys as _sys

    _sys.path.insert(0, str(ROOT / "integration" / "nemo_rl_gtp"))
    from harness.cli import stage_next

    res = subprocess.run([sys.executable, "integration/nemo_rl_gtp/stage", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    parts = [str(ROOT / ".ferry" / f"nrl.part{i}") for i in range(3)]
    lines = stage_next({"parts": parts, "part_mb": [52, 52, 27], "payload_mb": 131.3})
    for text in (res.stdout, *lines):
        for words in FORBIDDEN:
            assert words not in text, (words, text)
    assert "copy this repository there with its .ferry/ folder" in lines[1]
    assert "TransformerEngine >= 2.19" in lines[1] and "`bash .ferry/recv.sh nrl /tmp/nrl`" in lines[1]
    assert "TransformerEngine >= 2.19" in res.stdout
    # with --tests-source: the tests ferry's line, what to run there, before the closing line
    tests = stage_next({"parts": parts, "part_mb": [52, 52, 27], "payload_mb": 131.3,
                        "tests_parts": [str(ROOT / ".ferry" / "tests.part00")], "tests_mb": 9.5,
                        "tests_upstreams": ["megatron-bridge", "megatron-lm"]})
    for text in tests:
        for words in FORBIDDEN:
            assert words not in text, (words, text)
    assert tests[1].startswith("ferry tests: megatron-bridge, megatron-lm's own unit tests, 9.5 MB in 1 part(s)"), tests
    assert "`bash .ferry/recv.sh tests DIR`" in tests[1] and "--tests-source NAME=FOLDER" in tests[1], tests
    assert tests[2] == lines[1] and "--tests-source" in res.stdout
