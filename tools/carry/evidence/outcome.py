"""A proof run's outcome, read from what its pytest left (carry.evidence.prove runs it): JUnit XML, and the
events carry_proof_plugin wrote (a body started; each exception, its phase and kind). The classes are the
module docstring's of carry.evidence.prove: pass, fail (a test body ran and failed), skipped, error.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Outcome:
    result: str          # pass | fail | skipped | error (the environment: see the module's docstring)
    detail: str = ""
    seconds: float = 0.0
    failures: list[list[str]] = field(default_factory=list)   # [test id, "Type: message"] per failed body
    via: str = ""        # "zygote" (forked from it) or "fresh" (an interpreter of its own): how the run started


def events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line torn by a killed interpreter
    return out


_ERROR_LINE = re.compile(r"^\s*(?:E\s+)?([A-Za-z_.]*(?:Error|Exception|Failed|Interrupted)\b.*)$")


def _headline(text: str) -> str:
    """The most telling line of a failure: the innermost 'SomethingError: ...' (a rank's own)."""
    hits = [m.group(1).strip() for line in text.splitlines() if (m := _ERROR_LINE.match(line))]
    hits = [h for h in hits if not h.endswith("failed:")] or hits
    if hits:
        return hits[-1][:300]
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return lines[0][:300] if lines else ""


def classify(rc: int | None, xml: Path, output: str, secs: float, events: list[dict] = ()) -> Outcome:
    """``rc`` None: the run did not finish (``output`` says why)."""
    environment = [e for e in events if e.get("event") == "error" and e.get("kind") == "environment"]
    if environment:
        e = environment[0]
        return Outcome("error", f"environment ({e.get('phase')} of {e.get('nodeid') or 'the proof'}): "
                                f"{e.get('reason')}", secs)
    bodies = [e["nodeid"] for e in events if e.get("event") == "body"]
    # A red is a test body that ran and failed: an exception of the call phase. One of collection (an
    # import the pristine base lacks, a name only the patch adds), of setup or teardown (a fixture)
    # never met the bug: it is no red.
    called = [e for e in events if e.get("event") == "error" and e.get("phase") == "call"]
    before = [e for e in events if e.get("event") == "error" and e.get("phase") != "call"]
    tail = " | ".join(output.strip().splitlines()[-3:])[-400:]
    if rc is None or not xml.exists():
        what = output if rc is None else f"the interpreter exited {rc} without a report: {tail}"
        if bodies:  # it died or hung in a test body: that body's result
            return Outcome("fail", f"{what} (in {bodies[-1]})", secs)
        return Outcome("error", f"environment: no test body ran: {what}", secs)
    tests = failed = skipped = 0
    first_failure = skip_note = ""
    for case in ET.parse(xml).getroot().iter("testcase"):
        tests += 1
        for child in case:
            line = _headline((child.get("message") or "") + "\n" + (child.text or "")) or child.tag
            if child.tag in ("failure", "error"):
                failed += 1
                first_failure = first_failure or line
            elif child.tag == "skipped":
                skipped += 1
                skip_note = skip_note or line
    if rc == 0 and tests and skipped == tests:
        return Outcome("skipped", skip_note or "all tests skipped", secs)
    if rc == 0 and tests > skipped:
        return Outcome("pass", f"{tests - skipped} passed" + (f", {skipped} skipped" if skipped else ""), secs)
    if rc in (1, 2) and failed and called:
        # The detail is the first body's failure (JUnit's first may be another test's fixture error).
        return Outcome("fail", str(called[0].get("reason") or first_failure)[:300], secs,
                       [[str(e.get("nodeid") or ""), str(e.get("reason") or "")] for e in called])
    if rc in (1, 2) and failed:
        e = before[0] if before else {}
        return Outcome("error", f"no test body failed: a {e.get('phase') or 'collection'} error of "
                                f"{e.get('nodeid') or 'the proof'} ({e.get('reason') or first_failure}) says nothing "
                                "of the bug", secs)
    return Outcome("error", f"environment: pytest exited {rc}: {tail}", secs)
