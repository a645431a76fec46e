"""Tasks that run in a context of their own, not their caller's.

Ray cancels with a call (`ray.cancel`, recursive by default) every Ray call made from that
call's context, by the asyncio tasks and the `asyncio.to_thread` threads it started included.
Work kept running for many callers (the limiter client's long poll and batches, the fleet
directory read that concurrent calls share) must not be one of those, or cancelling one caller
ends it for every other.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def detached_task(work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """`work` as a task of the running loop, in an empty context."""
    return contextvars.Context().run(asyncio.get_running_loop().create_task, work)
