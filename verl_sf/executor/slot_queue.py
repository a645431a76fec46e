"""Idle slots and the requests waiting for one: first come, first served, warm flavor preferred.

A heavy interpreter (numpy, sympy, ...) starts on its flavor's first job in a slot, which
costs a fraction of a second.  When several slots are idle, a request therefore takes one
that already runs its flavor, so a trickle of numpy calls keeps reusing one warm slot
instead of starting numpy in every slot in turn.  Waiters are served strictly in arrival
order with whichever slot frees up: the preference never makes anyone wait longer.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Callable

from verl_sf.executor.slot import Slot


class SlotQueue:
    def __init__(self) -> None:
        self._idle: list[Slot] = []  # longest idle first
        self._waiters: collections.deque[asyncio.Future[Slot]] = collections.deque()

    def has_idle(self) -> bool:
        return bool(self._idle) and not self._waiters

    async def get(self, prefer: Callable[[Slot], bool]) -> Slot:
        if self.has_idle():
            chosen = next((i for i, slot in enumerate(self._idle) if prefer(slot)), 0)
            return self._idle.pop(chosen)
        waiter: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.put(waiter.result())  # handed a slot just as we were cancelled: pass it on
            elif waiter in self._waiters:  # put() may have skipped it already
                self._waiters.remove(waiter)
            raise

    def put(self, slot: Slot) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(slot)
                return
        self._idle.append(slot)
