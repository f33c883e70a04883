"""Progress off a terminal: sent to a file or a CI log, long commands still say what they do.

Lines, not a spinner: one per phase (a base, an upstream's patches, a proof), one per patch,
and for a long step without phases (xz -9 of the ferry) one every so many seconds. stderr only:
stdout's table and --json stay clean. GTP_CARRY_QUIET=1 silences them (the README says so).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys

import pytest

from fakeup import GOOD, add_proofs
from helpers import ROOT, SERIES, TOOLS

NRL = ROOT / "integration" / "nemo_rl_gtp"


def _to_a_file(demo, tmp_path, name, *args, quiet=""):
    """Run a tool with stdout and stderr sent to files, as a CI job's log would have them."""
    out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
    with open(out, "w") as o, open(err, "w") as e:
        rc = subprocess.run([sys.executable, str(TOOLS / f"{name}.py"), *map(str, args)],
                            env=dict(os.environ, GTP_CARRY_QUIET=quiet), stdout=o, stderr=e, timeout=600).returncode
    return rc, out.read_text(), err.read_text()


def test_apply_and_prove_say_each_phase_in_a_log(demo, tmp_path):
    add_proofs(demo["series"], {"good": GOOD}, {"clean": "good"}, SERIES / "proofs" / "pytest.ini")
    rc, out, err = _to_a_file(demo, tmp_path, "apply", "--series", demo["series"], "--workdir", demo["work"],
                              "--cache", demo["cache"], "--source", f"megatron-lm={demo['up']}", "--only", "clean")
    assert rc == 0, out + err
    assert "megatron-lm: preparing pristine base" in err
    assert "megatron-lm: applying 1 patch(es)" in err
    assert "megatron-lm: clean: applied" in err
    assert "[" not in out.split("\n")[0] and "preparing" not in out  # the table stays clean
    rc, out, err = _to_a_file(demo, tmp_path, "prove", "--series", demo["series"], "--workdir", demo["work"],
                              "--only", "clean")
    assert rc == 0, out + err
    # What runs, then a line per proof as it finishes (runs may go side by side).
    assert "each on the pristine base and on the patched tree" in err, err
    assert "clean: proofs/megatron_lm/test_good.py: pristine fail, patched pass" in err, err


def test_quiet_silences_them(demo, tmp_path):
    rc, out, err = _to_a_file(demo, tmp_path, "apply", "--series", demo["series"], "--workdir", demo["work"],
                              "--cache", demo["cache"], "--source", f"megatron-lm={demo['up']}", quiet="1")
    assert rc == 0, out + err
    assert err == "" and "applied" in out


def test_a_long_compression_says_how_far_it_is(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GTP_CARRY_QUIET", "")
    sys.path.insert(0, str(NRL))
    from harness.staging.stage import compress

    src = tmp_path / "payload"
    src.mkdir()
    for i in range(8):
        (src / f"part{i}.bin").write_bytes(os.urandom(1 << 20))
    out = compress(src, tmp_path / "payload.tar.xz", every=0.05)
    err = capsys.readouterr().err
    assert out.exists()
    assert "compressing 8 MB with" in err
    assert "MB read" in err and "s so far" in err, err
    assert "compressing payload.tar.xz: done (8 of 8 MB read" in err, err


def test_the_payload_level_is_the_one_asked_for(tmp_path, capsys, monkeypatch):
    """stage --xz-level: the payload is packed at that preset (it says so), whole when unpacked, and
    preset 9 packs what preset 1 cannot (a block repeated beyond preset 1's 1 MiB dictionary, in reach
    of preset 9's 64 MiB: on a small text the two differ by header bytes, either way); a level
    outside 0-9 is refused before anything is written."""
    import lzma
    import tarfile

    monkeypatch.setenv("GTP_CARRY_QUIET", "")
    sys.path.insert(0, str(NRL))
    from carry.errors import UsageError
    from harness.staging.stage import compress

    src = tmp_path / "payload"
    src.mkdir()
    block = random.Random(1234).randbytes(1_200_000)
    (src / "a.bin").write_bytes(block * 2)
    out = compress(src, tmp_path / "p1.tar.xz", level=1)
    err = capsys.readouterr().err
    assert "with xz -1" in err or "with lzma preset 1" in err, err
    with lzma.open(out) as f, tarfile.open(fileobj=f) as tf:
        assert tf.extractfile("a.bin").read() == block * 2
    nine = compress(src, tmp_path / "p9.tar.xz", level=9)
    assert "with xz -9" in capsys.readouterr().err or shutil.which("xz") is None
    assert out.stat().st_size > 2_300_000 and nine.stat().st_size < 1_300_000, (out.stat().st_size, nine.stat().st_size)
    with pytest.raises(UsageError, match="xz level 12"):
        compress(src, tmp_path / "bad.tar.xz", level=12)
    assert not (tmp_path / "bad.tar.xz").exists() and not (tmp_path / "bad.tar.tmp").exists()


def test_lines_said_from_several_threads_stay_whole(monkeypatch):
    """Two sides of the upstream tests tick at once: each line must come out whole (the H200 console had
    '60 s so far[  63.7s] megatron-lm pristine ...' on one line and an empty one after it). The stream
    below lets another thread in between any two writes, as a busy pipe does."""
    import re
    import threading
    import time

    from carry import progress

    class Slow:
        def __init__(self):
            self.chunks = []

        def write(self, s):
            self.chunks.append(s)
            time.sleep(0.0002)   # another thread may write now
            return len(s)

        def flush(self):
            pass

    out = Slow()
    monkeypatch.setattr(progress.sys, "stderr", out)
    monkeypatch.setenv("GTP_CARRY_VERBOSE", "1")

    def talk(name):
        for i in range(40):
            progress.say(f"{name} line {i}")

    threads = [threading.Thread(target=talk, args=(f"side{k}",)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = "".join(out.chunks).split("\n")
    assert lines[-1] == "" and len(lines) == 161, len(lines)
    bad = [ln for ln in lines[:-1] if not re.fullmatch(r"\[ *\d+\.\ds\] side\d line \d+", ln)]
    assert not bad, bad[:3]
