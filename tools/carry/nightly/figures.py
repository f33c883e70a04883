"""The night as a picture: PNG figures next to summary.md (matplotlib, the optional extra ``[plot]``).

Over the history (one point per night, in the order the history has the nights):

- ``history-token-mult-prob-error.png``: each cell's ``*token_mult_prob_error`` metrics;
- ``history-gtp-memory.png``: GTP's memory ratios (``ratio_*_mib``: GTP over GTP off);
- ``history-step-time.png``: step times (``gtp_step_seconds``, ``off_step_seconds``, their ratio,
  NeMo-RL's ``timing/train/total_step_time``);
- ``history-proofs.png``: the proof cells passed / failed / skipped (vacuous, error) per night.

This night's GRPO cases (each cell that left NeMo-RL's metrics.json): ``grpo-<cell>.png``, per
step: reward, ``pct_mixed``, the advantages' range (min and max), entropy and
``token_mult_prob_error``; every case the cell ran (``<case>/metrics.json``, the GPU host's
harness) is a line of its own, so GTP off is drawn beside GTP on where both ran.

Each PNG carries what was drawn, read back from the figure's artists (the lines' labels and
points, the bars' heights), as JSON in its ``Description`` text chunk: a reader, and the tests,
can check the series without looking at pixels. ``note`` goes under every title (room for a
label such as a run's GPU mode). Without matplotlib nothing is drawn and summary.md says in one
line how to get the pictures.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Iterable

from ..shell import code
from . import artifacts

INSTALL = ("python3", "-m", "pip", "install", "-e", ".[plot]")
PROOF_STATUSES = ("passed", "failed", "skipped", "vacuous", "error")
_COLOURS = {"passed": "#3a923a", "failed": "#c03d3e", "skipped": "#9a9a9a", "vacuous": "#e1812c", "error": "#7f3c8d"}
GRPO_PANELS = (  # (title, metric keys drawn in it)
    ("reward", ("train/reward",)),
    ("pct_mixed", ("train/baseline_reward/pct_mixed",)),
    ("advantages (min, max)", ("train/advantages/min", "train/advantages/max")),
    ("entropy", ("train/approx_entropy",)),
    ("token_mult_prob_error", ("train/token_mult_prob_error",)),
)
_STEP_TIME = ("gtp_step_seconds", "off_step_seconds", "ratio_step_seconds", "timing/train/total_step_time")


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _nights(history: list[dict]) -> list[str]:
    return list(dict.fromkeys(str(r.get("run_id")) for r in history if r.get("run_id") is not None))


def _history_series(history: list[dict], wanted) -> dict[str, list[tuple[int, float]]]:
    """``cell: metric`` -> (night index, value) for each history metric ``wanted(key)`` accepts."""
    index = {n: i for i, n in enumerate(_nights(history))}
    out: dict[str, list[tuple[int, float]]] = {}
    for rec in history:
        for key, value in sorted((rec.get("metrics") or {}).items()):
            f = _number(value)
            if f is not None and wanted(key) and rec.get("run_id") is not None:
                out.setdefault(f"{rec.get('cell')}: {key}", []).append((index[str(rec['run_id'])], f))
    return out


def _is_proof(rec: dict) -> bool:
    return rec.get("kind") == "proof" if rec.get("kind") else "[" in str(rec.get("test", ""))


def _drawn(fig) -> dict:
    """What the figure shows, read back from its artists."""
    panels = []
    for ax in fig.axes:
        lines = {ln.get_label(): [[float(x), float(y)] for x, y in zip(ln.get_xdata(), ln.get_ydata())]
                 for ln in ax.get_lines() if not ln.get_label().startswith("_")}
        bars = {c.get_label(): [float(p.get_height()) for p in c.patches] for c in ax.containers}
        panels.append({"title": ax.get_title(), "lines": lines, "bars": bars})
    return {"title": fig.get_suptitle(), "panels": panels}


def _save(fig, path: Path) -> dict:
    drawn = _drawn(fig)
    fig.savefig(path, format="png", dpi=100, metadata={"Description": json.dumps(drawn, sort_keys=True),
                                                        "Software": "gtp-carry nightly"})
    return drawn


def _new(title: str, note: str, rows: int = 1, cols: int = 1, size=(10.0, 4.5)):
    from matplotlib.figure import Figure
    fig = Figure(figsize=size, layout="constrained")
    _fit_title(fig, title, note)
    axes = fig.subplots(rows, cols, squeeze=False)
    return fig, [ax for row in axes for ax in row]


def _fit_title(fig, title: str, note: str) -> None:
    """The title, and the note under it wrapped until every line fits the figure's width (a centred line
    wider than the figure is cut at both edges: the shared-GPU note was)."""
    import textwrap

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    width = fig.get_figwidth() * fig.dpi * 0.96
    text = fig.suptitle(title)
    for chars in range(max(len(note), 1), 9, -4):
        lines = [title] + (textwrap.wrap(note, chars) if note else [])
        text.set_text("\n".join(lines))
        if text.get_window_extent(renderer=canvas.get_renderer()).width <= width:
            return


def _night_axis(ax, nights: list[str]) -> None:
    step = max(1, len(nights) // 12)
    ax.set_xticks(range(0, len(nights), step))
    ax.set_xticklabels(nights[::step], rotation=30, ha="right", fontsize=7)
    ax.set_xlabel("night (run id)")


def _lines_over_nights(path: Path, title: str, ylabel: str, series: dict, nights: list[str], note: str) -> dict:
    fig, (ax,) = _new(title, note)
    for label, pts in series.items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    ax.set_title(ylabel)
    _night_axis(ax, nights)
    if series:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no night has this metric yet", ha="center", va="center", transform=ax.transAxes)
    return _save(fig, path)


def _proofs(path: Path, history: list[dict], nights: list[str], note: str) -> dict:
    counts = {s: [0] * len(nights) for s in PROOF_STATUSES}
    index = {n: i for i, n in enumerate(nights)}
    for rec in history:
        if _is_proof(rec) and rec.get("status") in counts and str(rec.get("run_id")) in index:
            counts[rec["status"]][index[str(rec["run_id"])]] += 1
    fig, (ax,) = _new("Proofs per night", note)
    bottom = [0] * len(nights)
    for status in PROOF_STATUSES:
        if status in ("passed", "failed", "skipped") or any(counts[status]):
            ax.bar(range(len(nights)), counts[status], bottom=bottom, label=status, color=_COLOURS[status])
            bottom = [b + c for b, c in zip(bottom, counts[status])]
    ax.set_title("proof cells by verdict")
    ax.set_ylabel("cells")
    _night_axis(ax, nights)
    ax.legend(fontsize=7)
    return _save(fig, path)


def _steps(value: Any) -> list[tuple[int, float]]:
    if not isinstance(value, dict):
        return []
    pts = []
    for step, v in value.items():
        f = _number(v)
        if f is not None and str(step).isdigit():
            pts.append((int(step), f))
    return sorted(pts)


def grpo_cases(cell_dir: Path) -> dict[str, dict]:
    """The GRPO metrics a cell left: label -> metrics document (``metrics.json``, and each case's
    ``<case>/metrics.json``; a GTP-off case is labelled so)."""
    found = {}
    candidates = [(cell_dir / "metrics.json", None)]
    try:
        candidates += [(d / "metrics.json", d.name) for d in sorted(cell_dir.iterdir())
                       if d.is_dir() and not d.is_symlink()]
    except OSError:
        pass
    for path, case in candidates:
        doc, _ = artifacts.read_metrics(path)
        if not doc or not any(k in doc for _, keys in GRPO_PANELS for k in keys):
            continue
        off = case is not None and re.search(r"gtp-?off", case) is not None
        found[f"GTP off ({case})" if off else (f"GTP on ({case})" if case else "GTP on")] = doc
    return found


def _grpo(path: Path, cell: str, cases: dict[str, dict], note: str) -> dict:
    fig, axes = _new(f"GRPO per step: {cell}", note, 2, 3, size=(13.0, 7.0))
    from matplotlib.ticker import MaxNLocator
    for ax, (title, keys) in zip(axes, GRPO_PANELS):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        drawn = False
        for label, doc in cases.items():
            for key in keys:
                pts = _steps(doc.get(key))
                if pts:
                    name = label if len(keys) == 1 else f"{label} {key.rsplit('/', 1)[-1]}"
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
                    drawn = True
        if drawn:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not in this run's metrics", ha="center", va="center", transform=ax.transAxes)
    axes[-1].axis("off")
    return _save(fig, path)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:120]


def write(out: Path, history: list[dict], runs: Iterable[dict], note: str = "") -> list[tuple[str, Path, dict]]:
    """Draw the figures into ``out``; (title, path, what was drawn) for each. Needs matplotlib."""
    nights = _nights(history)
    made = []
    tmpe = _history_series(history, lambda k: k.endswith("token_mult_prob_error"))
    memory = _history_series(history, lambda k: k.startswith("ratio_") and k.endswith("_mib"))
    step = _history_series(history, lambda k: k in _STEP_TIME)
    for name, title, ylabel, series in (
            ("history-token-mult-prob-error.png", "token_mult_prob_error per night", "token_mult_prob_error", tmpe),
            ("history-gtp-memory.png", "GTP's memory per night (ratio to GTP off)", "GTP / GTP off", memory),
            ("history-step-time.png", "Step time per night", "seconds (ratio: GTP / GTP off)", step)):
        made.append((title, out / name, _lines_over_nights(out / name, title, ylabel, series, nights, note)))
    made.append(("Proofs per night", out / "history-proofs.png", _proofs(out / "history-proofs.png", history,
                                                                          nights, note)))
    for r in runs:
        cases = grpo_cases(out / "cells" / r["cell"] / "artifacts")
        if cases:
            p = out / f"grpo-{_slug(r['cell'])}.png"
            made.append((f"GRPO per step: {r['cell']}", p, _grpo(p, r["cell"], cases, note)))
    return made


def summary_lines(out: Path, history: list[dict], runs: list[dict], note: str = "") -> list[str]:
    """The summary's figures section: the figures drawn and linked, or one line on how to get them."""
    if not available():
        return ["", f"Figures: not drawn (matplotlib is not installed): {code(*INSTALL)} draws them next to this summary."]
    made = write(out, history, runs, note)
    return ["", "## Figures", ""] + [f"![{title}]({path.name})" for title, path, _ in made]
