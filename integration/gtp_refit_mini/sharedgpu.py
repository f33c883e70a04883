"""The shared-GPU mode of the mini test: every NCCL rank on cuda:0, each process its own NCCL_HOSTID.

NCCL refuses two ranks on one device ("Duplicate GPU detected") unless it takes them for two hosts;
a NCCL_HOSTID of its own per process, set before NCCL reads it, does that, and NCCL then joins the
ranks over its socket transport. Imports nothing heavy: the parent and every rank read it.
"""

from __future__ import annotations

import os
import socket

ENV = "CARRY_SHARED_GPU"   # tools/nightly.py --shared-gpu sets it for a night's cells
NOTE = ("shared-gpu: the NCCL ranks share one GPU over NCCL's socket transport; times and bandwidths "
        "measured so are not GTP's price, per-rank memory is (each process has its own allocator)")


def requested() -> bool:
    return os.environ.get(ENV, "") == "1"


def hostid() -> str:
    """This process's NCCL_HOSTID: the host and the pid, so that no two rank processes (and no value
    inherited from a parent) share one."""
    return f"{socket.gethostname()}-carry-shared-gpu-{os.getpid()}"


def enter() -> None:
    """Make this rank's process a host of its own for NCCL (before its process group exists)."""
    os.environ["NCCL_HOSTID"] = hostid()
