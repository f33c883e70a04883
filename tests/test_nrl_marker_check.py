"""The marker check of the carried NeMo-RL functional test (nemo-rl/0004), read from the patch.

grpo_megatron_generation_gtp.sh gates its run on two log markers as well as on its metrics. It
must count a marker by the nightly's own rule (carry.nightly.runlog, "Lines"): a whole line printed by
the run that starts with it, after ANSI colours and one Ray worker prefix; not a quote of it
inside another message, which a failing run prints too. Each log below is run through the
script's own ``require_marker`` (bash, from the patch's text) and through carry.nightly.runlog.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from carry.nightly.runlog import markers_found
from helpers import SERIES

PATCH = SERIES / "nemo-rl" / "0004-functional-test-grpo-megatron-generation-gtp.patch"
SCRIPT = "tests/functional/grpo_megatron_generation_gtp.sh"
MARKER = "[gtp] enabling GTP weight rematerialization"


def _script_from_patch() -> str:
    """The new file's text: the '+' lines of its hunk."""
    text = PATCH.read_text()
    start = text.index(f"+++ b/{SCRIPT}\n")
    end = text.find("\ndiff --git ", start)
    body = text[start:end if end != -1 else len(text)].splitlines()[1:]
    return "\n".join(line[1:] for line in body if line.startswith("+")) + "\n"


def _require_marker_function() -> str:
    m = re.search(r"^require_marker\(\) \{.*?^\}\n", _script_from_patch(), re.M | re.S)
    assert m, "no require_marker() in the patch's script"
    return m.group(0)


LOGS = {
    "a plain line": (f"{MARKER} (gtp_remat_size=2 expert_gtp_remat_size=1)\n", True),
    "a Ray worker's line": (f"(MegatronPolicyWorker[rank=0] pid=4242) {MARKER} (gtp_remat_size=2)\n", True),
    "coloured, Ray prefix with ip": (f"\x1b[36m(pid=77, ip=10.0.0.3)\x1b[0m {MARKER}\n", True),
    "quoted in an error": (f"ERROR: never saw '{MARKER}' in the worker log\n", False),
    "after a logging prefix": (f"INFO:nemo_rl:{MARKER}\n", False),
    "indented": (f"    {MARKER}\n", False),
    "absent": ("step 1 done\n", False),
}


@pytest.mark.parametrize("case", list(LOGS))
def test_the_scripts_marker_check_is_the_nightlys(case, tmp_path):
    text, counts = LOGS[case]
    assert markers_found(text, [MARKER])[MARKER] is counts  # the nightly's rule
    log = tmp_path / "run.log"
    log.write_text("noise before\n" + text + "noise after\n")
    prog = f'run_log={str(log)!r}\n{_require_marker_function()}require_marker "{MARKER}" "training ran without GTP"\n'
    res = subprocess.run(["bash", "-c", prog], capture_output=True, text=True, timeout=60)
    assert (res.returncode == 0) is counts, (case, res.returncode, res.stdout, res.stderr)
    if not counts:
        assert f"starts with '{MARKER}'" in res.stdout and "training ran without GTP" in res.stdout
