"""The nightly on a real Slurm: integration/slurm/nightly.sbatch submitted as a user submits it
(``sbatch --wait``, from the repository root) to a one-node cluster started for these tests
(tests/minislurm.py: slurmctld and slurmd on localhost, CPUs only), on the demo series.

Its cells that need no container run as job steps of the job (the step's id in run.json): the
commands, each run of a proof (patched, pristine, a bisection's probe) and the upstream-tests
cells, judged as on this machine; the job's exit status is the night's. A cell that exits 1, a
cell that hangs past its timeout (its step cancelled, nothing of it left running), a proof that
is red/green and ones that are not, ``scancel`` of the whole job (the night's files say what was
done and what was not; the next night runs), two nights at once on one GTP_NIGHTLY_ROOT (the
history and the canary's mains taken in turns), and a night with container cells on a Slurm
without pyxis (one line, before anything runs).
"""

from __future__ import annotations

import fcntl
import json
import shlex
import subprocess
import time
from pathlib import Path

import pytest

import minislurm
from carry.nightly.slurm import step_id
from carry.git import Git
from fakeup import CRASH, GOOD, REGRESS, VACUOUS, add_proofs, write
from helpers import ROOT, SERIES, python_env, read_json, tool

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
SBATCH = "integration/slurm/nightly.sbatch"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    why = minislurm.problem()
    if why:
        pytest.skip(f"no Slurm here: {why}")
    cluster = minislurm.Cluster(tmp_path_factory.mktemp("slurm"))
    why = cluster.start()
    if why:
        cluster.stop()
        pytest.skip(f"the one-node Slurm did not start: {why}")
    yield cluster
    cluster.stop()


SUBMITTED: list["Job"] = []


@pytest.fixture(autouse=True)
def _no_job_left(slurm):
    """A test that fails midway leaves no job behind for the next one (nor an sbatch --wait)."""
    yield
    if slurm.jobs():
        slurm.run("scancel", *slurm.jobs(), check=False)
        until("the jobs left are gone", lambda: not slurm.jobs(), timeout=90)
    while SUBMITTED:
        job = SUBMITTED.pop()
        if job.proc.poll() is None:
            job.proc.kill()
            job.proc.wait()


def matrix(d: dict, tests: str, proofs: bool = True) -> Path:
    """A matrix on the demo series: its proofs cell (the 'clean' patch's), then ``tests``; the
    canary's mains (the sbatch fetches all three) are the demo upstream."""
    up = json.dumps(str(d["up"]))
    config = d["tmp"] / "nightly.toml"
    config.write_text(f"""
[nightly]
series = [{json.dumps(str(d['series']))}]
timeout_s = 300

[canary]
mains = {{ megatron-lm = {up}, megatron-bridge = {up}, nemo-rl = {up} }}

[images.host]
launcher = "local"
""" + ("""
[[tests]]
name = "proofs"
kind = "proof"
images = ["host"]
timeout_s = 120
""" if proofs else "") + tests)
    return config


def command(name: str, argv: list[str], marker: str, timeout: int = 120, env: str = "") -> str:
    return f"""
[[tests]]
name = "{name}"
kind = "command"
images = ["host"]
argv = {json.dumps(argv)}
{env}
markers = [{json.dumps(marker)}]
timeout_s = {timeout}
"""


# A command whose result depends on tonight's tree: PYTHONPATH goes through srun's --export=ALL.
OK = command("ok", ["{python}", "-c", "import megatron.core.alpha as a; print('alpha.value_5 is', a.value_5)"],
             "alpha.value_5 is patched", env='env = { PYTHONPATH = "{tree:megatron-lm}" }')


def readme_lines() -> list[str]:
    """The sbatch lines of integration/README.md's Slurm section, as a user copies them."""
    text = (ROOT / "integration" / "README.md").read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith(("sbatch ", "GTP_TE219_SQUASHFS=<path>.sqsh sbatch "))]
    assert len(lines) == 2 and all(f" {SBATCH}" in ln for ln in lines), lines
    return lines


def readme_argv(which: int, **values: str) -> tuple[dict[str, str], list[str]]:
    """README line ``which`` (0: the image cells, 1: the CPU cells): its variables and its words."""
    words = shlex.split(readme_lines()[which].replace("<path>.sqsh", values.get("sqsh", "")))
    env = dict(w.split("=", 1) for w in words[:words.index("sbatch")])
    return env, words[words.index("sbatch"):]


class Job:
    """One night submitted with a line of the README's Slurm section, from the repository root,
    with ``--wait`` (as a user waits for it) and ``--parsable`` (its job id) added: ``sbatch``
    options go before the script, ``night``'s arguments after the line's own (to tools/nightly.py)."""

    def __init__(self, slurm, d: dict, root: Path, config: Path | None, *night: str, line: int = 1,
                 sbatch: tuple[str, ...] = (), env: dict | None = None):
        self.out_pattern = d["tmp"] / "job-%j.out"
        variables, words = readme_argv(line, sqsh=(env or {}).get("GTP_TE219_SQUASHFS", ""))
        full = python_env(d["tmp"] / "bin", slurm.env)
        full.update({"GTP_NIGHTLY_ROOT": str(root), **(env or {}), **variables})
        where = ["--config", str(config), "--cache", str(d["cache"]), "--source", f"megatron-lm={d['up']}"] \
            if config else []
        argv = [words[0], "--parsable", "--wait", f"--output={self.out_pattern}", *sbatch, *words[1:], *where, *night]
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        first = self.proc.stdout.readline().strip()
        assert first, f"sbatch said no job id: {self.proc.stderr.read()}"
        self.id = first.split(";")[0]
        self.slurm = slurm
        self.sbatch_stderr = ""   # what sbatch --wait printed on stderr, once the job ended (wait)
        SUBMITTED.append(self)

    @property
    def out(self) -> Path:
        return Path(str(self.out_pattern).replace("%j", self.id))

    def output(self) -> str:
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    def wait(self, timeout: float = 420) -> int:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.slurm.run("scancel", self.id, check=False)
            raise AssertionError(f"job {self.id} still runs after {timeout:g} s:\n{self.output()}")
        self.sbatch_stderr = self.proc.stderr.read()
        return self.proc.returncode

    def said(self) -> str:
        """What sbatch --wait printed and what the controller recorded of the job: for a failure's message."""
        record = self.slurm.run("scontrol", "-o", "show", "job", self.id, check=False)
        return (f"sbatch stderr: {self.sbatch_stderr!r}\ncontroller: {record.stdout.strip()} "
                f"{record.stderr.strip()}\njob output:\n{self.output()}")

    def night(self, root: Path) -> Path:
        """The night's folder: GTP_NIGHTLY_ROOT/<time>-slurm<job id>."""
        found = sorted(root.glob(f"*-slurm{self.id}"))
        assert len(found) == 1, (found, self.output())
        return found[0]


def until(what: str, check, timeout: float = 180, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"not within {timeout:g} s: {what}")


def history(root: Path) -> list[dict]:
    """Every line of the history, each a whole JSON object (a corrupt line fails here)."""
    return [json.loads(line) for line in (root / "history.jsonl").read_text().splitlines()]


def runs(night: Path) -> dict[str, dict]:
    return {r["test"]: r for r in read_json(night / "nightly.json")["runs"]}


def _said_cancelled(tail: list[str], step: str, node: str) -> bool:
    """The log of a step stopped past its timeout says it was cancelled: srun's "Job step aborted", or
    slurmstepd's own line, which comes most times, not always (it travels the step's output, which srun may
    have closed by then: a busy machine's CI lost it, in both nights of this file)."""
    said = "\n".join(tail)
    return f"*** STEP {step} ON {node} CANCELLED" in said or "srun: Job step aborted" in said


@pytest.fixture
def series(demo):
    add_proofs(demo["series"], {"good": GOOD}, {"clean": "good"}, SERIES / "proofs" / "pytest.ini")
    return demo


def test_a_night_of_job_steps_whose_exit_status_is_the_jobs(slurm, series, tmp_path):
    hang = ["bash", "-c", "trap '' TERM; echo 'waiting on a collective that never completes'; sleep 300"]
    # Lists the job's steps once the hung one is gone (at most 10 s): a step left running shows.
    left = ["bash", "-c", 'for i in $(seq 20); do squeue -h -s -j "$SLURM_JOB_ID" -o "%i %j" | grep -q -- --hang || '
                          'break; sleep 0.5; done; squeue -h -s -j "$SLURM_JOB_ID" -o "%i %j"; echo listed']
    config = matrix(series, OK + command("exits-1", ["{python}", "-c", "print('about to fail'); raise SystemExit(1)"],
                                         "never printed")
                    + command("hang", hang, "never printed", timeout=5) + command("steps-left", left, "listed"))
    root = tmp_path / "root"
    t0 = time.monotonic()
    job = Job(slurm, series, root, config)
    rc = job.wait()
    took = time.monotonic() - t0
    out = job.output()
    assert rc == 1, out  # sbatch --wait: the job's exit status, the night's (cells failed)
    assert slurm.job(job.id)["ExitCode"] == "1:0", slurm.job(job.id)
    assert "# Nightly " in out and ": FAILED" in out  # the summary, printed by the batch script
    night = job.night(root)
    r = runs(night)
    assert r["proofs[clean]"]["status"] == "passed", r["proofs[clean]"]
    steps = {t: r[t].get("slurm_step") for t in ("proofs[clean]", "ok", "exits-1", "hang", "steps-left")}
    steps["pristine"] = r["proofs[clean]"]["pristine"]["slurm_step"]  # the proof's run on its pristine base
    assert all(s and s.startswith(f"{job.id}.") for s in steps.values()), steps
    assert len(set(steps.values())) == 6, steps
    assert read_json(night / "cells" / r["ok"]["cell"] / "run.json")["slurm_step"] == steps["ok"]
    assert r["ok"]["status"] == "passed", r["ok"]
    assert r["ok"]["command"].startswith(f"cd {ROOT} && PYTHONPATH=") and " srun " in r["ok"]["command"]
    bad = r["exits-1"]
    assert bad["status"] == "failed" and bad["returncode"] == 1 and "about to fail" in bad["tail"], bad
    hung = r["hang"]
    assert hung["status"] == "failed" and hung["timed_out"] is True and "timed out after 5s" in hung["reason"]
    assert "waiting on a collective that never completes" in hung["tail"], hung["tail"]
    listed = (night / "cells" / r["steps-left"]["cell"] / "artifacts" / "console.log").read_text().splitlines()
    assert f"{steps['steps-left']} demo--host--steps-left" in listed, listed  # squeue -s answered
    assert r["steps-left"]["status"] == "passed" and not [s for s in listed if s.startswith(steps["hang"] + " ")], listed
    assert _said_cancelled(hung["tail"], steps["hang"], slurm.node), hung["tail"]
    assert hung["tail"][-1] == "[carry] killed after 5s", hung["tail"]
    assert {h["cell"] for h in history(root)} == {x["cell"] for x in r.values()}
    assert took < 300, took


def test_scancel_stops_the_night_which_says_what_it_did_and_the_next_night_runs(slurm, series, tmp_path):
    wait = ["bash", "-c", "echo 'long cell started'; sleep ${CARRY_TEST_SLEEP_S:-0}; echo 'long cell done'"]
    config = matrix(series, OK + command("long", wait, "long cell done", timeout=600)
                    + command("after", ["{python}", "-c", "print('after ran')"], "after ran"))
    root = tmp_path / "root"
    job = Job(slurm, series, root, config, env={"CARRY_TEST_SLEEP_S": "300"})
    console = until("the long cell runs", lambda: next(root.glob("*/cells/*--long/artifacts/console.log"), None))
    until("the long cell printed its first line", lambda: "long cell started" in console.read_text())
    slurm.run("scancel", job.id)
    job.wait(120)
    # COMPLETING is Slurm's passage from a cancelled job's end to its final state (its processes are being
    # reaped): seen once under the whole suite's load. The final state must be CANCELLED.
    state = until("the job leaves COMPLETING", lambda: (st := slurm.job(job.id)["JobState"]) != "COMPLETING" and st,
                  timeout=60)
    assert state == "CANCELLED", state
    night = job.night(root)
    doc = read_json(night / "nightly.json")
    assert doc["stopped"] and doc["stopped"].startswith("SIGTERM at "), doc["stopped"]
    r = runs(night)
    assert r["proofs[clean]"]["status"] == "passed" and r["ok"]["status"] == "passed"
    assert r["long"]["status"] == "error" and r["long"]["stopped"] is True
    assert r["long"]["reason"].startswith("stopped as it ran (SIGTERM at "), r["long"]["reason"]
    assert r["after"]["status"] == "error" and r["after"]["reason"].startswith("not run: the night was stopped")
    assert read_json(night / "cells" / r["after"]["cell"] / "run.json")["stopped"] is True
    summary = (night / "summary.md").read_text()
    assert "- stopped: by SIGTERM at " in summary and "2 cell(s) judged, 2 not" in summary, summary
    assert "| demo | host | after | ERROR | - | not run: the night was stopped" in summary
    assert "- stopped: by SIGTERM at " in job.output(), job.output()  # the batch script outlived the night
    done = history(root)  # what was judged, and only that
    assert sorted(h["test"] for h in done) == ["ok", "proofs[clean]"]

    again = Job(slurm, series, root, config)
    assert again.wait() == 0, again.output()  # every cell green, the red/green proof a job step among them
    r = runs(again.night(root))
    assert {t: x["status"] for t, x in r.items()} == dict.fromkeys(("proofs[clean]", "ok", "long", "after"), "passed")
    assert r["proofs[clean]"]["slurm_step"].startswith(f"{again.id}."), r["proofs[clean]"]
    assert [h["run_id"] for h in history(root)].count(again.night(root).name) == 4
    assert "History warnings" not in (again.night(root) / "summary.md").read_text()


# A proof whose body never ends on the patched tree: past its timeout it did not finish, in that
# body (red). Elsewhere (its pristine base, the canary's main) it fails at once.
HANG = '''
import time

import megatron.core.delta as delta

PRISTINE_FAILS = r"^AssertionError"


def test_waits_on_a_rank_that_never_answers():
    if delta.value_15 == "ours":
        time.sleep(300)
    assert delta.value_15 == "ours"
'''
# The demo upstream's own tests, pinned (carry.series.testspin), launched with plain pytest.
UPSTREAM_TESTS = {"pyproject.toml": "[tool.pytest.ini_options]\n", "tests/__init__.py": "",
                  "tests/unit_tests/__init__.py": "",
                  "tests/unit_tests/test_alpha.py": "import megatron.core.alpha as alpha\n\n\n"
                                                     "def test_value_1():\n    assert alpha.value_1 == 1\n",
                  "megatron/core/alpha.py": "value_1 = 'the checkout's own copy, never tested'\n"}


def pin_tests(d: dict) -> None:
    """The demo series' megatron-lm pins its own tests: a repository of one test file that imports
    the module the 'clean' patch touches (so it is selected), green on both sides."""
    repo = d["tmp"] / "upstream-tests"
    Git(repo).init()
    for rel, text in UPSTREAM_TESTS.items():
        write(repo, rel, text)
    commit = Git(repo).commit_all("upstream tests")
    paths = ", ".join(f'"{p}" = "{Git(repo)("rev-parse", f"{commit}:{p}").stdout.strip()}"'
                      for p in ("pyproject.toml", "tests", "megatron"))
    pin = (f'[upstreams.megatron-lm.tests]\nurl = "{repo.as_uri()}"\ncommit = "{commit}"\npaths = {{ {paths} }}\n'
           'replace = "megatron/core"\nroot = "tests/unit_tests"\nlaunch = "pytest"\nnproc = 1\n')
    toml = d["series"] / "series.toml"
    toml.write_text(toml.read_text().replace("\n[[patches]]", "\n" + pin + "\n[[patches]]", 1))


def proof_test(name: str, patches: list[str], timeout: int, bisect: bool = True) -> str:
    return f"""
[[tests]]
name = "{name}"
kind = "proof"
images = ["host"]
patches = {json.dumps(patches)}
timeout_s = {timeout}
bisect = {str(bisect).lower()}
"""


def judged(night: Path) -> dict[str, tuple]:
    """Each cell's verdict, and what its bisection found, as the night's own files say."""
    out = {}
    for t, r in runs(night).items():
        b = r.get("bisect") or {}
        out[t] = (r["status"], r["reason"], r.get("bug"), b.get("first_patch"),
                  [(p["k"], p["status"], p["reason"]) for p in b.get("probes") or []],
                  (r.get("upstream_tests") or {}).get("counts"))
    return out


def test_proofs_and_upstream_tests_are_job_steps_judged_as_on_this_machine(slurm, series, tmp_path):
    """Each proof run (patched, pristine, a bisection's probes) and the upstream-tests cell are job
    steps of the night, each named in its record; the verdicts are those of the same matrix on this
    machine (the local launcher), a proof past its timeout included (its step cancelled). A night
    whose proofs are red/green is green, one with a proof that is not exits 1: the job's status."""
    add_proofs(series["series"], {"vacuous": VACUOUS, "regress": REGRESS, "hang": HANG, "crash": CRASH},
               {"threeway": "vacuous", "upstreamed": "regress", "conflict": "hang"}, SERIES / "proofs" / "pytest.ini")
    toml = series["series"] / "series.toml"  # 'upstreamed' has a second proof: one whose interpreter dies
    toml.write_text(toml.read_text().replace('proof = "proofs/megatron_lm/test_regress.py"', 'proof = '
                                             '["proofs/megatron_lm/test_regress.py", "proofs/megatron_lm/test_crash.py"]'))
    pin_tests(series)
    upstream = '\n[[tests]]\nname = "upstream-tests"\nkind = "upstream-tests"\nimages = ["host"]\ntimeout_s = 300\n'
    green = matrix(series, proof_test("red-green", ["clean"], 120) + upstream, proofs=False)
    root = tmp_path / "root"
    job = Job(slurm, series, root, green)
    assert job.wait() == 0, job.said()
    assert slurm.job(job.id)["ExitCode"] == "0:0", slurm.job(job.id)
    r = runs(job.night(root))
    assert {t: x["status"] for t, x in r.items()} == {"red-green[clean]": "passed",
                                                       "upstream-tests[megatron-lm]": "passed"}, r
    assert all(x.get("slurm_step", "").startswith(f"{job.id}.") for x in r.values()), r

    config = tmp_path / "nightly.toml"
    config.write_text(green.read_text() + proof_test("proofs", ["threeway", "upstreamed"], 120)
                      # 20 s: the step's start (srun, the interpreter, pytest) must fit before the proof's body hangs
                      # in it, also on a busy 2-core CI host (6 s did not, once: no body ran, an environment error)
                      + proof_test("hung", ["conflict"], 20, bisect=False))
    job = Job(slurm, series, root, config)
    local = tmp_path / "local"  # the same matrix on this machine, as the job runs
    tool("nightly", "--config", config, "--out", local, "--workdir", tmp_path / "lwork", "--cache", series["cache"],
         "--source", f"megatron-lm={series['up']}", "--history", tmp_path / "local.jsonl", check=1, timeout=600)
    assert job.wait() == 1, job.said()
    assert slurm.job(job.id)["ExitCode"] == "1:0", slurm.job(job.id)
    night = job.night(root)
    r = runs(night)
    assert {t: x["status"] for t, x in r.items()} == {
        "red-green[clean]": "passed", "upstream-tests[megatron-lm]": "passed", "proofs[threeway]": "vacuous",
        "proofs[upstreamed]": "failed", "proofs[upstreamed/test_crash]": "failed", "hung[conflict]": "failed"}, r
    steps = [x["slurm_step"] for x in r.values()] + [r[t]["pristine"]["slurm_step"]
                                                     for t in ("red-green[clean]", "proofs[threeway]")]
    assert all(s.startswith(f"{job.id}.") for s in steps) and len(set(steps)) == 8, steps
    crash = r["proofs[upstreamed/test_crash]"]  # judged from what the proof printed, not what srun added
    assert crash["reason"].startswith("the interpreter exited 7 without a report"), crash
    assert "srun: error:" in "\n".join(crash["tail"]) and "srun:" not in crash["reason"], crash
    cell = night / "cells" / r["proofs[upstreamed]"]["cell"]
    assert read_json(cell / "run.json")["slurm_step"] == r["proofs[upstreamed]"]["slurm_step"]
    probes = sorted(cell.glob("bisect/k*/console.log"))
    assert len(probes) == len(r["proofs[upstreamed]"]["bisect"]["probes"]) == 3, probes
    assert all(step_id(p).startswith(f"{job.id}.") for p in probes), [step_id(p) for p in probes]
    assert r["proofs[upstreamed]"]["bisect"]["first_patch"] == "clean", r["proofs[upstreamed]"]["bisect"]
    hung = r["hung[conflict]"]
    assert hung["timed_out"] is True and hung["reason"].startswith("did not finish: timed out after 20s (in "), hung
    assert _said_cancelled(hung["tail"], hung["slurm_step"], slurm.node), hung["tail"]
    assert hung["tail"][-1] == "[carry] killed after 20s", hung["tail"]

    here = judged(local)
    assert judged(night) == here, (judged(night), here)
    assert not any("slurm_step" in x for x in runs(local).values())
    assert sum(len(v[4]) for v in here.values()) == 4  # the bisections' probes, compared one by one


def test_two_nights_at_once_take_the_history_and_the_mains_in_turn(slurm, series, tmp_path):
    """Two real jobs at once on one GTP_NIGHTLY_ROOT (a night submitted again). A third party,
    this test, holds what a third night would, when the two need it: the main's cache as they
    fetch, the history as they read it, then as they append to it (their cell waits at a gate
    the test opens with the history held). Neither touches a thing held; let go, both nights
    end green, with whole history lines and one sound cache of main."""
    from carry.lock import DirLock
    from carry.git import Git

    if slurm.cpus < 2:
        pytest.skip("two jobs at once need two CPUs on the one node")
    gate = tmp_path / "gate"
    config = matrix(series, command("gated", ["bash", "-c", "until [ -e ${CARRY_TEST_GATE} ]; do sleep 0.2; done; "
                                              "echo through the gate"], "through the gate"), proofs=False)
    root = tmp_path / "root"
    hist, main = root / "history.jsonl", root / "mains" / "megatron-lm.git"
    root.mkdir()
    hist.write_text(json.dumps({"run_id": "earlier", "cell": "x", "status": "passed"}) + "\n")
    before = hist.read_bytes()
    env = {"GTP_CARRY_QUIET": "0", "CARRY_TEST_GATE": str(gate)}

    def waiting(what: Path, times: int = 1, past=lambda: False):
        """Until both nights wait for ``what``, or one went on (``past``) or ended: then it fails."""
        until(f"both nights wait for {what} ({times})",
              lambda: all(j.output().count(f"waiting for the lock on {what}") >= times for j in jobs) or
              past() or any(j.proc.poll() is not None for j in jobs))
        assert all(j.output().count(f"waiting for the lock on {what}") >= times for j in jobs), \
            [j.output() for j in jobs]

    def gated() -> bool:
        return len(list(root.glob("*/cells/*--gated/artifacts/console.log"))) == 2

    held = open(hist, "ab")
    fcntl.flock(held.fileno(), fcntl.LOCK_EX)
    with DirLock(main.parent / "megatron-lm.git.lock", what=main):
        # --oversubscribe: the two jobs share the one node, a CPU each.
        jobs = [Job(slurm, series, root, config, sbatch=("--oversubscribe",), env=env) for _ in range(2)]
        waiting(main, past=main.exists)
        assert not main.exists(), [j.output() for j in jobs]
        states = slurm.run("squeue", "-h", "-o", "%i %T").stdout.splitlines()
        assert sorted(states) == sorted(f"{j.id} RUNNING" for j in jobs), states
    waiting(hist, past=gated)  # to read it
    fcntl.flock(held.fileno(), fcntl.LOCK_UN)
    until("both gated cells run", gated)
    fcntl.flock(held.fileno(), fcntl.LOCK_EX)
    gate.touch()
    waiting(hist, 2, past=lambda: hist.read_bytes() != before)  # to append to it
    assert hist.read_bytes() == before, [j.output() for j in jobs]
    fcntl.flock(held.fileno(), fcntl.LOCK_UN)
    held.close()
    assert [j.wait() for j in jobs] == [0, 0], [j.output() for j in jobs]
    names = sorted(j.night(root).name for j in jobs)
    assert sorted(h["run_id"] for h in history(root)) == sorted(["earlier", *names])
    assert Git(main)("fsck", "--no-progress").ok and Git(main).rev_parse("HEAD") == series["v1"]
    for j in jobs:
        (c,) = read_json(j.night(root) / "nightly.json")["canary"]
        assert c["error"] is None and c["head"] == series["v1"], c


def test_without_pyxis_the_image_night_stops_before_it_starts(slurm, demo, tmp_path):
    """The README's line for the image cells, on the shipped matrix, on a Slurm without pyxis."""
    root = tmp_path / "root"
    sqsh = tmp_path / "gtp-te219.sqsh"
    sqsh.write_bytes(b"hsqs")
    job = Job(slurm, demo, root, None, line=0, sbatch=("--gpus-per-node=0",), env={"GTP_TE219_SQUASHFS": str(sqsh)})
    assert job.wait(120) == 2, job.said()
    errors = [line for line in job.output().splitlines() if line.startswith("error:")]
    assert errors == ["error: srun has no --container-image here: pyxis is not installed; install enroot and "
                      "NVIDIA's pyxis (its SPANK plugin) on the nodes, or run the cells that need no container "
                      "(--images host)"], job.output()
    assert not list(root.glob("*/cells")), "a cell ran"
