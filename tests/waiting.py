"""`wait_until`: the one way tests wait for something another process or thread does.

A test polls for the state it needs (a process gone, a run started, a file written) instead of
sleeping a fixed time that is too long on a quiet machine and too short on a loaded one.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, Union

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout: float, what: str, every: float = 0.05) -> T:
    """Call `condition` until it returns something truthy, and return that; fail naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(every)


async def wait_until_async(condition: Callable[[], Union[T, Awaitable[T]]], timeout: float, what: str,
                           every: float = 0.05) -> T:
    """`wait_until` on an event loop: `condition` may be a plain or an async function."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        await asyncio.sleep(every)
