"""Memory of a process tree (a server and its sandboxes), sampled while a level runs.

Forked interpreters share most of their pages, so summing RSS would count a warm pool many
times over; the proportional set size (Pss, /proc/PID/smaps_rollup) splits shared pages
between the processes that map them, and its sum is the memory the tree really holds.
RSS is the fallback for processes whose smaps we may not read.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Optional


def _children(pid: int) -> list[int]:
    """Direct children, from each thread's /proc/PID/task/TID/children: a walk of the tree
    alone, instead of reading every process's stat on a box shared with other work."""
    children: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return children  # gone
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                children.extend(int(child) for child in f.read().split())
        except OSError:
            continue
    return children


def tree_pids(root: int) -> list[int]:
    pids, stack = [], [root]
    while stack:
        pid = stack.pop()
        pids.append(pid)
        stack.extend(_children(pid))
    return pids


def process_kb(pid: int) -> int:
    for path, key in ((f"/proc/{pid}/smaps_rollup", b"Pss:"), (f"/proc/{pid}/status", b"VmRSS:")):
        try:
            with open(path, "rb") as f:
                for line in f:
                    if line.startswith(key):
                        return int(line.split()[1])
        except OSError:
            continue
    return 0  # gone, or a kernel thread


def tree_memory_mb(root: int) -> float:
    """Pss (else RSS) summed over `root` and all its descendants, in MiB."""
    return sum(process_kb(pid) for pid in tree_pids(root)) / 1024


class PeakSampler:
    """Samples `tree_memory_mb(root)` every `interval` seconds inside an `async with` block."""

    def __init__(self, root: Optional[int], interval: float) -> None:
        self.root, self.interval = root, interval
        self.peak_mb: Optional[float] = None
        self._task: Optional[asyncio.Task] = None

    def _sample(self) -> None:
        assert self.root is not None
        value = tree_memory_mb(self.root)
        self.peak_mb = value if self.peak_mb is None else max(self.peak_mb, value)

    async def _loop(self) -> None:
        while True:
            # /proc reads of a few hundred processes take milliseconds; off the event loop
            # they do not delay the calls being timed.
            await asyncio.to_thread(self._sample)
            await asyncio.sleep(self.interval)

    async def __aenter__(self) -> PeakSampler:
        if self.root is not None and self.interval > 0:
            self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            await asyncio.to_thread(self._sample)  # the state at the end of the level
