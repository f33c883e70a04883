"""The carry's own CI on every pull request (.github/workflows/checks.yml): lint, export --check
and the README's test command. Its lint step runs here as written."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import yaml

from helpers import ROOT

WORKFLOW = ROOT / ".github" / "workflows" / "checks.yml"


def _steps() -> dict[str, str]:
    doc = yaml.safe_load(WORKFLOW.read_text())
    triggers = doc.get("on", doc.get(True))  # YAML 1.1 reads the key `on` as true
    assert "pull_request" in triggers, triggers
    (job,) = doc["jobs"].values()
    return {step["name"]: step["run"] for step in job["steps"] if "run" in step}


def test_the_checks_run_on_pull_requests_with_lint_export_check_and_the_readme_tests():
    steps = _steps()
    assert "tools/lint.py" in steps["Lint"] and "ruff check" in steps["Lint"]
    export = steps["Export check (the patch files are what their workspaces export)"]
    assert "tools/apply.py" in export and re.search(r"tools/export\.py .*--check", export)
    readme = (ROOT / "README.md").read_text()
    (tests_cmd,) = re.findall(r"(?ms)^## Tests\n\n```\n(.*?)\n```", readme)
    assert steps["Tests (the README's command)"].strip() == tests_cmd.replace("python3 ", "python ", 1)
    setup = steps["Setup (the README's command)"]
    assert "pip install -e '.[test]'" in setup and "pip install -e '.[test]'" in readme


def test_the_lint_step_passes_here():
    for line in _steps()["Lint"].strip().splitlines():
        argv = shlex.split(line)
        assert argv[0] == "python"
        res = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, line + "\n" + res.stdout + res.stderr
