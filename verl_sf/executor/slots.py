"""CPU slots: how many runs may be in their first slice of CPU at once, handed out first come,
first served.

A run holds a slot until it ends or for `slice_s`, whichever comes first; past its slice it goes
on at the lowest CPU priority (the zygote renices it) and its slot goes to the next run.  Short
runs therefore never queue behind long ones, and a run that sleeps or waits on stdin holds no slot
for long: the multi-level feedback queue that OS schedulers use for jobs of unknown length.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Optional


class SlotLease:
    """One held slot; `release()` may be called any number of times, the slot returns once."""

    def __init__(self, slots: CpuSlots):
        self._slots: Optional[CpuSlots] = slots
        self._timer = asyncio.get_running_loop().call_later(slots.slice_s, self.release)

    def release(self) -> None:
        slots, self._slots = self._slots, None
        if slots is not None:
            self._timer.cancel()
            slots._put()


class CpuSlots:
    def __init__(self, count: int, slice_s: float):
        self.count = count
        self.slice_s = slice_s
        self.free = count
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self) -> SlotLease:
        if self.free > 0 and not self._waiters:
            self.free -= 1
            return SlotLease(self)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._put()  # handed a slot just as we were cancelled: pass it on
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise
        return SlotLease(self)

    def _put(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.free += 1
