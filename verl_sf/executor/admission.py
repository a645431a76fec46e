"""Admission: a cap on runs in flight (beyond it: `Overloaded`, a 503), room under the memory cap
over all runs and sessions, then a GPU slot where the run needs one and a CPU slot.

An admitted run waits only for a CPU slot, which runs hold for their first slice at most (see
slots.py), so the wait is short whatever the other runs do.  `run_timeout` counts from the run's
start, not counting time it waited for a CPU.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Optional

from verl_sf.errors import Overloaded
from verl_sf.executor import jobs
from verl_sf.executor.cgroups import CgroupManager
from verl_sf.executor.config import ExecutorConfig
from verl_sf.executor.gpu_slots import GpuLease, GpuSlots
from verl_sf.executor.pool import ZygotePool, gpu_flavor
from verl_sf.executor.slots import CpuSlots
from verl_sf.executor.status import ExecutorStats
from verl_sf.executor.zygote.messages import Outcome
from verl_sf.executor.zygote_process import encode_body

MakeRoom = Callable[[int], None]
"""Make room under the memory cap for a run of so many MB (by evicting idle sessions)."""


class Admission:
    def __init__(self, config: ExecutorConfig, stats: ExecutorStats, make_room: MakeRoom):
        self.config = config
        self.stats = stats
        self.slots = CpuSlots(config.slots, config.cpu_slice_s)
        self.gpu_slots: Optional[GpuSlots] = None  # with --gpus: one slot per GPU (runs_per_gpu)
        self.cgroups: Optional[CgroupManager] = None  # set at start, where runs are confined
        self._make_room = make_room
        self.cpus = len(os.sched_getaffinity(0))

    def refuse(self, message: str) -> Overloaded:
        """The refusal to raise, counted."""
        self.stats.rejected += 1
        return Overloaded(message)

    def memory_used(self) -> Optional[int]:
        """Bytes all runs and sessions hold, where the server's cgroup counts them."""
        if self.cgroups is None or not self.cgroups.available:
            return None
        return self.cgroups.memory_usage()

    def admit(self, memory_mb: int) -> None:
        """One more run in flight, or `Overloaded`; room made for it under the memory cap first."""
        if self.stats.in_flight >= self.config.max_in_flight:
            raise self.refuse(f"{self.stats.in_flight} runs in flight (max_in_flight={self.config.max_in_flight})")
        self._make_room(memory_mb)
        self.stats.in_flight += 1

    def reserve_memory(self) -> None:
        """`Overloaded` where runs and sessions hold over 90% of the memory cap already."""
        used = self.memory_used()
        if used is not None and used > (self.config.runs_memory_mb << 20) * 0.9:
            raise self.refuse(f"runs and sessions hold {used >> 20} MB of the server's cap of "
                              f"{self.config.runs_memory_mb} MB (--runs-memory-mb)")

    async def run(self, pool: ZygotePool, flavor: str, job: jobs.JobRequest, arrived: float,
                  gpu: bool = False) -> tuple[Outcome, float]:
        """Admit, wait for a GPU slot (`gpu`: held until the reply, which comes once the run's
        processes, and so its CUDA context, are gone) and a CPU slot, run, and give the slots back;
        (reply, time spent queued).  NoGpuFree when no GPU slot came free within the run's timeout."""
        self.admit(job.body["memory"] >> 20)
        gpu_lease: Optional[GpuLease] = None
        try:
            if gpu:
                assert self.gpu_slots is not None
                gpu_lease = await self.gpu_slots.acquire(job.head["limits"]["timeout"])
                flavor = gpu_flavor(gpu_lease.index)
            lease = await self.slots.acquire()
            try:
                zygote = await pool.pick(flavor)
                queue_wait = time.monotonic() - arrived
                jobs.hand_over(job.head["limits"], queue_wait)
                if job.body["mode"] == "python":
                    # A CPU to spare: the exit's hand-over costs one, and takes the teardown off the reply's path.
                    jobs.hold_exit(job, self.stats.in_flight < self.cpus)
                reply = await zygote.run(job.head, await encode_body(job.body))
            finally:
                lease.release()
        except asyncio.CancelledError:  # its client went away, whether it was queued or running
            self.stats.cancelled += 1
            raise
        finally:
            self.stats.in_flight -= 1
            if gpu_lease is not None:
                gpu_lease.release()
        return reply, queue_wait

    def gpus(self) -> dict[str, object]:
        """The GPU slots as `/health` shows them."""
        slots = self.gpu_slots
        if slots is None:
            return {"gpus": []}
        return {"gpus": slots.indices, "runs_per_gpu": slots.per_gpu,
                "free_slots": {str(i): slots.free[i] for i in slots.indices}, "waiting": slots.waiting}
