"""What a nightly leaves behind: per-run JSON, JUnit XML, a markdown summary, history.

History is a JSON-lines file, one line per run of a matrix cell, appended and
never rewritten: it is how a metric that repeats bit-identically from one
night to the next gets noticed.
"""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Iterable

from ..files import json_text
from ..lock import holding
from .judge import STATUSES as JUDGED

# carry.nightly.run adds "error": a proof that could not run on this host (its environment).
STATUSES = tuple(dict.fromkeys((*JUDGED, "error")))
ICONS = {"passed": "passed", "failed": "FAILED", "skipped": "skipped", "vacuous": "VACUOUS", "error": "ERROR"}


# -- history ---------------------------------------------------------------------------------
def read_history(path: Path) -> tuple[list[dict], list[str]]:
    """The history's records, and a warning (``FILE:LINE: what``) for each line skipped.

    A line that is not valid UTF-8, not valid JSON, not a JSON object, or whose ``metrics`` is
    not an object is skipped, never fatal: a torn last line (a killed run), a bad merge or a
    disk error must not stop every later night, nor lose the night that reads it.
    """
    if not path.exists():
        return [], []
    with open(path, "rb") as f, holding(f, path, shared=True):  # not a line another night is writing
        data = f.read()
    out, warnings = [], []
    for n, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        problem = None
        try:
            rec = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            problem = f"not UTF-8 ({exc.reason} at byte {exc.start})"
        except ValueError as exc:
            problem = f"not valid JSON ({exc})"
        else:
            if not isinstance(rec, dict):
                problem = f"not a JSON object ({_json_kind(rec)})"
            elif not isinstance(rec.get("metrics") or {}, dict):
                problem = f"its metrics are not a JSON object ({_json_kind(rec['metrics'])})"
        if problem:
            warnings.append(f"{path}:{n}: {problem}; line skipped")
        else:
            out.append(rec)
    return out, warnings


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array",
            dict: "an object"}.get(type(value), type(value).__name__)


def previous_run(history: list[dict], cell: str, run_id: str) -> dict | None:
    """The latest earlier record of a cell that has metrics."""
    for rec in reversed(history):
        if rec.get("cell") == cell and rec.get("run_id") != run_id and rec.get("metrics"):
            return rec
    return None


def append_history(path: Path, records: Iterable[dict]) -> None:
    """Tonight's records, appended under the history's lock: two nights on one history (a job
    submitted again while the first runs) each add whole lines, and neither's check for a torn
    last line reads the other's half-written one. Append mode alone is not enough: a write is cut
    into pieces, and on NFS, where such histories live, appends are not atomic at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json_text(rec, sort_keys=True) + "\n" for rec in records).encode("utf-8")
    with open(path, "a+b") as f, holding(f, path):
        size = os.fstat(f.fileno()).st_size
        if size and os.pread(f.fileno(), 1, size - 1) != b"\n":
            text = b"\n" + text  # end the torn line, so that tonight's first record is a line of its own
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def history_record(run: dict) -> dict:
    keep = ("run_id", "time", "cell", "series", "image", "test", "kind", "launcher", "status", "reason", "bug",
            "metrics", "flags", "seconds", "digest", "gpu_mode")
    rec = {k: run.get(k) for k in keep}
    if run.get("bisect"):
        rec["first_patch"] = run["bisect"].get("first_patch")
    return rec


# -- JUnit -----------------------------------------------------------------------------------
def junit(runs: list[dict], name: str = "gtp-carry-nightly") -> str:
    suite = ET.Element("testsuite", name=name, tests=str(len(runs)),
                       failures=str(sum(r["status"] in ("failed", "vacuous") for r in runs)),
                       skipped=str(sum(r["status"] == "skipped" for r in runs)),
                       errors=str(sum(r["status"] == "error" for r in runs)),
                       time=f"{sum(r.get('seconds') or 0 for r in runs):.1f}")
    for r in runs:
        case = ET.SubElement(suite, "testcase", classname=f"{r['series']}.{r['image']}", name=r["test"],
                             time=f"{r.get('seconds') or 0:.1f}")
        props = ET.SubElement(case, "properties")
        for key, value in sorted((r.get("metrics") or {}).items()):
            ET.SubElement(props, "property", name=f"metric.{key}", value=repr(value))
        for flag in r.get("flags") or []:
            ET.SubElement(props, "property", name="flag", value=flag)
        if r["status"] == "skipped":
            ET.SubElement(case, "skipped", message=r.get("reason") or "skipped")
        elif r["status"] in ("failed", "vacuous"):
            el = ET.SubElement(case, "failure", type=r["status"], message=(r.get("reason") or r["status"])[:500])
            body = list(r.get("tail") or [])
            if r.get("bisect"):
                body.append(f"bisect: {r['bisect'].get('note')}")
            el.text = "\n".join(body)
        elif r["status"] == "error":
            ET.SubElement(case, "error", type="environment", message=(r.get("reason") or "error")[:500])
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


# -- markdown --------------------------------------------------------------------------------
# GTP's cost against GTP off (gtp_refit_mini --compare-gtp-off): per rank, the worst rank of each arm.
COST_ROWS = (("setup_mib", "params + grads (MiB)", False), ("train_state_mib", "+ optimiser state (MiB)", False),
             ("peak_mib", "peak (MiB)", False), ("step_seconds", "step (s)", True),
             ("refit_seconds", "refit (s)", True), ("refit_bytes_received", "refit bytes received", False))


def cost_section(runs: list[dict]) -> list[str]:
    """One table per cell that measured both arms; a time measured in the shared-GPU mode says so."""
    out: list[str] = []
    for r in runs:
        m = r.get("metrics") or {}
        if not any(isinstance(m.get(f"ratio_{k}"), (int, float)) for k, _, _ in COST_ROWS):
            continue
        shared = r.get("gpu_mode") == "shared-gpu"
        out += ["", f"## GTP's cost: `{r['cell']}`", "", "| per rank | GTP | GTP off | ratio |",
                "| --- | --- | --- | --- |"]
        for key, label, is_time in COST_ROWS:
            gtp, off, ratio = m.get(f"gtp_{key}"), m.get(f"off_{key}"), m.get(f"ratio_{key}")
            if not isinstance(gtp, (int, float)):
                continue
            mark = " (shared-GPU: not GTP's price)" if is_time and shared else ""
            out.append(f"| {label}{mark} | {gtp:.6g} | {_num(off)} | {_num(ratio, 4)} |")
        if shared:
            out.append("")
            out.append(f"{r.get('timing_note') or 'shared-gpu'}.")
    return out


def _num(value: Any, digits: int = 6) -> str:
    return f"{value:.{digits}g}" if isinstance(value, (int, float)) else "-"


def _cell(text: Any, limit: int = 160) -> str:
    s = " ".join(str(text).split())
    s = s if len(s) <= limit else s[: limit - 3] + "..."
    return s.replace("|", "\\|")


def _metrics(r: dict, keys: Iterable[str]) -> str:
    m = r.get("metrics") or {}
    shown = [f"{k}={m[k]:.10g}" for k in keys if isinstance(m.get(k), (int, float))]
    return ", ".join(shown)


def summary(runs: list[dict], run_id: str, header: dict[str, Any], warnings: Iterable[str] = ()) -> str:
    counts = {s: sum(r["status"] == s for r in runs) for s in STATUSES}
    verdict = "FAILED" if counts["failed"] or counts["vacuous"] or counts["error"] else "ok"
    lines = [f"# Nightly {run_id}: {verdict}", ""]
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()))
    for key, value in header.items():
        lines.append(f"- {key}: {value}")
    lines += ["", "| series | image | test | status | metrics | reason |", "| --- | --- | --- | --- | --- | --- |"]
    for r in runs:
        lines.append(f"| {r['series']} | {r['image']} | {r['test']} | {ICONS[r['status']]} | "
                     f"{_cell(_metrics(r, r.get('watched') or []) or '-')} | {_cell(r.get('reason') or '')} |")
    lines += cost_section(runs)
    warnings = list(warnings)
    if warnings:
        lines += ["", "## History warnings", ""]
        lines += [f"- {_cell(w, 300)}" for w in warnings]
    flagged = [(r, f) for r in runs for f in r.get("flags") or []]
    if flagged:
        lines += ["", "## Flags", ""]
        lines += [f"- `{r['cell']}`: {_cell(f, 300)}" for r, f in flagged]
    bisected = [r for r in runs if r.get("bisect")]
    if bisected:
        lines += ["", "## Bisection", ""]
        for r in bisected:
            b = r["bisect"]
            lines.append(f"- `{r['cell']}`: {_cell(b.get('note'), 400)}")
            for p in b.get("probes", []):
                lines.append(f"  - k={p['k']} ({p['last_patch'] or 'pristine'}): {p['status']} "
                             f"{_cell(p['reason'], 200)}")
    bad = [r for r in runs if r["status"] in ("failed", "vacuous") and r.get("tail")]
    if bad:
        lines += ["", "## Last log lines of what did not pass", ""]
        for r in bad:
            lines += [f"### {r['cell']}", "", "```", *r["tail"][-15:], "```", ""]
    return "\n".join(lines).rstrip() + "\n"
