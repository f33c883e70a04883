"""The night as a picture (issue 34, part 3): carry.nightly.figures over the committed history
(tests/nightly-history) and the committed H200 GRPO runs, and tools/nightly.py writing the figures
next to summary.md, or one line on how to get them when matplotlib is not there.

Each PNG is checked as a file (signature, IHDR, CRC of every chunk) and for what it shows: the
series read back from the figure's artists, which it carries in its Description text chunk."""

from __future__ import annotations

import json
import shutil
import struct
import zlib
from pathlib import Path

import pytest

from helpers import ROOT, proofs_matrix, read_json, tool

FIXTURE = Path(__file__).parent / "nightly-history"
H200 = ROOT / "integration" / "nemo_rl_gtp" / "h200"
GRPO_CELL = "gtp--gpu-host--grpo-megatron-generation-gtp"


def png(path: Path) -> tuple[int, int, dict]:
    """(width, height, what was drawn) of a PNG, every chunk's CRC checked."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    at, chunks, text = 8, [], {}
    while at < len(data):
        (size,), kind = struct.unpack(">I", data[at:at + 4]), data[at + 4:at + 8]
        body, crc = data[at + 8:at + 8 + size], struct.unpack(">I", data[at + 8 + size:at + 12 + size])[0]
        assert zlib.crc32(kind + body) == crc, f"{path.name}: bad CRC in {kind!r}"
        chunks.append(kind)
        if kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            text[key.decode("latin-1")] = value.decode("latin-1")
        at += 12 + size
    assert chunks[0] == b"IHDR" and chunks[-1] == b"IEND" and b"IDAT" in chunks, chunks
    width, height = struct.unpack(">II", data[16:24])
    assert width > 0 and height > 0
    return width, height, json.loads(text["Description"])


def history() -> list[dict]:
    return [json.loads(line) for line in (FIXTURE / "history.jsonl").read_text().splitlines()]


def grpo_out(tmp_path: Path) -> Path:
    """An OUT whose GRPO cell ran two harness cases (OUT/<case>/metrics.json): GTP on and GTP off."""
    out = tmp_path / "out"
    for case, stem in (("patched", "11-nightly-patched"), ("gtp-off", "12-gtp-off")):
        d = out / "cells" / GRPO_CELL / "artifacts" / case
        d.mkdir(parents=True)
        shutil.copy(H200 / f"{stem}.metrics.json", d / "metrics.json")
    return out


def test_each_figure_is_a_png_with_the_series_of_the_committed_history(tmp_path):
    from carry.nightly import figures
    out = grpo_out(tmp_path)
    made = figures.write(out, history(), [{"cell": GRPO_CELL}])
    by_name = {path.name: drawn for _, path, drawn in made}
    assert sorted(by_name) == ["grpo-gtp--gpu-host--grpo-megatron-generation-gtp.png", "history-gtp-memory.png",
                               "history-proofs.png", "history-step-time.png", "history-token-mult-prob-error.png"]
    for _, path, drawn in made:
        width, height, shown = png(path)
        assert shown == drawn, path.name  # the file carries what the artists drew
        assert (width, height) == ((1300, 700) if path.name.startswith("grpo-") else (1000, 450)), path.name
    cost = "gtp--host--gtp-refit-mini-cost"
    (tmpe,) = by_name["history-token-mult-prob-error.png"]["panels"]
    assert tmpe["lines"][f"{cost}: token_mult_prob_error"] == [[0, 1.0009940713644028], [1, 1.0011], [2, 1.0008]]
    assert sorted(tmpe["lines"]) == [f"{GRPO_CELL}: train/token_mult_prob_error", f"{cost}: ckpt_token_mult_prob_error",
                                     f"{cost}: token_mult_prob_error", "gtp--host--gtp-refit-mini-gloo: token_mult_prob_error"]
    (mem,) = by_name["history-gtp-memory.png"]["panels"]
    assert mem["lines"] == {f"{cost}: ratio_peak_mib": [[0, 0.9639938621588356], [1, 0.9641], [2, 0.8103], [3, 0.8099]],
                            f"{cost}: ratio_train_state_mib": [[0, 0.9315609410053171], [1, 0.9316], [2, 0.7502],
                                                               [3, 0.7501]]}
    (step,) = by_name["history-step-time.png"]["panels"]
    assert sorted(step["lines"]) == [f"{GRPO_CELL}: timing/train/total_step_time", f"{cost}: gtp_step_seconds",
                                     f"{cost}: off_step_seconds", f"{cost}: ratio_step_seconds"]
    (proofs,) = by_name["history-proofs.png"]["panels"]
    assert proofs["bars"] == {"passed": [4, 3, 3, 4], "failed": [0, 1, 0, 0], "skipped": [1, 1, 1, 1],
                              "vacuous": [0, 0, 1, 0]}
    grpo = {p["title"]: p["lines"] for p in by_name["grpo-gtp--gpu-host--grpo-megatron-generation-gtp.png"]["panels"]}
    on = json.loads((H200 / "11-nightly-patched.metrics.json").read_text())
    off = json.loads((H200 / "12-gtp-off.metrics.json").read_text())
    for title, key in (("reward", "train/reward"), ("pct_mixed", "train/baseline_reward/pct_mixed"),
                       ("entropy", "train/approx_entropy"), ("token_mult_prob_error", "train/token_mult_prob_error")):
        assert grpo[title] == {"GTP on (patched)": [[int(s), v] for s, v in sorted(on[key].items())],
                               "GTP off (gtp-off)": [[int(s), v] for s, v in sorted(off[key].items())]}, title
    assert sorted(grpo["advantages (min, max)"]) == ["GTP off (gtp-off) max", "GTP off (gtp-off) min",
                                                     "GTP on (patched) max", "GTP on (patched) min"]
    assert grpo["advantages (min, max)"]["GTP on (patched) min"] == [
        [int(s), v] for s, v in sorted(on["train/advantages/min"].items())]


# A command cell that leaves what the GPU host's harness leaves for two cases: OUT/<case>/metrics.json.
TWO_CASES = r'''
import json, os, sys
out = sys.argv[1]
for case, reward in (("patched", 0.5), ("gtp-off", 0.45)):
    os.makedirs(os.path.join(out, case))
    json.dump({"train/reward": {"1": reward, "2": reward + 0.1}, "train/token_mult_prob_error": {"1": 1.01, "2": 1.02},
               "train/baseline_reward/pct_mixed": {"1": 0.5, "2": 0.75}, "train/approx_entropy": {"1": 0.3, "2": 0.29},
               "train/advantages/min": {"1": -0.4, "2": -0.5}, "train/advantages/max": {"1": 0.4, "2": 0.5}},
              open(os.path.join(out, case, "metrics.json"), "w"))
print("[gtp] enabling GTP weight rematerialization (gtp_remat_size=2)")
'''


def _night(demo, tmp_path: Path, name: str, env: dict | None = None) -> Path:
    script = tmp_path / "two_cases.py"
    script.write_text(TWO_CASES)
    config = tmp_path / "nightly.toml"
    config.write_text(proofs_matrix(str(demo["series"])) + f'''
[[tests]]
name = "grpo-two-cases"
kind = "command"
images = ["host"]
argv = ["{{python}}", {json.dumps(str(script))}, "{{out}}"]
metrics = "file:patched/metrics.json"
gates = ['max(data["train/token_mult_prob_error"]) < 1.05']
markers = ["[gtp] enabling GTP weight rematerialization"]
steps = 2
''')
    hist = tmp_path / f"{name}.jsonl"
    shutil.copy(FIXTURE / "history.jsonl", hist)
    out = tmp_path / name
    tool("nightly", "--config", config, "--out", out, "--workdir", tmp_path / "nwork", "--cache", demo["cache"],
         "--source", f"megatron-lm={demo['up']}", "--history", hist, "--tests", "grpo-two-cases",
         "--run-id", name, "--seed", "7", env=env, check=0, timeout=600)
    return out


def test_a_nightly_on_the_committed_history_writes_the_figures_next_to_its_summary(demo, tmp_path):
    out = _night(demo, tmp_path, "night-5")
    md = (out / "summary.md").read_text()
    links = [line for line in md.splitlines() if line.startswith("![")]
    assert len(links) == 5 and "## Figures" in md, md
    for line in links:
        target = line[line.index("](") + 2:-1]
        png(out / target)
    _, _, proofs = png(out / "history-proofs.png")
    assert len(proofs["panels"][0]["bars"]["passed"]) == 5  # the four committed nights and tonight
    _, _, grpo = png(out / "grpo-demo--host--grpo-two-cases.png")
    reward = {p["title"]: p["lines"] for p in grpo["panels"]}["reward"]
    assert reward == {"GTP on (patched)": [[1, 0.5], [2, 0.6]], "GTP off (gtp-off)": [[1, 0.45], [2, 0.55]]}


def test_without_matplotlib_the_summary_says_how_to_get_the_pictures_and_nothing_else_changes(demo, tmp_path):
    from carry.nightly.figures import INSTALL
    block = tmp_path / "no-matplotlib"
    (block / "matplotlib").mkdir(parents=True)
    (block / "matplotlib" / "__init__.py").write_text("raise ImportError('matplotlib is blocked for this test')\n")
    import os
    plain = _night(demo, tmp_path, "with")
    bare = _night(demo, tmp_path, "without", env={"PYTHONPATH": f"{block}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert not list(bare.glob("*.png")) and list(plain.glob("*.png"))
    md = (bare / "summary.md").read_text().splitlines()
    (line,) = [x for x in md if "Figures" in x or "matplotlib" in x]
    assert line == ("Figures: not drawn (matplotlib is not installed): `python3 -m pip install -e '.[plot]'` draws them "
                    "next to this summary.") and INSTALL[-1] == ".[plot]"
    with_md = (plain / "summary.md").read_text()
    assert with_md[:with_md.index("\n## Figures")].rstrip("\n").replace("with", "without") == "\n".join(md[:-2]), md
    assert read_json(bare / "nightly.json")["ok"] is read_json(plain / "nightly.json")["ok"] is True


@pytest.mark.parametrize("name", ["history-proofs.png"])
def test_the_figures_tolerate_an_empty_history(tmp_path, name):
    from carry.nightly import figures
    made = {p.name: d for _, p, d in figures.write(tmp_path, [], [])}
    _, _, drawn = png(tmp_path / name)
    assert drawn == made[name]


@pytest.mark.parametrize("size", [(10.0, 4.5), (13.0, 7.0)])
def test_a_long_note_under_the_title_is_wrapped_not_cut(size):
    """The shared-GPU note is wider than a figure: drawn on one centred line it was cut at both edges. Every
    line of the title must lie inside the figure, and no word of the note may be lost."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from carry.nightly import figures, gpus
    note = gpus.TIMING_NOTE
    fig, _ = figures._new("GRPO per step: gtp--gpu-host--grpo-megatron-generation-gtp-learning", note, size=size)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    box = fig._suptitle.get_window_extent(renderer=canvas.get_renderer())
    assert 0 <= box.x0 and box.x1 <= fig.get_figwidth() * fig.dpi, (box, fig._suptitle.get_text())
    assert fig._suptitle.get_text().split() == ("GRPO per step: gtp--gpu-host--grpo-megatron-generation-gtp-learning "
                                                + note).split()
