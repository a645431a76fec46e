"""The zygote's walk that ends a job without a PID namespace (procfs.kill_all), against real processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.waiting import wait_until
from verl_sf.executor.zygote import procfs

# PID 1 of a job: a subreaper, as a ready child makes itself, with a child that runs until killed.
JOB = """
import ctypes, os, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
child = os.fork()
if child == 0:
    while True:
        time.sleep(0.01)
print(child, flush=True)
os.waitpid(child, 0)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rpartition(b")")[2].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def test_a_job_whose_pid_1_would_exit_before_its_children_are_read_is_ended_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The zygote may be descheduled between killing a process and reading its children.  Had the
    walk killed PID 1 first, PID 1 would exit meanwhile and its child go up, out of the walk's sight."""
    job = subprocess.Popen([sys.executable, "-c", JOB], stdout=subprocess.PIPE)
    assert job.stdout is not None
    child = int(job.stdout.readline())
    read = procfs.children

    def late(pid: int) -> list[int]:
        if pid == job.pid:
            time.sleep(0.3)  # long enough for a killed PID 1 to be gone
        return read(pid)

    monkeypatch.setattr(procfs, "children", late)
    try:
        procfs.kill_all(job.pid)
        assert job.wait(10) == -signal.SIGKILL
        wait_until(lambda: not _alive(child), 5, "the job's child killed with it")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
        job.kill()
