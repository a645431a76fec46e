"""What the zygote counts of a job's processes as it samples them (procfs.cpu_of), against real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from verl_sf.executor.zygote import procfs

SPIN = "while True:\n    pass\n"


@pytest.fixture
def spinners() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        process.kill()
        process.wait()


def spin(started: list[subprocess.Popen], count: int) -> list[int]:
    started.extend(subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(count))
    time.sleep(1)  # long enough for them to wait on one another
    return [process.pid for process in started[-count:]]


def test_more_spinners_than_cpus_wait_for_one(spinners: list[subprocess.Popen]) -> None:
    cpu, wait = procfs.cpu_of(spin(spinners, len(os.sched_getaffinity(0)) + 1))
    assert cpu > 0.5 and wait > 0.05, (cpu, wait)
