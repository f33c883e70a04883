"""A real one-node Slurm cluster on this machine for the tests: slurmctld and slurmd from the
distribution's packages, on localhost, CPUs only, with a slurm.conf of its own (free ports, its
state, spool, logs and pid files in a scratch folder), stopped afterwards.

Munge (the authentication of every daemon and command) must already answer: `bash .ci/slurm.sh`
installs Slurm and starts munged. The commands reach this cluster through ``SLURM_CONF`` in
``Cluster.env``; sbatch hands the variable on to the job, so its srun finds the cluster too. No
plugin stack (an empty plugstack.conf): a pyxis installed on the machine does not join in.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

PROGRAMS = ("slurmctld", "slurmd", "sbatch", "srun", "scancel", "scontrol", "squeue", "munge", "unmunge")
INSTALL = "`bash .ci/slurm.sh` (as root) installs Slurm and starts munged"


def problem() -> str | None:
    """Why no cluster can start here, or None."""
    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    if missing:
        return f"{', '.join(missing)} not installed; {INSTALL}"
    if os.geteuid() != 0:
        return "slurmd runs jobs as their user and needs root here"
    try:
        cred = subprocess.run(["munge", "-n"], capture_output=True, timeout=20)
        check = subprocess.run(["unmunge"], input=cred.stdout, capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"munge does not answer ({exc}); {INSTALL}"
    if cred.returncode or check.returncode:
        why = (cred.stderr or check.stderr).decode(errors="replace").strip()[:200]
        return f"munged does not answer ({why}); {INSTALL}"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, root: Path, kill_wait: int = 30):
        self.root = root
        self.node = socket.gethostname().split(".")[0]
        self.cpus = os.cpu_count() or 1
        self.conf = root / "slurm.conf"              # the clients' (sbatch, squeue, scontrol, the jobs' srun)
        self.daemon_conf = root / "slurm-daemons.conf"   # slurmctld's and slurmd's: the same but MinJobAge
        self.kill_wait = kill_wait
        self.procs: list[subprocess.Popen] = []

    @property
    def env(self) -> dict[str, str]:
        """This process's environment as it is now (a test's own HOME, PATH), with the cluster's conf."""
        return dict(os.environ, SLURM_CONF=str(self.conf))

    def write_conf(self) -> None:
        for sub in ("state", "spool"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "plugstack.conf").write_text("")
        r = self.root
        # proctrack/linuxproc and task/none: no cgroups needed (a container often has none to give).
        # MinJobAge: sbatch --wait polls the controller, and lets its polls grow apart up to half of the
        # MinJobAge it reads (to 32 s at most), so that a finished job's record outlives its next poll:
        # with 600 everywhere, a job of 13 s was seen done ~30 s after it ended. The controller keeps a
        # finished job's record MinJobAge seconds, but takes no less than 2: with 0 written (slurmctld
        # logs "MinJobAge must be at least 2"), a record could be purged between two polls, and sbatch
        # said "Job 5 no longer found and exit code not found" (seen once in the suite, 2026-12-05).
        # So the clients read MinJobAge=2 (polls every 2 s) and the daemons 600 (a record outlives
        # every test: scontrol show job answers after sbatch --wait).
        text = f"""\
ClusterName=carry{os.getpid()}
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/slurmctld.log
SlurmdLogFile={r}/slurmd.log
PlugStackConfig={r}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
KillWait={self.kill_wait}
InactiveLimit=0
MinJobAge={{min_job_age}}
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN
PartitionName=carry Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
"""
        self.conf.write_text(text.replace("{min_job_age}", "2"))
        self.daemon_conf.write_text(text.replace("{min_job_age}", "600"))

    def start(self, wait_s: float = 60) -> str | None:
        """Start both daemons and wait for the node to take jobs; None, or why it did not."""
        self.write_conf()
        for argv in (["slurmctld", "-D", "-i", "-f", self.daemon_conf],
                     ["slurmd", "-D", "-f", self.daemon_conf, "-N", self.node]):
            log = open(self.root / f"{argv[0]}.out", "wb")
            self.procs.append(subprocess.Popen([str(a) for a in argv], env=self.env, stdout=log,
                                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                               start_new_session=True))
            log.close()
        deadline = time.monotonic() + wait_s
        state = ""
        while time.monotonic() < deadline:
            dead = [p for p in self.procs if p.poll() is not None]
            if dead:
                return f"{dead[0].args[0]} exited {dead[0].returncode}: {self.log_tail(dead[0].args[0])}"
            res = self.run("sinfo", "-h", "-N", "-o", "%T", check=False)
            state = res.stdout.strip()
            if state in ("idle", "mixed", "allocated"):
                return None
            time.sleep(0.5)
        return f"the node is not up after {wait_s:g} s (state {state or '?'}): {self.log_tail('slurmd')}"

    def log_tail(self, daemon: str, n: int = 5) -> str:
        lines = []
        for name in (f"{daemon}.log", f"{daemon}.out"):
            path = self.root / name
            if path.exists():
                lines += path.read_text(errors="replace").splitlines()
        return " | ".join(lines[-n:]) or "no log"

    def run(self, *argv, check: bool = True, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
        res = subprocess.run([str(a) for a in argv], env={**self.env, **kw.pop("env", {})}, capture_output=True,
                             text=True, timeout=timeout, **kw)
        if check and res.returncode:
            raise AssertionError(f"{' '.join(map(str, argv))} exited {res.returncode}:\n{res.stdout}\n{res.stderr}")
        return res

    def jobs(self) -> list[str]:
        """The ids of the jobs still pending or running."""
        return self.run("squeue", "-h", "-o", "%i", check=False).stdout.split()

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, ExitCode, ...)."""
        text = self.run("scontrol", "-o", "show", "job", job_id).stdout
        return dict(f.split("=", 1) for f in text.split() if "=" in f)

    def stop(self) -> None:
        """Cancel what still runs, then stop both daemons (and the step daemons they left)."""
        if self.jobs():
            self.run("scancel", "--full", "--signal=KILL", *self.jobs(), check=False)
            deadline = time.monotonic() + 30
            while self.jobs() and time.monotonic() < deadline:
                time.sleep(0.5)
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
