"""GPU slots: which GPU a GPU run gets, `per_gpu` runs per GPU at a time (1 by default), first come,
first served.

Unlike a CPU slot, a GPU slot is held for the whole run: the run's CUDA context holds the GPU's
memory until its process is gone, so the slot comes back only when the run's reply does (after
the run ended or was killed at its time-out).  A run that finds no slot free within its time-out
gets `NoGpuFree`, never a run on a busy GPU.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Optional

from verl_sf.errors import VerlSfError


class NoGpuFree(VerlSfError, RuntimeError):
    """Every GPU slot stayed busy for the whole wait; the run did not start."""


class GpuLease:
    """One held slot on GPU `index`; `release()` may be called any number of times."""

    def __init__(self, slots: GpuSlots, index: int):
        self._slots: Optional[GpuSlots] = slots
        self.index = index

    def release(self) -> None:
        slots, self._slots = self._slots, None
        if slots is not None:
            slots._put(self.index)


class GpuSlots:
    def __init__(self, indices: list[int], per_gpu: int = 1):
        self.indices = list(indices)
        self.per_gpu = per_gpu
        self.free = collections.Counter({index: per_gpu for index in indices})
        self._waiters: collections.deque[asyncio.Future[int]] = collections.deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def _take(self) -> Optional[int]:
        """The GPU with the most free slots (runs spread over GPUs before they share one)."""
        index, count = max(self.free.items(), key=lambda item: item[1], default=(None, 0))
        if index is None or count <= 0:
            return None
        self.free[index] -= 1
        return index

    async def acquire(self, timeout: float) -> GpuLease:
        if not self._waiters:
            index = self._take()
            if index is not None:
                return GpuLease(self, index)
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            done, _ = await asyncio.wait({waiter}, timeout=timeout)
        except asyncio.CancelledError:
            self._abandon(waiter)
            raise
        if not done:
            self._abandon(waiter)
            raise NoGpuFree(f"no GPU slot came free within the run's timeout of {timeout:g} s "
                            f"({len(self.indices)} GPU(s), {self.per_gpu} run(s) per GPU at a time); "
                            f"the run did not start")
        return GpuLease(self, waiter.result())

    def _abandon(self, waiter: asyncio.Future[int]) -> None:
        if waiter.done() and not waiter.cancelled():
            self._put(waiter.result())  # handed a slot just as we gave up: pass it on
        else:
            waiter.cancel()
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def _put(self, index: int) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(index)
                return
        self.free[index] += 1
